"""The vllm-v1 policy's promises to the event fast path (the decode cohort, engine/cohort.py).

A v1 round is one running pass in admission order (each request min(pending, threshold,
budget left) tokens; a decode is one), then, if nobody was preempted, the waiting pass; with
async scheduling the requests that finished in the last round free their blocks after it. The
cohort builds the same round in another order: every member's decode first (their blocks
taken in the books), then ``fill`` (the prompts' chunks in running order, the waiting pass, the
async frees), priced and accounted as one round. The two orders give the same round when:

* every decoding request gets its token: walking the running order, the budget is not spent
  before the last of them (a prompt's chunk ahead of a decode may spend it);
* nobody is short of a block, or only the decodes run (no prompt in chunks): then the victims
  are those ``growth_victim`` names one after the other (the last running under FCFS, the
  highest (priority, arrival, id) under priority), and the round's decodes are the rest's;
* no block is keyed (prefix caching off): then which block each append takes does not matter,
  and neither does when a sampled token's block is keyed (async keys it a round late). Under
  prefix caching no prompt is in chunks and nobody is short of a block (no victim frees a
  block async has not keyed yet); the cohort makes blocks and keys in running order
  (``append_order``) and keys a block as it fills. With async scheduling vLLM keys it a step
  later, at the request's next append or, for a finished request, after the waiting pass;
  so the cohort's first round admits nobody and keys the last step's outputs when it is
  planned (``_open_window``: every running request sampled in it, and its blocks fit); a
  later round admits only where no waiting prompt's chain of keys reaches a block the round
  fills or a finished request's last block (``_lookups_hold``); and at the cohort's end the
  keys of its last round's decodes are taken back, to be made when those outputs arrive
  (``cohort_ends``);
* the async frees come after the round's appends and admissions, which the running count and
  free blocks they read still include, as in vLLM; a request awaiting its free needs no block
  and may be a victim (freed then, not among the round's frees), as in the running pass.

``plan_round`` checks these from the queues, the running order and count, each running
request's kind (a decode keeps its one pending token however far its counters lag) and the free
blocks; where one fails it is None and the engine steps that round through ``schedule()``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from pagedkv.engine.request import Request, RequestStatus
from pagedkv.engine.scheduler import RoundPlan, ScheduledChunk, SchedulerOutput
from pagedkv.errors import IntegrityError

if TYPE_CHECKING:
    from pagedkv.engine.config import SchedulerConfig
    from pagedkv.memory.manager import KVCacheManager

_RUNNING = RequestStatus.RUNNING


def _key(r: Request) -> tuple[int, float, int]:
    """The priority victim's key (``_pick_victim``: the highest is taken first)."""
    return (r.priority, r.arrival_time, r.request_id)


def _decoding(req: Request) -> bool:
    """Does a running request decode (its next token an output's)? A member's counters lag,
    but both move together, so its answer holds."""
    return req.num_pending_tokens == 1 and req.num_computed_tokens >= req.prompt_len


class V1PlanMixin:
    """``plan_round``, ``fill``, ``growth_victim``, ``preempt`` and ``decodes_next`` of
    ``VllmV1Scheduler``."""

    config: SchedulerConfig
    paged: KVCacheManager
    running: list[Request]
    waiting: deque[Request]
    has_beams: bool
    has_groups: bool
    has_token_ids: bool
    _budget: int
    _priority: bool
    _draining: list[Request]
    _sampled: dict[Request, None]
    _rounds_mirrored: bool
    _window: bool
    _serial: dict[Request, int]

    if TYPE_CHECKING:  # (VllmV1Scheduler's own, which the promises restate)

        def _schedule_waiting(self, out: SchedulerOutput, budget: int, threshold: int) -> None: ...

        def _pick_victim(self) -> Request: ...

        def _preempt(self, victim: Request, out: SchedulerOutput) -> None: ...

        def _release(self) -> None: ...

        def _key_sampled(self) -> None: ...

    def _threshold(self) -> int:
        """The long-prefill threshold of this round (``_schedule_once``'s rule)."""
        if len(self.running) + len(self.waiting) > 1:
            return self.config.long_prefill_token_threshold
        return 0

    def _plannable(self, keys: bool = False) -> bool:
        """The states in which no promise is made: a subclass's own rounds, beams or groups,
        prefix caching unless ``keys`` (the chunked rounds' keys, and when async makes them,
        decide hits and the free queue). Token ids without prefix caching are read by nothing
        (the manager drops them)."""
        return (
            self._rounds_mirrored
            and not (self.has_beams or self.has_groups)
            and (keys or not self.paged.config.enable_prefix_caching)
        )

    def plan_round(self) -> RoundPlan | None:
        """The next round: every decoding request decodes once, then (``chunked``) ``fill``.
        A plain decode plan (no ``fill``) when nothing waits, nothing awaits its free and no
        prompt is in chunks. None where the running pass would starve a decode of budget, or,
        with a prompt in chunks, where anyone might be short of a block (the free blocks must
        hold the chunks' and one per decode), or in the states ``_plannable`` refuses; under
        prefix caching, only where nothing waits or prefills (``_open_window``). O(running):
        the pass's walk."""
        if not self._plannable(keys=True):
            return None
        budget = self._budget
        threshold = self._threshold()
        max_len = self.config.max_model_len
        decodes = need = 0
        chunks = False
        kv = self.paged
        for req in self.running:
            if req.status is not _RUNNING:
                continue  # awaiting its free (async): computes nothing
            computed, prompt = req.num_computed_tokens, req.prompt_len
            n = prompt + req.num_output_tokens - computed  # (pending; ``_decoding`` inlined)
            if n == 1 and computed >= prompt:
                if budget <= 0:
                    return None  # the budget is spent before its decode
                budget -= 1
                decodes += 1
                continue
            # A prompt in chunks, even one the budget leaves out now: a victim already
            # scheduled (priority) gives its budget back, and the chunk would then run.
            chunks = True
            if 0 < threshold < n:
                n = threshold
            n = min(n, budget, max_len - computed - 1)
            if n <= 0:
                continue
            need += kv.blocks_for(computed + n) - kv.blocks_for(computed)
            budget -= n
        if chunks and kv.num_free_blocks < need + decodes:
            return None  # someone may be short: the order of appends would matter
        if kv.config.enable_prefix_caching and not self._keys_hold(chunks):
            return None
        if not (chunks or self.waiting or self._draining):
            return RoundPlan(SchedulerOutput(), True)
        return RoundPlan(SchedulerOutput(), True, chunked=True)

    def _keys_hold(self, chunks: bool) -> bool:
        """Under prefix caching, does the plan hold (the module docstring)? No prompt may be
        in chunks. Sync scheduling keys every block as it fills, as the cohort does. With
        async scheduling the cohort's first round (``_open_window``) runs only while nothing
        waits, and a later one admits only where its lookups find what vLLM's would
        (``_lookups_hold``)."""
        if chunks:
            return False
        if not self.config.async_scheduling:
            return True
        if self._window:
            return not self.waiting or self._lookups_hold()
        return not self.waiting and self._open_window()

    def _lookups_hold(self) -> bool:
        """Would the waiting pass's lookups find the blocks vLLM's do? The cohort keyed the
        round's decodes' blocks, and the last round's finishers' (awaiting their free), as
        they filled; vLLM keys those after the waiting pass. So no waiting request's chain of
        keys may hold one: no grower's next full block completes one of its keys, and no
        finisher's last full block is one (``growth_may_hit``). A preempted request waiting
        (its recompute is keyed at once, not a decode's block): no plan."""
        kv = self.paged
        last = kv.last_full_keys([r.seq_id for r in self._draining])
        for req in self.waiting:
            if req.num_output_tokens:
                return False
            ids = req.known_token_ids
            if ids is not None and kv.growth_may_hit(ids, last=last):
                return False
        return True

    def _open_window(self) -> bool:
        """The cohort's first round under prefix caching with async scheduling: planned only
        where every running request sampled in the last step, one decodes and the round's
        new blocks fit (so the round runs); the last step's outputs are then keyed now
        (``_key_sampled``): in the round they would be keyed after its appends, which read
        no key."""
        sampled, bs = self._sampled, self.paged.block_size
        need = decodes = 0
        for req in self.running:
            if req not in sampled:
                return False  # its block, if this round fills it, is keyed at once
            if req.status is _RUNNING:
                decodes += 1
                if req.num_computed_tokens % bs == 0:
                    need += 1
        if need > self.paged.num_free_blocks or (self.running and not decodes):
            return False  # (the round might not run: those keys would come early)
        self._key_sampled()
        self._window = True
        return True

    def append_order(self, reqs: Sequence[Request]) -> list[tuple[float, int]]:
        """The running order: admission order (a resumed request joins the end)."""
        serial = self._serial
        return [(serial[r], 0) for r in reqs]

    def cohort_ends(self, ran: bool) -> None:
        """Under prefix caching the running requests' tables are brought up to date (no
        grower outlives the cohort: ``append_order`` holds for the next). With async
        scheduling, each computed its token in the cohort's last round, whose outputs arrive
        in the next schedule (``_sampled``), and the keys of the blocks those tokens filled,
        made as the round ran, are taken back until then."""
        kv = self.paged
        if not kv.config.enable_prefix_caching:
            return
        if not self._window:
            kv.stop_growing([r.seq_id for r in self.running])
            return
        self._window = False
        if not ran:
            if self.running:
                raise IntegrityError("the last step's outputs were keyed, but no round ran")
            return
        # (a prompt in chunks ends the cohort: it is not among those that sampled)
        self._sampled = {r: None for r in self.running if r.num_pending_tokens <= 1}
        # only a decode's block waits for its output (a prefill's ids are known)
        kv.take_back_last_keys(
            [r.seq_id for r in self.running if r.num_computed_tokens > r.prompt_len]
        )

    def fill(
        self,
        out: SchedulerOutput,
        prefilling: Sequence[Request],
        decoded: Collection[Request],
        preempted: bool = False,
    ) -> None:
        """The round after its decodes (``decoded``, one token each, their blocks taken):
        the running pass's chunks for ``prefilling`` in running order (each decode ahead of
        them spent one token of the budget), then, unless the decodes preempted, the waiting
        pass; then (async) the requests that finished in the last round free their blocks
        (``out.released``). None of it reads a decoded request's counters."""
        budget = self._budget
        threshold = self._threshold()
        if prefilling:
            budget = self._chunks(out, budget, threshold, decoded)
        else:
            budget -= len(decoded)
        if not (preempted or out.preempted):
            self._schedule_waiting(out, budget, threshold)
        self._sampled = {}  # (read only by prefix caching's keys, which plans exclude)
        if self._draining:
            out.released.extend(self._draining)
            self._release()

    def _chunks(
        self, out: SchedulerOutput, budget: int, threshold: int, decoded: Collection[Request]
    ) -> int:
        """``_schedule_running``'s chunks of the running prompts, the decodes' tokens counted
        where they stand; each fits (``plan_round`` checked the blocks). Returns the budget
        left."""
        kv = self.paged
        max_len = self.config.max_model_len
        for req in self.running:
            if budget <= 0:
                break
            if req.status is not _RUNNING:
                continue
            if req in decoded:
                budget -= 1
                continue
            start = req.num_computed_tokens
            n = req.num_pending_tokens
            if 0 < threshold < n:
                n = threshold
            n = min(n, budget, max_len - start - 1)
            if n <= 0:
                continue
            copies = kv.append_slots(req.seq_id, n)
            if copies is None:
                raise IntegrityError(f"request {req.request_id}: no block for its planned chunk")
            out.copies.extend(copies)
            out.chunks.append(ScheduledChunk(req, n, start))
            budget -= n
        return budget

    def growth_victim(self) -> Request | None:
        """The running pass's victim when the decodes are short of blocks (``_pick_victim``:
        the last running, or the highest priority key); taken one after the other until the
        rest fit, the round's decodes are the rest's (a short decode retries after each
        victim, and a victim already scheduled gives its blocks and budget back). A finished
        request awaiting its free (async) may be the victim: it needs no block, so it never
        is short itself, and its preemption frees its blocks and takes it out of the round's
        frees, as ``_schedule_running`` does. None in the states ``_plannable`` refuses, and
        where the requests awaiting their free that would be taken after the last computing
        one might hold its blocks (``_last_victim_fits``): a round whose every request is a
        victim runs nobody, and vLLM's engine schedules again at once (``schedule``)."""
        if not self.running or not self._plannable():
            return None
        if self._draining and not self._last_victim_fits():
            return None
        return self._pick_victim()

    def _last_victim_fits(self) -> bool:
        """Does the computing request that the victims reach last (the oldest under FCFS, the
        lowest key under priority) fit once all the others are gone? The requests awaiting
        their free that would be taken after it keep their blocks (their counters are up to
        date, and without prefix caching nothing is shared: ``blocks_for`` their tokens);
        beside them it has the rest of the pool, and never needs more than its final
        length's blocks."""
        running, kv = self.running, self.paged
        if self._priority:
            last = min((r for r in running if r.status is _RUNNING), key=_key, default=None)
            if last is None:
                return False
            bound = _key(last)
            after = [r for r in self._draining if _key(r) < bound]
        else:
            after = []
            for r in running:  # victims come off the end: those ahead of it stay
                if r.status is _RUNNING:
                    break
                after.append(r)
            else:
                return False
            last = r
        held = sum([kv.blocks_for(r.num_computed_tokens) for r in after])
        return held + kv.blocks_for(last.max_kv_tokens) <= kv.gpu.num_blocks

    def preempt(self, victim: Request, out: SchedulerOutput) -> None:
        """Preempt ``victim`` by recompute, out of the running requests (``_schedule_running``
        takes it out of the list itself)."""
        self.running.remove(victim)
        self._preempt(victim, out)

    def decodes_next(self) -> bool:
        """Nothing waits or awaits its free, every running request decodes and the budget
        holds them all: the next round decodes each once (or preempts, blocks short)."""
        if self.waiting or self._draining or not self.running or not self._plannable():
            return False
        return len(self.running) <= self._budget and all(map(_decoding, self.running))


# What the promises restate of a round (a subclass that changes any gets no plan).
MIRRORED = (
    "schedule",
    "_schedule_once",
    "_schedule_running",
    "_schedule_waiting",
    "_pick_victim",
    "_preempt",
    "_outputs_arrive",
    "_key_sampled",
    "_release",
    "_free_group",
    "finish",
    "add_request",
    "_start_running",
)

"""``vllm``: FCFS continuous batching on paged memory with preemption (the vLLM paper's policy).

* Admission through ``can_allocate``, which keeps a watermark of blocks free.
* When a running request needs a block and none is free, the most recently arrived running
  request not yet scheduled in this iteration (else the request itself) is preempted, by
  recompute (its blocks are freed; it goes back to the front of the
  waiting queue) or by swap (its blocks move to the CPU pool; it resumes before any new
  admission). Without CPU room, swap falls back to recompute (counted).
* No new admissions while swapped requests wait; swapped requests resume first.
* Without chunked prefill (vLLM v0), an iteration is prefill-only when any waiting request can
  be admitted, and decode-only otherwise. With chunked prefill (vLLM v1), one token budget is
  shared by decodes first, then running prefill chunks, then new admissions.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import ClassVar

from pagedkv.engine.config import PreemptionMode, SchedulerConfig
from pagedkv.engine.request import Request, RequestStatus
from pagedkv.engine.scheduler import RoundPlan, Scheduler, SchedulerOutput, keeps_rounds
from pagedkv.memory.config import CacheConfig
from pagedkv.memory.interface import AllocStatus, KVAllocator
from pagedkv.memory.manager import KVCacheManager


class VllmScheduler(Scheduler):
    name = "vllm"
    decides_at_events = True  # tested fast against reference (tests/engine)
    preempts = True
    # The admission test ``plan_round`` may run (one that reads no running request).
    books_admission: ClassVar[Callable[..., bool]] = Scheduler._can_admit
    # Does that test read no group's tables either (reserve's reads only their counts)?
    books_admission_groups: ClassVar[bool] = False

    @classmethod
    def make_allocator(cls, cache: CacheConfig, config: SchedulerConfig) -> KVCacheManager:
        return KVCacheManager(cache)

    def __init__(self, config: SchedulerConfig, kv: KVAllocator) -> None:
        super().__init__(config, kv)
        assert isinstance(kv, KVCacheManager), "the vllm policy runs on paged memory"
        self.paged: KVCacheManager = kv
        # What ``plan_round`` asks of the class at every event, read once (a class is fixed):
        # are the rounds those of this class's ``schedule``, which the promises restate? (A
        # subclass that changes how a round is built promises nothing.)
        cls = type(self)
        self._rounds_mirrored = keeps_rounds(cls, VllmScheduler, _MIRRORED)
        self._books_admits = cls._can_admit is cls.books_admission
        self._memory_admits = cls._can_admit is Scheduler._can_admit  # ``can_allocate`` alone
        self._groups_admit = self._memory_admits or (
            self._books_admits and cls.books_admission_groups
        )
        # The last refused head: (it, running count, its pending tokens, free blocks then).
        self._refused: tuple[Request, int, int, int] | None = None
        # The last swapped head refused: (it, its swaps, running count, free blocks then).
        self._swap_refused: tuple[Request, int, int, int] | None = None
        # ``plan_round``'s tests that the class and the frozen config fix, read once: does it
        # admit first-come-first-served without chunks, and in what budget?
        chunked = config.enable_chunked_prefill
        self._plans_v0 = self._rounds_mirrored and self._books_admits and not chunked
        self._budget = config.token_budget

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        if self.config.enable_chunked_prefill:
            self._schedule_chunked(out)
        else:
            self._schedule_v0(out)
        return out

    def decodes_next(self) -> bool:
        """Nothing is swapped (nothing to resume), nothing waits or (without chunked prefill)
        the schedule would not admit the waiting head (``_admits_head``: then it admits
        nobody, being first-come-first-served), no group runs (they fork), and every running
        request has exactly its next token to compute: the schedule then decodes every
        running request once (``_decode_all``, or preemption when blocks run short, which the
        fast-forward stops before). A prompt's last token is not a decode even when it is the
        one token left (a chunked prefill of k x budget + 1 tokens): computing it samples the
        first token, an event the window does not model."""
        if self.swapped or self.has_groups or not self.running:
            return False
        if self.waiting and (self.config.enable_chunked_prefill or self._admits_head()):
            return False
        for r in self.running:
            computed = r.num_computed_tokens
            if r.prompt_len + r.num_output_tokens - computed != 1 or computed < r.prompt_len:
                return False
        return True

    def _admits_head(self) -> bool:
        """Would ``_admit_waiting`` (without chunks) take the waiting head now? Its first
        iteration's tests, none of which changes anything (a policy's ``_can_admit`` asks the
        memory ``can_allocate``); True where unsure, which only costs a stepped round."""
        if len(self.running) >= self.config.max_num_seqs:
            return False
        head = self.waiting[0]
        n = head.num_pending_tokens
        if n <= 0 or n > self.config.token_budget:
            return False
        return self._can_admit(head, n)

    def plan_round(self) -> RoundPlan | None:
        """Without chunked prefill, with nothing swapped and no beams: ``schedule`` first
        admits the waiting prompts first-come-first-served; if any fit the round is
        prefill-only (these admissions), else it decodes every running request (``_decode_all``,
        or a preemption where blocks run short). The admission test reads the free blocks and
        the running count, no running request; a subclass with a test of its own promises
        nothing unless it names that test as ``books_admission`` (reserve's reads aggregates
        of the books). Parallel samples only with the memory's own admission test, or one
        that reads no group's tables either (``books_admission_groups``)."""
        if self.has_beams or not self._rounds_mirrored:
            return None
        if self.has_groups and not self._groups_admit:
            return None
        if not self._plans_v0 or self.swapped:
            if self.config.enable_chunked_prefill:  # decodes first, then ``fill``'s part
                if not self._books_admits:
                    return None
                return _new(RoundPlan, (SchedulerOutput(), True, False, True))
            if self.swapped:  # no admission: a decode, then resumptions while they fit
                resumes = not self._refuses_swap_in()
                return _new(RoundPlan, (SchedulerOutput(), True, resumes, False))
            return None  # (an admission test of its own)
        out = SchedulerOutput()
        if not self.waiting:
            return _new(RoundPlan, (out, True, False, False))
        head = self.waiting[0]
        free = self.paged.num_free_blocks
        if self._refused is not None and self._refuses_again(head, free):
            return _new(RoundPlan, (out, True, False, False))
        self._admit_waiting(out, self._budget, chunked=False)
        if out.chunks:
            self._refused = None
            return _new(RoundPlan, (out, False, False, False))
        self._refused = (head, len(self.running), head.num_pending_tokens, free)
        return _new(RoundPlan, (out, True, False, False))

    def _refuses_again(self, head: Request, free: int) -> bool:
        """Would ``_admit_waiting`` refuse ``head`` again, as it did last? Its first test
        reads only the running count, the head's pending tokens and final length, and
        ``can_allocate``'s free blocks (no token ids read, no pinned prefix: no prefix hit; the
        watermark is fixed): with the first three as they were and no more blocks free than
        then, every test answers as then (each needs at least as many free blocks)."""
        refused = self._refused
        return (
            refused is not None
            and refused[0] is head
            and refused[1] == len(self.running)
            and refused[2] == head.num_pending_tokens
            and free <= refused[3]
            and self._memory_admits
            and not (self.has_token_ids and self.paged.reads_token_ids)
            and not self.paged.num_pinned_blocks
        )

    def _refuses_swap_in(self) -> bool:
        """Would ``_swap_in`` resume nobody now (the swapped head refused)? Then it resumes
        nobody after the next decode round either, nor after any round before the next event:
        those rounds keep the running count, the head and its tables, and only take blocks
        (its room test needs at least as many free as now). Not so under prefix caching,
        where a grower's new key can stand in for one of the head's blocks: unsure, False."""
        running = len(self.running)
        if running >= self.config.max_num_seqs:
            return True
        paged = self.paged
        if paged.config.enable_prefix_caching:
            return False
        # Refused as last time: the same head, swapped out as then (its tables and pending
        # tokens as then), the running count as then and no more blocks free.
        head, free = self.swapped[0], paged.num_free_blocks
        last = self._swap_refused
        if (
            last is not None
            and last[0] is head
            and last[1:3] == (head.num_swaps, running)
            and free <= last[3]
        ):
            return True
        if paged.can_swap_in(head.seq_ids, self._swap_in_room(head)) is AllocStatus.OK:
            return False
        self._swap_refused = (head, head.num_swaps, running, free)
        return True

    def growth_victim(self) -> Request | None:
        """The latest arrived running request (``_victim``: a decode round that runs short
        schedules its requests in arrival order and takes victims off the end; a group of
        parallel samples goes whole, by its own mode). Without beams."""
        if not self.running or self.has_beams or not self.preempts:
            return None
        if not self._rounds_mirrored or type(self)._preempt is not VllmScheduler._preempt:
            return None
        return self.running[-1]

    def resume(self, out: SchedulerOutput, decoded: Collection[Request] = ()) -> None:
        """``_swap_in`` (after the decode round's appends, as ``_schedule_v0`` does): it reads
        the swapped queue, the running count and the free blocks. Its room test leaves each
        resumed request a block for its next token, so none is preempted for it, except a
        group of samples swapped out before it forked (its fork needs more): it goes straight
        back out (``decoded`` are never victims: ``_victim``)."""
        self._decoded = decoded
        try:
            self._swap_in(out)
        finally:
            self._decoded = ()

    def fill(
        self,
        out: SchedulerOutput,
        prefilling: Sequence[Request],
        decoded: Collection[Request],
        preempted: bool = False,
    ) -> None:
        """``_schedule_chunked`` after its decodes (``decoded``, each one token; ``preempted``:
        they preempted victims): prefill chunks of ``prefilling``, the running requests that
        do not decode (none has one token left: that would be a decode), then swap-ins and
        admissions, in what is left of the budget. None of it reads a decoded request (a
        victim is never one: ``_victim``)."""
        budget = self.config.token_budget
        used = len(decoded)
        self._decoded = decoded
        try:
            used += self._prefill_running(out, budget - used, prefilling)
            if preempted or out.preempted:
                return
            used += self._swap_in(out, used)
            if not self.swapped and not out.preempted:
                self._admit_waiting(out, budget - used, chunked=True)
        finally:
            self._decoded = ()

    def _schedule_v0(self, out: SchedulerOutput) -> None:
        if not self.swapped:
            self._admit_waiting(out, self.config.token_budget, chunked=False)
            if out.chunks:
                return  # a prefill-only iteration
        self._decode_running(out)
        if not out.preempted:
            self._swap_in(out)

    def _schedule_chunked(self, out: SchedulerOutput) -> None:
        budget = self.config.token_budget
        used = self._decode_running(out)
        used += self._prefill_running(out, budget - used)  # partial chunks, recomputes
        if not out.preempted:
            used += self._swap_in(out, used)
        if not self.swapped and not out.preempted:
            self._admit_waiting(out, budget - used, chunked=True)

    def _swap_in(self, out: SchedulerOutput, before: int = 0) -> int:
        """Resume swapped requests (oldest first) while they fit; each decodes this step
        (with chunked prefill, within the budget that ``before`` tokens left)."""
        used = 0
        while self.swapped and len(self.running) < self.config.max_num_seqs:
            req = self.swapped[0]
            if self.paged.can_swap_in(req.seq_ids, self._swap_in_room(req)) is not AllocStatus.OK:
                break
            mappings = self.paged.swap_in(req.seq_ids)
            if mappings is None:
                break
            self.swapped.popleft()
            out.swap_in.extend(mappings)
            self._start_running(req)
            n = req.num_pending_tokens
            if self.config.enable_chunked_prefill:
                n = min(n, max(0, self.config.token_budget - before - used))
            if not n:
                continue
            if not self._append(req, n, out):
                break  # no block for its next token: it went back out; stop resuming
            out.chunks.append(self._chunk(req, n))
            used += n
        return used

    def _swap_in_room(self, req: Request) -> int:
        """The tokens a swap-in of ``req`` must leave room for: its next step too (resumed and
        straight back out would move its blocks twice for nothing), unless nothing runs: then
        nothing would free room for it."""
        return req.num_pending_tokens if self.running else 0

    def _preempt(self, victim: Request, out: SchedulerOutput) -> None:
        self.running.remove(victim)
        out.chunks = [c for c in out.chunks if c.request is not victim]
        out.preempted.append(victim)
        victim.num_preemptions += 1
        # A forked group follows group_preemption_mode, swap by default (vLLM v0's rule):
        # recomputing its samples would need each one's own tokens again, so its recompute is
        # a restart from the prompt (below), as is a swap without CPU room. A beam group
        # counts as forked from its first token: its k first tokens are chosen; so do
        # parallel samples whose shared first token is sampled but not yet forked from
        # (kept as one sequence, they would fork only after their recompute's next token).
        beam_forked = victim.beam is not None and victim.num_output_tokens > 0
        group = len(victim.seq_ids) > 1 or beam_forked or victim.sampled_unforked
        config = self.config
        mode = config.group_preemption_mode if group else config.preemption_mode
        if mode is PreemptionMode.SWAP:
            mappings = self.paged.swap_out(victim.seq_ids)
            if mappings is not None:
                out.swap_out.extend(mappings)
                victim.status = RequestStatus.SWAPPED
                victim.num_swaps += 1
                self.swapped.appendleft(victim)  # victims go latest-first: order holds
                return
            self.num_swap_fallbacks += 1
        self._free_group(victim)
        victim.num_recomputed_tokens += victim.num_computed_tokens
        victim.num_computed_tokens = 0
        if group:  # a forked group restarts its samples from the prompt
            del victim.seq_ids[1:]
            victim.num_output_tokens = 0
            victim.output_token_ids.clear()
            victim.child_output_ids.clear()
            if victim.beam is not None:
                victim.beam.restart()
        victim.status = RequestStatus.WAITING
        self.waiting.appendleft(victim)


_new = tuple.__new__  # a NamedTuple's own constructor is Python code (a plan per event)

# What ``plan_round``, ``growth_victim``, ``resume`` and ``fill`` restate of a round.
_MIRRORED = (
    "schedule",
    "_schedule_v0",
    "_schedule_chunked",
    "_prefill_running",
    "_admit_waiting",
    "_decode_running",
    "_decode_all",
    "_append",
    "_victim",
    "_swap_in",
    "_swap_in_room",
)

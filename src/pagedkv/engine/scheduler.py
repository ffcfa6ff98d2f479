"""The scheduler interface, and the continuous-batching skeleton every policy shares.

The memory manager keeps the books; the scheduler makes policy: it decides who runs, asks the
allocator for room (``can_allocate``/``allocate``, ``append_slots``), and alone picks victims.
A policy is one subclass in one file under ``pagedkv.engine.policies``, registered by name.

One iteration of the skeleton (vLLM v0 without chunked prefill, vLLM v1 with it)::

    without chunked prefill:  admit waiting prompts (a prefill-only step) if any fit,
                              else one decode step for every running request
    with chunked prefill:     decodes first, then prefill chunks of running requests,
                              then new admissions, all within one token budget
"""

from __future__ import annotations

import abc
import bisect
from collections import deque
from collections.abc import Collection, Container, Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from pagedkv.engine.beam import reorganise
from pagedkv.engine.config import SchedulerConfig
from pagedkv.engine.request import Request, RequestStatus
from pagedkv.memory.config import CacheConfig
from pagedkv.memory.interface import (
    AllocStatus,
    BlockCopy,
    CopyQueue,
    ExplainsNever,
    KVAllocator,
    SlotCopy,
    SwapMapping,
)
from pagedkv.memory.token_runs import TokenIds

# Enum members read on the hot paths (every arrival, admission and finish), as globals: a
# lookup on the enum class costs CPython 3.11 about four times a global read.
_OK, _NEVER = AllocStatus.OK, AllocStatus.NEVER
_RUNNING, _FINISHED = RequestStatus.RUNNING, RequestStatus.FINISHED


class ScheduledChunk(NamedTuple):
    """``num_new_tokens`` of ``request`` computed this iteration after ``num_cached_tokens``.

    A NamedTuple: one is made per scheduled sequence per iteration, so construction is hot."""

    request: Request
    num_new_tokens: int
    num_cached_tokens: int


@dataclass(init=False, slots=True)
class SchedulerOutput:
    """What one iteration runs, and the memory operations the executor performs first.
    (Its ``__init__`` by hand: a dataclass's calls a factory per field, and the decode cohort
    makes one at nearly every event.)"""

    chunks: list[ScheduledChunk]
    copies: list[BlockCopy | SlotCopy]
    swap_out: list[SwapMapping]
    swap_in: list[SwapMapping]
    preempted: list[Request]
    # Requests whose memory the round's schedule freed (vllm-v1's async finishes, a round late)
    released: list[Request]

    def __init__(
        self,
        chunks: list[ScheduledChunk] | None = None,
        swap_out: list[SwapMapping] | None = None,
    ) -> None:
        self.chunks = [] if chunks is None else chunks
        self.copies, self.swap_in, self.preempted, self.released = [], [], [], []
        self.swap_out = [] if swap_out is None else swap_out

    @property
    def num_tokens(self) -> int:
        return sum(c.num_new_tokens for c in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks


class RoundPlan(NamedTuple):
    """The part of the next round a policy decides from its queues and the books alone
    (``Scheduler.plan_round``): the chunks it admits, whether the round also decodes every
    running request (blocks short for that round: the scheduler's to preempt), and whether,
    after that decode, it resumes swapped requests (``Scheduler.resume``; the rounds after it
    resume nobody until the next event). With ``chunked`` (chunked prefill), the round after
    that decode runs the policy's part in the rest of the token budget (``Scheduler.fill``:
    prefill chunks, swap-ins, admissions); a round whose part is empty leaves every round
    after it the same until the next event."""

    admitted: SchedulerOutput
    decodes: bool
    resumes: bool = False
    chunked: bool = False


class Scheduler(abc.ABC):
    """Queues, admission at arrival (reject what can never fit), finishing, preemption."""

    name: ClassVar[str]
    always_chunked: ClassVar[bool] = False  # chunked prefill whatever enable_chunked_prefill says
    default_watermark: ClassVar[float] = 0.01  # the watermark when the run sets none (vLLM v0's)
    null_blocks: ClassVar[int] = 0  # blocks kept out of the pool (vllm-v1: vLLM's null block)
    preempts: ClassVar[bool] = False
    supports_groups: ClassVar[bool] = True  # parallel sampling (a request of n > 1 sequences)
    # The fast path's contract, off unless a policy promises it: between two events (an
    # arrival, a finish, a preemption, memory or region room running short, a copy-on-write)
    # the policy's decisions depend only on its queues and the memory's state, never on a
    # count of rounds, the clock or state of its own. Then a pure decode round repeats until
    # the next event and the engine skips over those rounds in closed form; otherwise the
    # engine steps every round (the reference loop), which is correct for any policy.
    # See ``__init_subclass__`` for how the promise passes to subclasses.
    decides_at_events: ClassVar[bool] = False
    # The decode cohort asks ``plan_round`` at every event, queued or not, and no window runs
    # without a plan (vllm-v1: its budget caps decodes, and an async finish frees its blocks
    # in the round after it, ``fill``'s).
    plans_every_event: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        """A subclass keeps its parent's ``decides_at_events`` promise only while it changes
        no behaviour: one that defines any method other than ``make_allocator`` (its memory,
        which the fast path reads through the allocator interface) and does not state the
        promise itself runs the reference loop. A subclass overriding ``schedule`` to cap
        admissions is then correct without knowing that the fast path exists."""
        super().__init_subclass__(**kwargs)
        if "decides_at_events" in cls.__dict__:
            return
        for attr, value in cls.__dict__.items():
            if attr == "make_allocator" or attr in _PLAIN_DUNDERS:
                continue
            if callable(value) or isinstance(value, (classmethod, staticmethod, property)):
                cls.decides_at_events = False
                return

    @classmethod
    @abc.abstractmethod
    def make_allocator(cls, cache: CacheConfig, config: SchedulerConfig) -> KVAllocator:
        """The memory this policy runs on, with the capacity of ``cache``."""

    @classmethod  # noqa: B027 (an optional hook, so not abstract)
    def check_memory(cls, cache: CacheConfig, config: SchedulerConfig) -> None:
        """Raise the ``ConfigError`` that ``make_allocator`` would raise for ``cache``, without
        allocating (a sweep checks every point with it before any runs). Paged memory refuses
        nothing that ``CacheConfig`` accepts."""

    def __init__(self, config: SchedulerConfig, kv: KVAllocator) -> None:
        self.config = config
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # kept in arrival order
        self.swapped: deque[Request] = deque()
        self.num_swap_fallbacks = 0  # swap wanted, CPU pool full: recomputed instead
        # Seen any request with token ids / parallel samples? (the hot paths skip both checks)
        self.has_token_ids = False
        self.has_groups = False
        self.has_beams = False  # (groups of beams, which fork and free every round)
        # Allocators whose admission can copy a block (pinned prefixes' copy-on-write).
        self._copy_queue = kv if isinstance(kv, CopyQueue) else None
        # Running requests a ``fill`` decoded this round (never victims: scheduled already).
        self._decoded: Container[Request] = ()

    # ----- arrivals and completions -------------------------------------------------------
    def add_request(self, req: Request) -> bool:
        """Queue an arrival, or reject it (False) with a reason if it can never fit."""
        final = req.prompt_len + req.output_len  # ``final_len``
        if final > self.config.max_model_len:
            return self._reject(
                req, f"prompt + output = {final} > max_model_len {self.config.max_model_len}"
            )
        ids = req.token_ids
        if ids is not None:
            self.has_token_ids = True
        if req.n > 1 or req.beam is not None:
            self.has_groups |= req.n > 1
            self.has_beams |= req.beam is not None
            if req.n > 1 and not self.supports_groups:
                what = "beams" if req.beam is not None else "parallel samples"
                return self._reject(
                    req, f"{req.n} {what}: the {self.name} policy runs one sequence each"
                )
        status = self.kv.can_allocate(
            req.seq_ids[0], req.prompt_len, token_ids=ids, final_len=final - 1
        )
        if status is _NEVER:
            if isinstance(self.kv, ExplainsNever):  # (only on this rare path)
                return self._reject(
                    req,
                    self.kv.never_reason(
                        req.prompt_len, token_ids=req.token_ids, final_len=req.max_kv_tokens
                    ),
                )
            return self._reject(
                req,
                f"needs {req.max_kv_tokens} token slots; the KV cache of {self.kv.capacity} "
                "slots can never hold it",
            )
        if req.n > 1 and not self._group_fits(req):
            return False
        self.waiting.append(req)
        return True

    def _group_fits(self, req: Request) -> bool:
        """Reject a group whose worst case can never fit: every sequence descends from the
        prompt, so its full blocks are always shared, but past them n samples hold their own
        blocks (and k beams may too, if no two share a parent for long). Without this a
        group bigger than the pool is preempted and resumed forever (a deadlock). Pinned
        prefixes hold their blocks for good: only those the prompt shares count as its own."""
        kv = self.kv
        bs = kv.growth_block_size
        if bs is None:
            return True
        shared = req.prompt_len // bs
        worst = shared + req.n * (-(-req.max_kv_tokens // bs) - shared)
        pool = kv.capacity // bs
        usable = (
            kv.usable_blocks(req.prompt_len, req.token_ids)
            if isinstance(kv, ExplainsNever)
            else pool
        )
        if worst <= usable:
            return True
        reason = (
            f"{req.n} sequences of up to {req.max_kv_tokens} tokens may need {worst} blocks of "
            f"{bs} (the prompt's full blocks shared); the KV cache holds {usable}"
        )
        if usable < pool:
            reason += f" ({pool - usable} held by pinned prefixes it does not share)"
        return self._reject(req, reason)

    def finish(self, req: Request) -> list[Request]:
        """``req`` sampled its last token; returns the requests that complete now."""
        if req.beam is not None and req.beam.pending is not None:
            reorganise(req, self.kv)  # the last step's best beam becomes output_token_ids
        self._free_group(req)
        self.running.remove(req)
        req.status = _FINISHED
        return [req]

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def has_queued(self) -> bool:
        """Does any request wait to be admitted or resumed? Free memory then counts as
        external fragmentation: the policy admits whenever memory allows, so what is free
        could not serve the waiting request (a max_num_seqs cap is the one exception)."""
        return bool(self.waiting or self.swapped)

    def stuck(self) -> list[Request]:
        """Every unfinished request (named in a deadlock report)."""
        return [*self.running, *self.swapped, *self.waiting]

    @abc.abstractmethod
    def schedule(self) -> SchedulerOutput:
        """Build one iteration's batch and allocate its slots."""

    def decodes_next(self) -> bool:
        """Would the next ``schedule()`` be a plain decode round: every running request
        computes one token, nothing is admitted, resumed, prefilled or forked? Then the
        fast-forward may start at once instead of after one such round has run. Only a policy
        that knows its own rules can promise it; the default never does."""
        return False

    def plan_round(self) -> RoundPlan | None:
        """The next round as far as it reads no running request's counters, tables or
        blocks (only the queues, the running count and the allocator's free blocks): its
        admissions (allocated now, as ``schedule`` would) and whether every running request
        also decodes once in it. The decode cohort, whose running requests lag behind, runs
        such a round without syncing them. None, changing nothing, where the policy cannot
        promise it; the default never does."""
        return None

    def growth_victim(self) -> Request | None:
        """Whom the policy preempts first when a decode round of every running request is
        short of blocks for their new tokens, if it promises that the victim's preemption
        (``preempt``) reads and changes no other running request and leaves nothing swapped,
        and that it takes victims until the others' blocks fit. None, changing nothing,
        otherwise; the default never promises it."""
        return None

    def append_order(self, reqs: Sequence[Request]) -> list[tuple[float, int]]:
        """Each running request's place among a round's appends (sortable keys): under prefix
        caching the decode cohort makes the rounds' blocks and keys in this order. The
        default is arrival order, the running order of the policies that keep it so."""
        return [(r.arrival_time, r.request_id) for r in reqs]

    def cohort_ends(self, ran: bool) -> None:
        """The decode cohort hands the run back to ``schedule()`` (``ran``: it ran a round,
        in which every running request computed its token): a policy that keeps state of
        the last round's outputs brings it up to date. The default keeps none."""
        del ran

    def resume(self, out: SchedulerOutput, decoded: Collection[Request] = ()) -> None:
        """The resumptions a plan's ``resumes`` promised, into ``out``: swapped requests
        brought back after the round's decode (of ``decoded``, their chunks not in ``out``)
        took its blocks, each with its next token."""
        raise NotImplementedError(f"{self.name} plans no resumption")

    def fill(
        self,
        out: SchedulerOutput,
        prefilling: Sequence[Request],
        decoded: Collection[Request],
        preempted: bool = False,
    ) -> None:
        """The part of a chunked round that a plan's ``chunked`` promised, into ``out``, after
        the round's decodes took their blocks: ``decoded`` (running requests that decoded in
        it, one token each, their chunks not in ``out``; ``preempted``: the decodes preempted
        victims) and ``prefilling`` (every other running request, in running order, none with
        only its last prompt token left)."""
        raise NotImplementedError(f"{self.name} plans no chunked round")

    def preempt(self, victim: Request, out: SchedulerOutput) -> None:
        """Preempt ``victim`` (the policy's rule for how) into ``out``."""
        self._preempt(victim, out)

    # ----- helpers for policies -----------------------------------------------------------
    def _reject(self, req: Request, reason: str) -> bool:
        req.status = RequestStatus.REJECTED
        req.reject_reason = reason
        return False

    def _start_running(self, req: Request) -> None:
        req.status = _RUNNING
        running = self.running
        if not running or req.arrival_time > running[-1].arrival_time:
            running.append(req)  # the usual case: a new arrival is the latest
            return
        key = (req.arrival_time, req.request_id)
        if key > (running[-1].arrival_time, running[-1].request_id):
            running.append(req)
            return
        running.insert(bisect.bisect(running, key, key=_arrival_key), req)

    def _chunk(self, req: Request, n: int) -> ScheduledChunk:
        return _new(ScheduledChunk, (req, n, req.num_computed_tokens))

    def _admit_waiting(self, out: SchedulerOutput, token_budget: int, chunked: bool) -> int:
        """Admit waiting requests first-come-first-served; returns the tokens scheduled."""
        waiting = self.waiting
        if not waiting:
            return 0
        used = 0
        running, kv = self.running, self.kv
        max_num_seqs = self.config.max_num_seqs
        can_admit, chunks = self._can_admit, out.chunks
        while waiting and len(running) < max_num_seqs:
            req = waiting[0]
            n = req.prompt_len + req.num_output_tokens - req.num_computed_tokens  # (pending)
            if chunked:
                n = min(n, token_budget - used)
            if n <= 0 or used + n > token_budget:
                break
            if not can_admit(req, n):
                break
            ids = None if req.token_ids is None else req.known_token_ids
            final = req.prompt_len + req.output_len - 1  # ``max_kv_tokens``
            computed = kv.allocate(req.seq_ids[0], n, token_ids=ids, final_len=final)
            if computed is None:
                break
            waiting.popleft()
            req.num_computed_tokens = computed
            if computed and self._copy_queue is not None:  # copies before the prompt's writes
                out.copies.extend(self._copy_queue.take_copies())
            self._start_running(req)
            chunks.append(_new(ScheduledChunk, (req, n - computed, computed)))
            used += n - computed
        return used

    def _can_admit(self, req: Request, num_tokens: int) -> bool:
        """Admission test; the default asks the allocator (watermark included)."""
        ids = None if req.token_ids is None else req.known_token_ids
        final = req.prompt_len + req.output_len - 1  # ``max_kv_tokens``
        status = self.kv.can_allocate(req.seq_ids[0], num_tokens, token_ids=ids, final_len=final)
        return status is _OK

    def _free_group(self, req: Request) -> None:
        free = self.kv.free
        for seq_id in req.seq_ids:
            free(seq_id)

    def _append(self, req: Request, n: int, out: SchedulerOutput) -> bool:
        """Slots for ``n`` more tokens of a running request; preempt (policy) if none."""
        if req.n > 1:
            return self._append_group(req, n, out)
        start = req.num_computed_tokens
        ids = req.token_slice(start, start + n)  # None unless the ids are known
        while True:
            copies = self.kv.append_slots(req.seq_id, n, token_ids=ids)
            if copies is not None:
                out.copies.extend(copies)
                return True
            if not self.preempts:
                return False  # no room and no preemption: the request stalls this iteration
            victim = self._victim(req, out)  # the most recently arrived, not yet scheduled
            self._preempt(victim, out)
            if victim is req:
                return False

    def _append_group(self, req: Request, n: int, out: SchedulerOutput) -> bool:
        """Parallel sampling: after its prefill the group forks (every child shares the
        prompt's blocks; paged memory copies nothing, contiguous memory copies the prompt into
        a region of the child's own), then every sequence gets its slots, all or none: a group
        is preempted as a whole, never half written.

            seq 0:  | prompt (shared) | out 0 ...
            seq j:  | prompt (shared) | out j ...   (copy-on-write of the shared last block)
        """
        kv = self.kv
        beam = req.beam
        if beam is not None and req.num_output_tokens > beam.applied:
            # Beam search: a token was sampled since the group last ran, so the beams pick
            # their parents (the first time, all k fork from the prompt); forks and frees
            # only, the copy-on-write copies come with the appends below.
            reorganise(req, kv)
        while True:
            if beam is None and req.num_output_tokens and len(req.seq_ids) < req.n:
                child = (req.request_id, len(req.seq_ids))
                copies = kv.fork(req.seq_ids[0], child, final_len=req.max_kv_tokens)
                if copies is not None:
                    out.copies.extend(copies)
                    req.seq_ids.append(child)
                    req.child_output_ids[child] = list(req.output_token_ids)
                    continue
            elif kv.can_append_all(req.seq_ids, n):
                # one bulk call (the room is checked): the same copies, in the same order
                out.copies.extend(kv.append_slots_all(req.seq_ids, n))
                return True
            if not self.preempts:
                return False  # no room: the group stalls this iteration
            victim = self._victim(req, out)
            self._preempt(victim, out)
            if victim is req:
                return False

    def _preempt(self, victim: Request, out: SchedulerOutput) -> None:
        """Overridden by preempting policies."""
        raise NotImplementedError(f"{self.name} does not preempt")

    def _victim(self, req: Request, out: SchedulerOutput) -> Request:
        """Who makes room for ``req``: the most recently arrived running request that this
        step has not scheduled yet, else ``req`` itself (vLLM v0's and v1's rule: victims come
        off the end of the queue not yet processed). One already scheduled holds slots for
        tokens it has not computed; preempting it would drop its chunk but not those slots:
        swapped, its table would run ahead of its tokens (and key a block by the wrong ids);
        recomputed, the blocks its chunk filled would stay cached under keys whose K/V was
        never written, for the next prefix hit to read. (With chunked prefill the decodes are
        scheduled before the prefill chunks of older requests, so this happens.)"""
        scheduled = {c.request for c in out.chunks}  # only when preempting: rare
        decoded = self._decoded  # (a ``fill``'s decodes, which ``out`` does not list)
        for victim in reversed(self.running):
            if victim is req or (victim not in scheduled and victim not in decoded):
                return victim
        return req

    def _prefill_running(
        self, out: SchedulerOutput, budget: int, reqs: Sequence[Request] | None = None
    ) -> int:
        """Chunks of running requests still prefilling (chunked prefill), within ``budget``
        (of ``reqs`` only: running requests that are all the others decode)."""
        used = 0
        for req in list(self.running if reqs is None else reqs):
            n = min(req.num_pending_tokens, budget - used)
            if req.status is not RequestStatus.RUNNING or req.num_pending_tokens <= 1 or n <= 0:
                continue
            if self._append(req, n, out):
                out.chunks.append(self._chunk(req, n))
                used += n
        return used

    def _decode_running(self, out: SchedulerOutput, only: Sequence[Request] | None = None) -> int:
        """One token for every running request whose prefill is done; returns tokens."""
        if only is None and not out.chunks:
            done = self._decode_all(out)
            if done is not None:
                return done
        used = 0
        scheduled = {c.request for c in out.chunks}
        for req in list(self.running if only is None else only):
            if req.status is not RequestStatus.RUNNING or req.num_pending_tokens != 1:
                continue
            if req in scheduled:
                continue
            if self._append(req, 1, out):
                out.chunks.append(self._chunk(req, 1))
                used += 1
        return used

    def _decode_all(self, out: SchedulerOutput) -> int | None:
        """The common decode round in one allocator call: every running request decodes and
        the free blocks cover every new block, so no one is preempted and the per-request
        loop would end in the same state (same blocks, same order). None: take the loop."""
        running = self.running
        if not running:
            return None
        if self.has_groups and any(r.n > 1 for r in running):
            return None  # a group among them: each forks and appends all or nothing
        for r in running:
            if r.prompt_len + r.num_output_tokens - r.num_computed_tokens != 1:
                return None  # a prefill (chunk or recompute) among them
        seq_ids = [r.seq_ids[0] for r in running]
        short = self.kv.rooms(seq_ids).count(0)  # each needs one block (new, or a copy)
        if short:
            free = getattr(self.kv, "num_free_blocks", None)
            if self.kv.growth_block_size is None or free is None or short > free:
                return None
        ids = new_token_ids(running, 1) if self.has_token_ids else None
        out.copies.extend(self.kv.append_slots_all(seq_ids, 1, ids))
        out.chunks.extend([ScheduledChunk(r, 1, r.num_computed_tokens) for r in running])
        return len(running)


# Class-body entries every class has or that carry no behaviour.
_PLAIN_DUNDERS = frozenset({"__module__", "__qualname__", "__doc__", "__annotations__"})


_new = tuple.__new__  # a NamedTuple's own constructor is Python code (one chunk per admission)


def keeps_rounds(cls: type, base: type, names: Collection[str]) -> bool:
    """Does ``cls`` build its rounds with ``base``'s own methods ``names`` (none overridden)?
    A policy's promises (``plan_round`` and the like) restate those methods: a subclass that
    changes one of them has rounds the promises do not describe, so it gets no plan."""
    return all(getattr(cls, m) is getattr(base, m) for m in names)


def _arrival_key(r: Request) -> tuple[float, int]:
    return (r.arrival_time, r.request_id)


def new_token_ids(running: Sequence[Request], n: int) -> list[TokenIds | None] | None:
    """The ids of each request's next ``n`` tokens (None where unknown), or None if no request
    has token ids at all (the usual simulation: then nothing is sliced)."""
    if all(r.token_ids is None for r in running):
        return None
    return [r.token_slice(r.num_computed_tokens, r.num_computed_tokens + n) for r in running]

"""The one serving loop: schedule -> execute -> update -> account.

    while work remains:
        admit arrivals (rejecting what can never fit)
        batch = scheduler.schedule()          # the scheduler asks memory for room
        if the batch is empty: wait for the next arrival, or report a deadlock
        duration = executor.execute(batch)   # simulated or real
        account memory during the iteration (time-weighted)
        advance counters; finished requests free their memory

Termination: every iteration either computes at least one token or jumps to the next arrival
(finitely many). Preemption by recompute discards tokens, but victims are always the most
recently arrived, so the oldest running request keeps its tokens and finishes (it fits alone:
requests that cannot are rejected at arrival); by induction every admitted request finishes.
An empty batch with no arrival to come is a deadlock, reported with the stuck requests. Every
scheduler loop moves a request between queues or stops. No step cap is involved.
"""

from __future__ import annotations

import gc
import heapq
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pagedkv.engine.clock import to_seconds, to_ticks
from pagedkv.engine.executor import Executor
from pagedkv.engine.fast_forward import FastForward
from pagedkv.engine.ledger import Ledger, Span
from pagedkv.engine.metrics import StepRecord, StepTotals
from pagedkv.engine.request import Request, RequestStatus
from pagedkv.engine.scheduler import Scheduler, SchedulerOutput
from pagedkv.errors import ConfigError, IntegrityError
from pagedkv.memory.manager import KVCacheManager
from pagedkv.memory.usage import MemoryUsage, categories
from pagedkv.workloads.client import ConcurrencyCap
from pagedkv.workloads.spec import RequestSpec


@dataclass
class EngineRun:
    """What a run leaves behind: the requests, the totals, the clock, a deadlock if any."""

    requests: list[Request]
    totals: StepTotals
    sim_time: float
    deadlocked: bool = False
    stuck: list[int] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)


class Engine:
    """Drives one scheduler and one executor over a workload."""

    def __init__(
        self,
        scheduler: Scheduler,
        executor: Executor,
        workload: Iterable[RequestSpec],
        *,
        check_integrity: bool = False,
        trace_steps: bool = False,
        reference: bool = False,
        token_times: bool = False,
        max_concurrency: int | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.requests = [Request.from_spec(s) for s in workload]
        # Follow-ups (chat turns) wait for their parent: released at its finish + think time.
        self.followups: dict[int, list[Request]] = {}
        seen: set[int] = set()
        for r in self.requests:
            if r.parent_id is not None:
                if r.parent_id not in seen:
                    raise ConfigError(
                        "parent_id", r.parent_id, "must name a request earlier in the workload"
                    )
                self.followups.setdefault(r.parent_id, []).append(r)
            seen.add(r.request_id)
        self.requests.sort(key=lambda r: (r.arrival_time, r.request_id))
        for r in self.requests:  # the clock's view of each arrival, computed once
            try:
                r.arrival_tick = to_ticks(r.arrival_time)
            except ConfigError as err:
                raise ConfigError(
                    f"requests[{r.request_id}].arrival_time", r.arrival_time, err.allowed
                ) from None
        # not yet arrived, in arrival order: the open-loop requests, and released follow-ups
        self.pending = deque(r for r in self.requests if r.parent_id is None)
        self.released: list[tuple[int, int, Request]] = []  # a heap: (tick, id, request)
        self.check_integrity = check_integrity
        self.trace_steps = trace_steps
        # Paged memory's books give a round's categories without building a MemoryUsage
        # (validated, frozen: a cost on every round); traced or checked runs build it.
        kv = scheduler.kv
        self._books = kv.books if isinstance(kv, KVCacheManager) else None
        # Only a policy that promises its decisions change at events alone is fast-forwarded
        # (``Scheduler.decides_at_events``); any other steps every round, correct as it is.
        # A client cap on requests in flight (vllm bench serve's --max-concurrency): a request
        # is handed over only while a slot is free, and its arrival_time becomes its send time
        # (``workloads.client``). The fast path does not know it: step by step.
        self.cap = None if max_concurrency is None else ConcurrencyCap(max_concurrency)
        capped = self.cap is not None
        fast = type(scheduler).decides_at_events and not (reference or trace_steps or capped)
        self.fast_forward = FastForward(self) if fast else None
        self.progress: Callable[[int, int], None] | None = None  # (ended, total)
        # With ``token_times``: request id -> the time each output token was sampled (the end
        # of the step that computed it), for inter-token latencies. Off by default: a run
        # then does no per-token work (the decode cohort writes a member's when it brings
        # the member up to date).
        self.token_times: dict[int, list[float]] | None = {} if token_times else None
        self.ledger = Ledger()  # the clock and every total: their one writer
        self.totals: StepTotals = self.ledger.totals
        self._ended = 0
        self.steps: list[StepRecord] = []

    @property
    def now(self) -> float:
        """The simulated clock (``Ledger.now``)."""
        return self.ledger.now

    def admit_arrivals(self) -> None:
        """Hand the scheduler every request that has arrived by now, in arrival order."""
        pending, released = self.pending, self.released
        now = self.ledger.ticks  # (``Ledger.arrived``)
        if self.cap is None and not released:  # the usual case: open-loop arrivals, in order
            add = self.scheduler.add_request  # (a rejection releases nothing)
            while pending and pending[0].arrival_tick <= now:
                head = pending.popleft()
                if not add(head):
                    self._reject_followups(head)
            return
        while True:
            if self.cap is not None and not self.cap.free:
                return
            if released and released[0][0] <= now:
                head = released[0][2]
                if pending and (pending[0].arrival_tick, pending[0].request_id) < released[0][:2]:
                    head = pending.popleft()
                else:
                    heapq.heappop(released)
            elif pending and pending[0].arrival_tick <= now:
                head = pending.popleft()
            else:
                return
            if self.cap is not None:
                sent = int(self.cap.send(head.arrival_tick))  # (ticks in, ticks out)
                if sent != head.arrival_tick:  # sent later than it arrived
                    head.arrival_tick = sent
                    head.arrival_time = to_seconds(sent)
            if not self.scheduler.add_request(head):
                self._reject_followups(head)
                if self.cap is not None:  # refused at once: its slot is free again
                    self.cap.release(head.arrival_tick)

    @property
    def next_arrival(self) -> int | None:
        """The tick of the next arrival to come (None: none is known yet)."""
        if self.cap is not None and not self.cap.free:  # sent when one in flight ends
            return None
        first = self.pending[0].arrival_tick if self.pending else None
        if self.released and (first is None or self.released[0][0] < first):
            return self.released[0][0]
        return first

    def _release_followups(self, parent: Request) -> None:
        for child in self.followups.pop(parent.request_id, ()):
            child.arrival_tick = self.ledger.ticks + to_ticks(child.think_time, "think_time")
            child.arrival_time = to_seconds(child.arrival_tick)
            heapq.heappush(self.released, (child.arrival_tick, child.request_id, child))

    def _reject_followups(self, parent: Request) -> None:
        for child in self.followups.pop(parent.request_id, ()):
            child.status = RequestStatus.REJECTED
            child.reject_reason = f"its parent request {parent.request_id} was rejected"
            self._reject_followups(child)

    def run(self) -> EngineRun:
        """Run the workload to its end (or a deadlock).

        The cyclic garbage collector is paused for the run: the loop makes no reference cycles
        worth collecting, and with 10^5 live requests each full collection walks them all (about
        15% of a large simulation). Reference counting still frees everything at once; the
        collector's previous state is restored after, even on an error.
        """
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._run()
        finally:
            if was_enabled:
                gc.enable()

    def _run(self) -> EngineRun:
        sched = self.scheduler
        while True:
            self.admit_arrivals()
            arrival = self.next_arrival
            if not sched.has_unfinished():
                if arrival is None:
                    break
                self.ledger.wait_until(arrival)  # idle until the next arrival
                continue
            batch = sched.schedule()
            if batch.is_empty:
                if arrival is not None:
                    self.ledger.wait_until(arrival)
                    continue
                waiting = [c for cs in self.followups.values() for c in cs]
                stuck = sorted(r.request_id for r in [*sched.stuck(), *waiting])
                return EngineRun(
                    self.requests, self.totals, self.ledger.now, True, stuck, self.steps
                )
            finished = self.step(batch)
            if self.fast_forward is not None:
                self.fast_forward.after(batch, finished)
        self._check_conservation()
        return EngineRun(self.requests, self.totals, self.ledger.now, steps=self.steps)

    def step(self, batch: SchedulerOutput) -> bool:
        """Run one iteration; True if a request finished in it."""
        sched = self.scheduler
        result = self.executor.execute(batch)
        kv = sched.kv
        usage = None
        books = self._books
        if books is not None and not (self.check_integrity or self.trace_steps):
            # the categories without a MemoryUsage (paged memory, an untraced run)
            slots = categories(kv.capacity, *books(), sched.has_queued())
            self._account(batch, result.ticks, Span.of_slots, slots)
        else:
            usage = kv.usage(waiting_for_memory=sched.has_queued())
            self._account(batch, result.ticks, Span.of_round, usage)
        finished = self.apply(batch, result.ticks, result.sampled, result.stopped)
        if self.check_integrity:
            assert usage is not None  # (a checked run builds it)
            kv.check_integrity()
            self._check_usage(usage)
        return finished

    def apply(
        self,
        batch: SchedulerOutput,
        duration: int,
        sampled: Mapping[object, int] | None = None,
        stopped: frozenset[int] = frozenset(),
    ) -> bool:
        """An iteration's effects once it ran (and was accounted; ``duration`` in ticks): the
        clock, each request's counters and the tokens it sampled (a real executor's, keyed by
        seq id); finished requests (their output_len reached, or ``stopped``: a real model's
        stop token) free their memory. True if any did."""
        finished = self.advance(batch, duration, sampled, stopped)
        if finished:
            self.finish(finished)
            return True
        return False

    def advance(
        self,
        batch: SchedulerOutput,
        duration: int,
        sampled: Mapping[object, int] | None = None,
        stopped: frozenset[int] = frozenset(),
    ) -> list[Request]:
        """``apply`` but the finishing: returns the requests that finished, in the batch's
        order, for the caller to ``finish`` (the decode cohort, with its members')."""
        ledger = self.ledger
        start = ledger.ticks
        ledger.advance(duration)
        end = start + duration  # (ticks: read as seconds only where a time is set)
        stamp = self.token_times is not None
        finished: list[Request] = []
        for req, new, _ in batch.chunks:
            if req.admitted_time is None:
                req.admitted_time = to_seconds(start)
            computed = req.num_computed_tokens + new
            req.num_computed_tokens = computed
            outputs = req.num_output_tokens
            if computed == req.prompt_len + outputs:  # caught up (``num_tokens``): sample one
                req.num_output_tokens = outputs = outputs + 1
                if stamp:
                    self._stamp(req)
                if sampled is not None:
                    for seq_id in req.seq_ids:
                        req.outputs_of(seq_id).append(sampled[seq_id])
                if req.first_token_time is None:
                    req.first_token_time = to_seconds(end)
                if outputs == req.output_len:
                    finished.append(req)
                elif req.request_id in stopped:
                    req.stop_early()
                    finished.append(req)
        return finished

    def _stamp(self, req: Request) -> None:
        """Record that ``req`` sampled its latest output token now. A group restarted by a
        recompute samples its tokens again: they replace the old ones from the second on (its
        first token was streamed already, as ``first_token_time`` keeps)."""
        assert self.token_times is not None
        times = self.token_times.setdefault(req.request_id, [])
        m = req.num_output_tokens
        if m == 1 and times:
            del times[1:]
        else:
            del times[m - 1 :]
            times.append(self.ledger.now)

    def finish(self, finished: list[Request]) -> None:
        now = to_seconds(self.ledger.ticks)  # (``Ledger.now``)
        sched_finish, cap = self.scheduler.finish, self.cap
        for req in finished:
            for done in sched_finish(req):
                done.finish_time = now
                if done.n > 1:
                    done.complete_samples()
                self._ended += 1
                if cap is not None:
                    cap.release(self.ledger.ticks)
                if self.followups:
                    self._release_followups(done)
        if finished and self.progress is not None:
            self.progress(self._ended, len(self.requests))

    def _account(
        self,
        batch: SchedulerOutput,
        duration: int,
        span: Callable[[int, Any, int, int, int], Span],
        memory: MemoryUsage | tuple[int, int, int, int, int],
    ) -> None:
        """Account one round: ``span`` (``Span.of_round`` or ``of_slots``) of its ``memory``."""
        sched = self.scheduler
        ledger = self.ledger
        saved = sched.kv.blocks_saved_by_sharing
        ledger.add(span(duration, memory, len(sched.running), len(batch.chunks), saved))
        if batch.preempted or batch.swap_out:
            ledger.preempted(batch.preempted, len(batch.swap_out))
        t = ledger.totals
        if self.trace_steps:
            usage = memory
            assert isinstance(usage, MemoryUsage)  # (a traced run builds it)
            self.steps.append(
                StepRecord(
                    index=t.iterations - 1,
                    start_time=self.ledger.now,
                    duration=to_seconds(duration),
                    num_running=len(sched.running),
                    num_waiting=len(sched.waiting),
                    num_swapped=len(sched.swapped),
                    num_batched_tokens=batch.num_tokens,
                    num_batched_seqs=len(batch.chunks),
                    token_states=usage.token_states,
                    reservation=usage.reservation,
                    internal_fragmentation=usage.internal_fragmentation,
                    external_fragmentation=usage.external_fragmentation,
                    free=usage.free,
                )
            )

    def _check_usage(self, usage: MemoryUsage) -> None:
        if not 0.0 <= usage.token_utilization <= 1.0:
            raise IntegrityError(f"token utilization {usage.token_utilization} outside [0, 1]")

    def _check_conservation(self) -> None:
        """Every request ends finished or rejected; none lost or counted twice."""
        ids = [r.request_id for r in self.requests]
        if len(set(ids)) != len(ids):
            raise IntegrityError("a request id appears twice")
        ended = (RequestStatus.FINISHED, RequestStatus.REJECTED)
        open_ = [r.request_id for r in self.requests if r.status not in ended]
        if open_:
            raise IntegrityError(f"requests neither finished nor rejected: {open_[:10]}")

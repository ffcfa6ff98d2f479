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

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from pagedkv.engine.executor import Executor
from pagedkv.engine.fast_forward import FastForward
from pagedkv.engine.metrics import StepRecord, StepTotals
from pagedkv.engine.request import Request, RequestStatus
from pagedkv.engine.scheduler import Scheduler, SchedulerOutput
from pagedkv.errors import IntegrityError
from pagedkv.memory.usage import MemoryUsage
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
    ) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.requests = [Request.from_spec(s) for s in workload]
        self.requests.sort(key=lambda r: (r.arrival_time, r.request_id))
        self.pending = deque(self.requests)  # not yet arrived, in arrival order
        self.check_integrity = check_integrity
        self.trace_steps = trace_steps
        self.fast_forward = FastForward(self) if not (reference or trace_steps) else None
        self.progress: Callable[[int, int], None] | None = None  # (ended, total)
        self.now = 0.0
        self.totals = StepTotals()
        self._ended = 0
        self.steps: list[StepRecord] = []

    def admit_arrivals(self) -> None:
        """Hand the scheduler every request that has arrived by now."""
        pending = self.pending
        while pending and pending[0].arrival_time <= self.now:
            self.scheduler.add_request(pending.popleft())

    @property
    def next_arrival(self) -> float | None:
        return self.pending[0].arrival_time if self.pending else None

    def run(self) -> EngineRun:
        pending = self.pending
        sched = self.scheduler
        while True:
            self.admit_arrivals()
            if not sched.has_unfinished():
                if not pending:
                    break
                self.now = pending[0].arrival_time  # idle until the next arrival
                continue
            batch = sched.schedule()
            if batch.is_empty:
                if pending:
                    self.now = max(self.now, pending[0].arrival_time)
                    continue
                stuck = sorted(r.request_id for r in sched.stuck())
                return EngineRun(self.requests, self.totals, self.now, True, stuck, self.steps)
            finished = self._step(batch)
            if self.fast_forward is not None and not finished:
                self.fast_forward.after(batch)
        self._check_conservation()
        return EngineRun(self.requests, self.totals, self.now, steps=self.steps)

    def _step(self, batch: SchedulerOutput) -> bool:
        """Run one iteration; True if a request finished in it."""
        sched = self.scheduler
        result = self.executor.execute(batch)
        duration, sampled = result.duration, result.sampled
        usage = sched.kv.usage(waiting_for_memory=sched.has_queued())
        self._account(batch, duration, usage)
        start = self.now
        self.now += duration
        finished: list[Request] = []
        for chunk in batch.chunks:
            req = chunk.request
            if req.admitted_time is None:
                req.admitted_time = start
            req.num_computed_tokens += chunk.num_new_tokens
            if req.num_computed_tokens == req.num_tokens:  # caught up: sample one token
                req.num_output_tokens += 1
                if sampled is not None:
                    req.output_token_ids.append(sampled[req.seq_id])
                if req.first_token_time is None:
                    req.first_token_time = self.now
                if req.num_output_tokens == req.output_len:
                    finished.append(req)
        self.finish(finished)
        if self.check_integrity:
            sched.kv.check_integrity()
            self._check_usage(usage)
        return bool(finished)

    def finish(self, finished: list[Request]) -> None:
        for req in finished:
            for done in self.scheduler.finish(req):
                done.finish_time = self.now
                self._ended += 1
        if finished and self.progress is not None:
            self.progress(self._ended, len(self.requests))

    def _account(self, batch: SchedulerOutput, duration: float, usage: MemoryUsage) -> None:
        sched = self.scheduler
        t = self.totals
        t.add(duration, usage, len(sched.running), len(batch.chunks))
        t.preemptions += len(batch.preempted)
        t.swap_outs += sum(r.status is RequestStatus.SWAPPED for r in batch.preempted)
        t.swapped_blocks += len(batch.swap_out)
        if self.trace_steps:
            self.steps.append(
                StepRecord(
                    index=t.iterations - 1,
                    start_time=self.now,
                    duration=duration,
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
        open_ = [r.request_id for r in self.requests if not r.is_finished]
        if open_:
            raise IntegrityError(f"requests neither finished nor rejected: {open_[:10]}")

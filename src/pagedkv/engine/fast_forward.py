"""The fast path's dispatch: after a round, hand the run to the decode cohort where it may go.

After a *pure decode round* (every running request computed exactly one token; nothing was
admitted, preempted, swapped, copied or finished), the next rounds repeat it until an event, so
a policy that decides at events (``Scheduler.decides_at_events``) lets the engine skip them: the
decode cohort (``cohort.py``) runs from here in closed form between events, wherever
``cohort.plain`` holds. Everywhere else, and in a round the cohort does not take on, the engine
steps that round through ``schedule``: correct by construction. ``Engine(reference=True)``
steps every round; the differential tests check that both give the same run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedkv.engine import cohort
from pagedkv.engine.executor import SimExecutor
from pagedkv.engine.scheduler import Scheduler, SchedulerOutput

if TYPE_CHECKING:
    from pagedkv.engine.engine import Engine

_NO_FILL = Scheduler.fill  # a policy that plans no chunked round


class FastForward:
    """Hands an engine's runs of decode rounds to the decode cohort."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        executor = engine.executor
        self.cost = executor.cost_model if isinstance(executor, SimExecutor) else None
        self.windows = 0  # the cohorts' windows (runs of rounds between events) and rounds
        self.rounds = 0
        self.prices: dict[object, int] = {}  # the cohorts' admission rounds, by shape

    def after(self, batch: SchedulerOutput, finished: bool) -> None:
        """Called after every round; runs a cohort if the next rounds are decodes: the round
        just run was a pure decode and finished nobody, or the policy promises the next one
        is (``Scheduler.decodes_next``: then an arrival's admission round needs no decode
        round after it to start one). With chunked prefill a policy that fills chunked
        rounds (``Scheduler.fill``) runs them in a cohort too, whoever prefills."""
        if self.cost is None:
            return
        eng = self.engine
        sched = eng.scheduler
        decodes = not (finished or not self._pure_decode(batch)) or sched.decodes_next()
        if not decodes:
            chunked = sched.config.chunked and type(sched).fill is not _NO_FILL
            if not chunked:
                return
        if not cohort.plain(eng):
            return
        run = cohort.Cohort(eng, self.cost, self.prices)
        if run.run():
            self.windows += run.windows
            self.rounds += run.done

    def _pure_decode(self, batch: SchedulerOutput) -> bool:
        running = self.engine.scheduler.running
        if batch.preempted or batch.swap_in or batch.swap_out or batch.copies:
            return False
        if len(batch.chunks) != len(running) or not running:
            return False
        if self.engine.scheduler.has_groups and any(r.beam is not None for r in running):
            return False  # beam groups fork and free every round: never skipped in bulk
        # A decode computes a generated token (index >= prompt_len); a one-token prompt's
        # prefill also computes one token but is not a decode (policies may act on the first
        # decode round, e.g. static closes its batch).
        return all(
            c.num_new_tokens == 1 and c.num_cached_tokens >= c.request.prompt_len
            for c in batch.chunks
        ) and all(r.num_pending_tokens == 1 for r in running)

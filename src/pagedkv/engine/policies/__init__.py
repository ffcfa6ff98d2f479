"""Scheduling policies, one per file, registered by name (``--scheduler NAME``).

To add a policy: subclass ``pagedkv.engine.scheduler.Scheduler`` in a new file (give it a
``name``, ``make_allocator`` and ``schedule``) and add it to ``SCHEDULERS`` below.
"""

from __future__ import annotations

from pagedkv.engine.policies.contiguous import ContiguousSlots, OrcaMax, OrcaOracle, OrcaPow2
from pagedkv.engine.policies.greedy import GreedyNoPreemptScheduler
from pagedkv.engine.policies.reserve import ReserveScheduler
from pagedkv.engine.policies.static import StaticScheduler
from pagedkv.engine.policies.vllm import VllmScheduler
from pagedkv.engine.scheduler import Scheduler

SCHEDULERS: dict[str, type[Scheduler]] = {
    cls.name: cls
    for cls in (
        VllmScheduler,
        ReserveScheduler,
        OrcaMax,
        OrcaPow2,
        OrcaOracle,
        ContiguousSlots,
        StaticScheduler,
        GreedyNoPreemptScheduler,
    )
}

__all__ = ["SCHEDULERS"]

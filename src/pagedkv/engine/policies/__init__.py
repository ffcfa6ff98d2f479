"""Scheduling policies, one per file, registered by name (``--scheduler NAME``).

To add a policy: subclass ``pagedkv.engine.scheduler.Scheduler`` in a file of your own (give it
a ``name``, ``make_allocator`` and ``schedule``) and decorate it with ``@register_scheduler``;
once that file is imported, ``SchedulerConfig(scheduler=name)`` and ``pagedkv.simulate`` use
it like a built-in one. The built-in policies are listed below.

Such a policy steps every round (the reference loop), which is correct whatever it does. To be
fast-forwarded over runs of identical decode rounds, a policy states
``decides_at_events = True``: a promise that between two events (an arrival, a finish, a
preemption, blocks or region room running short, a copy-on-write) its decisions depend only on
its queues and the memory's state, never on a count of rounds, the clock or state of its own.
Check the promise with the differential test (``tests/engine/test_fast_forward.py`` runs it over
every registered policy): a wrong promise gives wrong results, not an error. A subclass keeps
its parent's promise only if it defines no method other than ``make_allocator``.

What the promise buys depends on what else the policy says. With the promise alone, the
engine skips rounds only while nothing waits or is swapped: after a pure decode round the
decode cohort (``engine/cohort.py``) runs to the next arrival, finish or round short of
blocks, and every round with a request queued steps through ``schedule``. A policy that also
plans its rounds (``Scheduler.plan_round``: the next round's admissions, or a decode of every
running request, read from the queues, the running count and the free blocks alone;
``growth_victim`` and ``resume`` for preemptions and swap-ins; ``fill`` for chunked rounds;
``decodes_next`` to start right after an admission) keeps the cohort running through queues,
preemption episodes and admissions, asked only at events: greedy-nopreempt and vllm show the
two sizes of it (``tests/engine/test_cohort_queue.py`` holds a plan to what ``schedule``
then does).
"""

from __future__ import annotations

from typing import TypeVar

from pagedkv.engine.policies.contiguous import (
    ContiguousSlots,
    FirstFitMax,
    FirstFitOracle,
    FirstFitPow2,
    OrcaMax,
    OrcaOracle,
    OrcaPow2,
)
from pagedkv.engine.policies.greedy import GreedyNoPreemptScheduler
from pagedkv.engine.policies.reserve import ReserveScheduler
from pagedkv.engine.policies.static import StaticScheduler
from pagedkv.engine.policies.vllm import VllmScheduler
from pagedkv.engine.policies.vllm_v1 import VllmV1Scheduler
from pagedkv.engine.scheduler import Scheduler
from pagedkv.errors import ConfigError

SCHEDULERS: dict[str, type[Scheduler]] = {
    cls.name: cls
    for cls in (
        VllmScheduler,
        VllmV1Scheduler,
        ReserveScheduler,
        OrcaMax,
        OrcaPow2,
        OrcaOracle,
        FirstFitMax,
        FirstFitPow2,
        FirstFitOracle,
        ContiguousSlots,
        StaticScheduler,
        GreedyNoPreemptScheduler,
    )
}

S = TypeVar("S", bound=type[Scheduler])


def register_scheduler(cls: S) -> S:
    """Make a policy known by its ``name`` (a class decorator); a name is taken once."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise ConfigError("name", name, "a policy needs a non-empty string name")
    if name in SCHEDULERS and SCHEDULERS[name] is not cls:
        raise ConfigError("name", name, "is taken by " + SCHEDULERS[name].__qualname__)
    SCHEDULERS[name] = cls
    return cls


__all__ = ["SCHEDULERS", "register_scheduler"]

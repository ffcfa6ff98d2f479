"""Policies a user writes by the documented recipe, for the fast-path contract's tests.

None states ``decides_at_events`` except ``PlansNoRound``, which keeps the promise but plans no
round (so the fast path runs it only while nothing waits), and ``WronglyOptedIn``, which
promises it falsely: its admissions depend on a count of rounds, which the fast path does not
see.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pagedkv.engine.config import SchedulerConfig
from pagedkv.engine.policies import SCHEDULERS, register_scheduler
from pagedkv.engine.policies.vllm import VllmScheduler
from pagedkv.engine.scheduler import Scheduler, SchedulerOutput
from pagedkv.memory.config import CacheConfig
from pagedkv.memory.interface import KVAllocator
from pagedkv.memory.manager import KVCacheManager


class EveryEighthRound(Scheduler):
    """Admits new prompts only every 8th round, or when nothing runs (a state of its own: a
    round counter)."""

    name = "test-every-8th-round"

    @classmethod
    def make_allocator(cls, cache: CacheConfig, config: SchedulerConfig) -> KVAllocator:
        return KVCacheManager(cache)

    def __init__(self, config: SchedulerConfig, kv: KVAllocator) -> None:
        super().__init__(config, kv)
        self.rounds = 0

    def schedule(self) -> SchedulerOutput:
        self.rounds += 1
        out = SchedulerOutput()
        if self.rounds % 8 == 1 or not self.running:
            self._admit_waiting(out, self.config.token_budget, chunked=False)
            if out.chunks:
                return out
        self._decode_running(out)
        return out


class CappedAdmissions(VllmScheduler):
    """vllm with at most two requests running: overrides ``schedule`` only, so the promises
    vllm makes (``decides_at_events``, ``decodes_next``) do not pass to it."""

    name = "test-capped-admissions"

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        if len(self.running) < 2 and not self.swapped:
            self._admit_waiting(out, self.config.token_budget, chunked=False)
            if out.chunks:
                return out
        self._decode_running(out)
        return out


class OnlyItsMemory(VllmScheduler):
    """vllm on a differently sized pool: changes nothing but ``make_allocator``, so it keeps
    vllm's promise."""

    name = "test-only-its-memory"

    @classmethod
    def make_allocator(cls, cache: CacheConfig, config: SchedulerConfig) -> KVCacheManager:
        return KVCacheManager(cache)


class PlansNoRound(Scheduler):
    """First-come-first-served on paged memory without preemption (one short of a block
    stalls): its rounds read only its queues and the memory, as it promises, but it plans none
    (no ``plan_round``, ``decodes_next``, ``growth_victim``)."""

    name = "test-plans-no-round"
    decides_at_events = True

    @classmethod
    def make_allocator(cls, cache: CacheConfig, config: SchedulerConfig) -> KVAllocator:
        return KVCacheManager(cache)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        self._admit_waiting(out, self.config.token_budget, chunked=False)
        if not out.chunks:
            self._decode_running(out)
        return out


class WronglyOptedIn(EveryEighthRound):
    """Promises what it does not keep: the differential test must catch it."""

    name = "test-wrongly-opted-in"
    decides_at_events = True


USER_POLICIES: tuple[type[Scheduler], ...] = (
    EveryEighthRound,
    CappedAdmissions,
    OnlyItsMemory,
    PlansNoRound,
)


@contextmanager
def registered(*policies: type[Scheduler]) -> Iterator[None]:
    """``policies`` known by name for the duration (other tests iterate over SCHEDULERS)."""
    for cls in policies:
        register_scheduler(cls)
    try:
        yield
    finally:
        for cls in policies:
            del SCHEDULERS[cls.name]

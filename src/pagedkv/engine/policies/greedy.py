"""``greedy-nopreempt``: the course lesson's own policy, kept so its deadlock can be shown.

Every iteration admits waiting prompts first-come-first-served for as long as their blocks can
be allocated (no watermark, no look-ahead), then advances every running request by one token;
a request that needs a block when none is free stalls, and nothing is ever preempted. Once the
running requests have eaten the pool, none of them can grow and none can finish: a deadlock,
which the engine detects and reports (the lesson's loop instead ran into its step cap, and
let sequences write past their last block).
"""

from __future__ import annotations

import dataclasses

from pagedkv.engine.config import SchedulerConfig
from pagedkv.engine.request import Request
from pagedkv.engine.scheduler import Scheduler, SchedulerOutput
from pagedkv.memory.config import CacheConfig
from pagedkv.memory.manager import KVCacheManager


class GreedyNoPreemptScheduler(Scheduler):
    name = "greedy-nopreempt"
    decides_at_events = True  # tested fast against reference (tests/engine)
    preempts = False

    @classmethod
    def make_allocator(cls, cache: CacheConfig, config: SchedulerConfig) -> KVCacheManager:
        return KVCacheManager(dataclasses.replace(cache, watermark=0.0))

    def _can_admit(self, req: Request, num_tokens: int) -> bool:
        return True  # the lesson tries the allocation itself and stops at the first failure

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        self._admit_waiting(out, self.config.token_budget, chunked=False)
        admitted = {c.request for c in out.chunks}
        self._decode_running(out, [r for r in self.running if r not in admitted])
        return out

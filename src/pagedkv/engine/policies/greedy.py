"""``greedy-nopreempt``: the course lesson's own policy, kept so its deadlock can be shown.

Every iteration admits waiting prompts first-come-first-served for as long as their blocks can
be allocated (no watermark, no look-ahead), then advances every running request by one token;
a request that needs a block when none is free stalls, and nothing is ever preempted. Once the
running requests have eaten the pool, none of them can grow and none can finish: a deadlock,
which the engine detects and reports (the lesson's loop instead ran into its step cap, and
let sequences write past their last block).

For the fast path (``Scheduler.plan_round``): while the waiting head's allocation would fail,
a round admits nobody and decodes every running request; free blocks only shrink until the
next event (a finish), so that holds until then.
"""

from __future__ import annotations

import dataclasses

from pagedkv.engine.config import SchedulerConfig
from pagedkv.engine.request import Request
from pagedkv.engine.scheduler import RoundPlan, Scheduler, SchedulerOutput, keeps_rounds
from pagedkv.memory.config import CacheConfig
from pagedkv.memory.interface import KVAllocator
from pagedkv.memory.manager import KVCacheManager


class GreedyNoPreemptScheduler(Scheduler):
    name = "greedy-nopreempt"
    decides_at_events = True  # tested fast against reference (tests/engine)
    preempts = False

    @classmethod
    def make_allocator(cls, cache: CacheConfig, config: SchedulerConfig) -> KVCacheManager:
        return KVCacheManager(dataclasses.replace(cache, watermark=0.0))

    def __init__(self, config: SchedulerConfig, kv: KVAllocator) -> None:
        super().__init__(config, kv)
        assert isinstance(kv, KVCacheManager), "greedy-nopreempt runs on paged memory"
        self.paged: KVCacheManager = kv
        # Are the rounds this class's ``schedule``, which the promises restate? (A class is
        # fixed: read once.)
        cls = type(self)
        self._mirrored = keeps_rounds(cls, _Greedy, _MIRRORED)

    def _can_admit(self, req: Request, num_tokens: int) -> bool:
        return True  # the lesson tries the allocation itself and stops at the first failure

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        self._admit_waiting(out, self.config.token_budget, chunked=False)
        admitted = {c.request for c in out.chunks}
        self._decode_running(out, [r for r in self.running if r not in admitted])
        return out

    def decodes_next(self) -> bool:
        """No group runs (they fork), the waiting head would not be admitted
        (``_admits_head``), and every running request has exactly its next token to compute:
        the round decodes every running request (one short of a block stalls, a round the
        fast path does not run)."""
        if self.has_groups or not self.running or not self._mirrored:
            return False
        if self.waiting and self._admits_head():
            return False
        for r in self.running:
            computed = r.num_computed_tokens
            if r.prompt_len + r.num_output_tokens - computed != 1 or computed < r.prompt_len:
                return False
        return True

    def plan_round(self) -> RoundPlan | None:
        """While the waiting head's allocation would fail (``_admits_head``), ``schedule``
        admits nobody and decodes every running request; otherwise (or with beams) no plan.
        Its test reads the running count, the head and the free blocks, no running request."""
        if self.has_beams or not self._mirrored:
            return None
        if self.waiting and self._admits_head():
            return None
        return RoundPlan(SchedulerOutput(), True)

    def _admits_head(self) -> bool:
        """Would ``_admit_waiting`` take the waiting head now? Its first iteration's tests,
        the allocation's as ``KVCacheManager.allocate`` makes it (blocks for the pending
        tokens against the free ones); True where unsure (ids a prefix may hit), which only
        costs a stepped round."""
        if len(self.running) >= self.config.max_num_seqs:
            return False
        head = self.waiting[0]
        n = head.num_pending_tokens
        if n <= 0 or n > self.config.token_budget:
            return False
        if self.paged.reads_token_ids and head.known_token_ids is not None:
            return True
        return self.paged.blocks_for(n) <= self.paged.num_free_blocks


_Greedy = GreedyNoPreemptScheduler
# What ``decodes_next`` and ``plan_round`` restate of a round.
_MIRRORED = ("schedule", "_admit_waiting", "_can_admit", "_decode_running", "_append")

"""``reserve``: no-thrash admission on paged memory (the seed simulator's reservation-based
scheduler). A request is admitted only when the free blocks cover its whole final length on
top of what every running request may still grow into, so growth always finds a block and
nothing is ever preempted. Paging still saves the contiguous baselines' fragmentation; what it
gives up is the optimism that lets vllm run more requests at once.
"""

from __future__ import annotations

from pagedkv.engine.policies.vllm import VllmScheduler
from pagedkv.engine.request import Request


class ReserveScheduler(VllmScheduler):
    name = "reserve"
    preempts = False

    def _can_admit(self, req: Request, num_tokens: int) -> bool:
        kv = self.paged
        owed = sum(
            kv.blocks_for(r.max_kv_tokens) - len(kv.block_ids(r.seq_id)) for r in self.running
        )
        return kv.num_free_blocks - owed >= kv.blocks_for(req.max_kv_tokens)

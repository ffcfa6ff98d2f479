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
    decides_at_events = True  # tested fast against reference (tests/engine)
    preempts = False

    def _can_admit(self, req: Request, num_tokens: int) -> bool:
        kv = self.paged
        owed = sum(self._owed(r) for r in self.running)
        return kv.num_free_blocks - owed >= self._owed(req)

    def _owed(self, r: Request) -> int:
        """Blocks the request may still take: each sequence's full length less what it holds;
        a sample not forked yet will share the prompt's full blocks (and copy the last
        partial one, which its own count of blocks already includes)."""
        kv = self.paged
        full = kv.blocks_for(r.max_kv_tokens)
        if r.beam is not None:
            # Beams fork and die every step, so who shares what is unknown ahead; but no beam
            # ever holds more than ``full`` blocks, so the group never holds more than
            # n * full distinct blocks (forks and frees keep free - owed unchanged).
            if not kv.has_seq(r.seq_id):
                return r.n * full
            return r.n * full - len({b for s in r.seq_ids for b in kv.block_ids(s)})
        held = [len(kv.block_ids(s)) for s in r.seq_ids] if kv.has_seq(r.seq_id) else [0]
        unforked = r.n - len(r.seq_ids)
        return sum(full - h for h in held) + unforked * (full - r.prompt_len // kv.block_size)

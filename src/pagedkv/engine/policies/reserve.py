"""``reserve``: no-thrash admission on paged memory (the seed simulator's reservation-based
scheduler). A request is admitted only when the free blocks cover its whole final length on
top of what every running request may still grow into, so growth always finds a block and
nothing is ever preempted. Paging still saves the contiguous baselines' fragmentation; what it
gives up is the optimism that lets vllm run more requests at once.

What the running requests still owe is an aggregate, O(1) per admission (plus one term per
running group), not a sum over every running request:

    owed = sum over single-sequence requests r of (full_r - held_r) + sum over groups of owed(g)
         = F - (H - H_groups) + sum over groups of owed(g)

where full_r is the blocks of r's final length, held_r the blocks its table holds, F the sum of
full_r (this policy's one book, written when a request starts and stops running), H every
block reference of every sequence's table (the manager's: all its GPU sequences are running
ones, since this policy never preempts or swaps) and H_groups the groups' part of it. A group
of parallel samples adds H_g + owed(g) = s_g full_g + (n_g - s_g)(full_g - shared_g) (s_g of its
n_g sequences forked, shared_g the prompt's full blocks): what each sequence holds cancels, so no
table is read and a decode cohort may run it. A beam group forks and frees as it goes, so its
term reads its tables; ``owed_sum`` is the direct sum, which the tests check the aggregate
against at every admission.
"""

from __future__ import annotations

from pagedkv.engine.config import SchedulerConfig
from pagedkv.engine.policies.vllm import VllmScheduler
from pagedkv.engine.request import Request
from pagedkv.engine.scheduler import SchedulerOutput
from pagedkv.memory.interface import KVAllocator


class ReserveScheduler(VllmScheduler):
    name = "reserve"
    decides_at_events = True  # tested fast against reference (tests/engine)
    preempts = False

    def __init__(self, config: SchedulerConfig, kv: KVAllocator) -> None:
        super().__init__(config, kv)
        self._full_single = 0  # F: the final blocks of every running single-sequence request
        self._full_of: dict[Request, int] = {}  # what each added to F (taken off as it was)
        self._groups: list[Request] = []  # the running groups, in no particular order

    def _can_admit(self, req: Request, num_tokens: int) -> bool:
        return self.paged.num_free_blocks - self.owed_blocks() >= self._owed(req)

    # Its test reads aggregates of the books and each group's counts of sequences, no running
    # request's table (a beam group's, which ``plan_round`` refuses, aside): a decode cohort
    # may run it.
    books_admission = _can_admit
    books_admission_groups = True

    def owed_blocks(self) -> int:
        """Blocks the running requests may still take: the aggregate (module docstring)."""
        kv = self.paged
        # Every table's block references: the used blocks plus the references sharing saves
        # (pinned prefixes' references are neither).
        refs = kv.blocks_saved_by_sharing + kv.capacity // kv.block_size - kv.num_free_blocks
        owed = self._full_single - refs
        for g in self._groups:
            if g.beam is None and kv.has_seq(g.seq_id):
                # its tables' references plus ``_owed(g)``: what each sequence holds cancels
                full = kv.blocks_for(g.max_kv_tokens)
                unforked = g.n - len(g.seq_ids)
                owed += len(g.seq_ids) * full + unforked * (full - g.prompt_len // kv.block_size)
                continue
            if kv.has_seq(g.seq_id):
                owed += sum(len(kv.block_ids(s)) for s in g.seq_ids)
            owed += self._owed(g)
        return owed

    def owed_sum(self) -> int:
        """The same, summed over every running request (what the aggregate must equal)."""
        return sum(self._owed(r) for r in self.running)

    def _start_running(self, req: Request) -> None:
        super()._start_running(req)
        if req.n > 1:
            self._groups.append(req)
        else:
            full = self.paged.blocks_for(req.max_kv_tokens)
            self._full_of[req] = full
            self._full_single += full

    def _stop_running(self, req: Request) -> None:
        if req.n > 1:
            self._groups.remove(req)
        else:
            self._full_single -= self._full_of.pop(req)

    def finish(self, req: Request) -> list[Request]:
        done = super().finish(req)
        self._stop_running(req)
        return done

    def _preempt(self, victim: Request, out: SchedulerOutput) -> None:
        self._stop_running(victim)  # (never called: this policy does not preempt)
        super()._preempt(victim, out)

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

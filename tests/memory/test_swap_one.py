"""A swap of one sequence takes a shortcut (``SwapMixin._swap_out_one``, ``_swap_in_one``, and
for a growing one ``_swap_out_grower``, which never settles it); it must leave the manager
exactly as the group path does after a settle: the same mappings, the same block ids in every
table and in both free queues, the same books. Differential, stateful: two
managers take the same calls, one of them always through the group path."""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedkv.memory.interface import SeqId, SwapMapping
from pagedkv.memory.manager import KVCacheManager
from tests.factories import BLOCK_SIZES, make_manager


class GroupPathManager(KVCacheManager):
    """Every swap through the group path."""

    def _swap_out_one(self, seq_id: SeqId) -> list[SwapMapping] | None:
        return self._swap_out_group([seq_id])

    def _swap_out_grower(self, seq_id: SeqId) -> list[SwapMapping] | None:
        self._settle((seq_id,))
        return self._swap_out_group([seq_id])

    def _swap_in_one(self, seq_id: SeqId) -> list[SwapMapping]:
        return self._swap_in_group([seq_id])


class SwapOneMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.fast: KVCacheManager = make_manager()
        self.slow: KVCacheManager = make_manager()
        self.live: set[int] = set()
        self.next_id = 0

    @initialize(
        bs=st.sampled_from(BLOCK_SIZES),
        gpu=st.integers(2, 24),
        cpu=st.integers(0, 32),
        caching=st.booleans(),
        prompts=st.lists(st.integers(0, 40), max_size=4),
    )
    def setup(self, bs: int, gpu: int, cpu: int, caching: bool, prompts: list[int]) -> None:
        self.fast = make_manager(bs, gpu, num_cpu_blocks=cpu, prefix_caching=caching)
        self.slow = GroupPathManager(self.fast.config)
        for prompt in prompts:
            self.allocate(prompt, keyed=False, final=None)

    def both(self, method: str, *args: Any, **kwargs: Any) -> Any:
        got = getattr(self.fast, method)(*args, **kwargs)
        assert getattr(self.slow, method)(*args, **kwargs) == got
        return got

    @rule(prompt=st.integers(0, 40), keyed=st.booleans(), final=st.none() | st.integers(0, 30))
    def allocate(self, prompt: int, keyed: bool, final: int | None) -> None:
        self.next_id += 1
        seq = self.next_id
        ids = [k % 5 for k in range(prompt)] if keyed else None  # (equal prefixes share)
        final_len = None if final is None else prompt + final
        got = self.both("allocate", seq, prompt, token_ids=ids, final_len=final_len)
        if got is not None:
            self.live.add(seq)

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data(), n=st.integers(1, 20))
    def append(self, data: st.DataObject, n: int) -> None:
        seq = data.draw(st.sampled_from(sorted(self.live)))
        if self.fast.has_seq(seq):
            self.both("append_slots", seq, n)

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        parent = data.draw(st.sampled_from(sorted(self.live)))
        if self.fast.has_seq(parent):
            self.next_id += 1
            self.both("fork", parent, self.next_id)
            self.live.add(self.next_id)

    @rule(k=st.integers(0, 20))
    def grow(self, k: int) -> None:
        """Sequences that may grow in closed form do (a swap-out settles its own first)."""
        for m in (self.fast, self.slow):
            private = [s for s in sorted(self.live) if m.has_seq(s) and _may_grow(m, s)]
            m.grow(private)
        self.both("advance_rounds", k, upto=True)

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def swap_out(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.live)))
        if self.fast.has_seq(seq):
            self.both("swap_out", [seq])

    @precondition(lambda self: bool(self.fast._growth.seqs))
    @rule(data=st.data(), k=st.integers(0, 20))
    def swap_out_grower(self, data: st.DataObject, k: int) -> None:
        """A growing sequence's swap-out settles it alone first."""
        self.both("advance_rounds", k, upto=True)
        seq = data.draw(st.sampled_from(sorted(self.fast._growth.seqs, key=str)))
        self.both("swap_out", [seq])

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data(), step=st.integers(0, 3))
    def swap_in(self, data: st.DataObject, step: int) -> None:
        seq = data.draw(st.sampled_from(sorted(self.live)))
        if self.fast.is_swapped(seq):
            self.both("can_swap_in", [seq], step)
            self.both("swap_in", [seq])

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.live)))
        self.both("free", seq)
        self.live.remove(seq)

    @invariant()
    def same_books(self) -> None:
        fast, slow = self.fast, self.slow
        assert fast.books() == slow.books()
        assert fast.stats == slow.stats
        assert fast.gpu.free_blocks() == slow.gpu.free_blocks()
        assert fast.cpu.free_blocks() == slow.cpu.free_blocks()
        assert _tables(fast) == _tables(slow)  # (read without settling growth)
        assert fast._growth.seqs == slow._growth.seqs
        fast.check_integrity()
        slow.check_integrity()


def _tables(m: KVCacheManager) -> list[dict[SeqId, tuple[list[int], int]]]:
    return [{s: (t.blocks, t.num_tokens) for s, t in ts.items()} for ts in (m._tables, m._swapped)]


def _may_grow(m: KVCacheManager, seq: SeqId) -> bool:
    """``grow``'s condition (ids unknown, the last block held alone), of a sequence without
    a final length (so that any number of rounds keeps it within)."""
    table = m._tables[seq]
    if table.final_len is not None or table.tokens_known:
        return False
    return not table.blocks or m.gpu.ref_counts[table.blocks[-1]] == 1


TestSwapOne = SwapOneMachine.TestCase
TestSwapOne.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)

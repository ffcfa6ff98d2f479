"""Growth in the books: a manager whose decoding sequences grow in closed form (``grow``,
``advance_rounds``) says at every moment what one that appends every token says.

Stateful: two managers over the same pool see the same allocations and frees; in one the
growing sequences advance k rounds at once, in the other each appends one token per round.
After every rule both give the same free blocks and categories, both pass
``check_integrity()``, and the window sums (blocks taken, their moments, last blocks) are
those of the rounds the eager one ran.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedkv.errors import IntegrityError, PagedKVError
from pagedkv.memory.manager import KVCacheManager
from tests.factories import BLOCK_SIZES, make_manager


class GrowthMachine(RuleBasedStateMachine):
    lazy: KVCacheManager
    eager: KVCacheManager

    @initialize(
        block_size=st.sampled_from(BLOCK_SIZES),
        blocks=st.integers(4, 80),
        swap=st.booleans(),
    )
    def setup(self, block_size: int, blocks: int, swap: bool) -> None:
        cpu = blocks if swap else 0
        self.lazy = make_manager(block_size, blocks, num_cpu_blocks=cpu)
        self.eager = make_manager(block_size, blocks, num_cpu_blocks=cpu)
        self.bs = block_size
        self.tokens: dict[int, int] = {}  # every sequence's tokens now
        self.final: dict[int, int] = {}
        self.growing: list[int] = []  # in the order they joined (the eager appends so)
        self.next_id = 0

    def _free_seqs(self) -> list[int]:
        return [s for s in self.tokens if s not in self.growing]

    @rule(tokens=st.integers(0, 90), extra=st.integers(0, 120))
    def allocate(self, tokens: int, extra: int) -> None:
        seq = self.next_id
        self.next_id += 1
        final = tokens + extra
        a = self.lazy.can_allocate(seq, tokens, final_len=final)
        assert a == self.eager.can_allocate(seq, tokens, final_len=final)
        got = self.lazy.allocate(seq, tokens, final_len=final)
        assert got == self.eager.allocate(seq, tokens, final_len=final)
        if got is not None:
            self.tokens[seq] = tokens
            self.final[seq] = final

    @rule(data=st.data())
    def grow(self, data: st.DataObject) -> None:
        idle = [s for s in self._free_seqs() if self.tokens[s] < self.final[s]]
        if not idle:
            return
        picked = data.draw(st.lists(st.sampled_from(idle), unique=True, min_size=1))
        self.lazy.grow(picked)
        self.growing += picked

    @precondition(lambda self: bool(self.growing))
    @rule(data=st.data(), upto=st.booleans(), rounds=st.booleans())
    def advance(self, data: st.DataObject, upto: bool, rounds: bool) -> None:
        to_end = min(self.final[s] - self.tokens[s] for s in self.growing)
        fit = self.lazy.rounds_that_fit()
        assert self.lazy.next_round_fits() == (fit != 0)
        u0 = self.eager.usage()
        blocks_before = self.eager.num_free_blocks
        if upto:  # as many rounds as fit, of those asked for
            asked = data.draw(st.integers(0, to_end))
            window = self.lazy.advance_rounds(asked, rounds=rounds, upto=True)
            assert window.k == (asked if fit is None else min(asked, fit))
        else:
            k = data.draw(st.integers(0, to_end if fit is None else min(to_end, fit)))
            window = self.lazy.advance_rounds(k, rounds=rounds)
            assert window.k == k
        k = window.k
        taken: list[int] = []  # blocks the eager one takes in each round
        internal: list[int] = []
        for _ in range(k):
            free = self.eager.num_free_blocks
            for s in self.growing:
                assert self.eager.append_slots(s, 1) is not None
                self.tokens[s] += 1
            taken.append(free - self.eager.num_free_blocks)
            internal.append(self.eager.usage().internal_fragmentation)
        listed = window.rounds
        assert window.blocks == sum(taken) == blocks_before - self.eager.num_free_blocks
        assert window.s1 == sum(x * w for x, w in enumerate(taken))
        assert window.s2 == sum(x * x * w for x, w in enumerate(taken))
        if listed is not None:
            assert listed == [x + 1 for x, w in enumerate(taken) for _ in range(w)]
        for x in range(k):  # internal fragmentation after round x: the last blocks so far
            frag = sum(f for y, f in window.lasts if y <= x)
            assert internal[x] == u0.internal_fragmentation + frag

    @precondition(lambda self: len(self.tokens) > 0)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        self.lazy.free(seq)
        self.eager.free(seq)
        del self.tokens[seq], self.final[seq]
        if seq in self.growing:
            self.growing.remove(seq)

    @precondition(lambda self: len(self.tokens) > 0)
    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        """A read of the blocks settles every grower: its table then holds what it gained."""
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        assert len(self.lazy.block_ids(seq)) == len(self.eager.block_ids(seq))
        for s, n in self.tokens.items():
            assert self.lazy.num_tokens(s) == n == self.eager.num_tokens(s)
        self.growing = []

    @precondition(lambda self: bool(self._free_seqs()) and self.lazy.cpu.num_blocks > 0)
    @rule(data=st.data())
    def swap_round_trip(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(self._free_seqs()))
        out = self.lazy.swap_out([seq])  # a swap reads its own blocks: growers go on
        assert (out is None) == (self.eager.swap_out([seq]) is None)
        assert all(self.lazy.is_growing(s) for s in self.growing)
        if out is not None:
            assert (self.lazy.swap_in([seq]) is None) == (self.eager.swap_in([seq]) is None)
            if not self.lazy.is_swapped(seq):
                return
            self.lazy.free(seq)
            self.eager.free(seq)
            del self.tokens[seq], self.final[seq]

    @precondition(lambda self: bool(self.growing))
    @rule(data=st.data(), swap=st.booleans())
    def read_one_grower(self, data: st.DataObject, swap: bool) -> None:
        """A swap-out of a growing sequence, or an append to it, settles it alone: it stops
        growing, the others go on."""
        seq = data.draw(st.sampled_from(self.growing))
        if swap and self.lazy.cpu.num_blocks > 0:
            out = self.lazy.swap_out([seq])
            assert (out is None) == (self.eager.swap_out([seq]) is None)
            if out is not None:
                self.lazy.free(seq)
                self.eager.free(seq)
                del self.tokens[seq], self.final[seq]
        elif self.tokens[seq] < self.final[seq]:
            got = self.lazy.append_slots(seq, 1)
            assert (got is None) == (self.eager.append_slots(seq, 1) is None)
            if got is not None:
                self.tokens[seq] += 1
        else:
            return
        self.growing.remove(seq)
        assert not self.lazy.is_growing(seq)
        assert all(self.lazy.is_growing(s) for s in self.growing)

    @invariant()
    def same_books(self) -> None:
        if not hasattr(self, "lazy"):
            return
        assert self.lazy.usage() == self.eager.usage()
        assert self.lazy.books() == self.eager.books()
        assert self.lazy.num_free_blocks == self.eager.num_free_blocks
        assert self.lazy.stats.num_free_blocks == self.eager.stats.num_free_blocks
        self.lazy.check_integrity()
        self.eager.check_integrity()


GrowthMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_growth_equals_appending_every_token = GrowthMachine.TestCase


def test_growth_refuses_more_blocks_than_are_free() -> None:
    kv = make_manager(16, 4)
    kv.allocate("a", 16, final_len=20)
    kv.grow(["a"])
    kv.advance_rounds(4)
    kv.allocate("b", 32, final_len=80)
    kv.grow(["b"])
    assert kv.num_free_blocks == 0
    assert kv.rounds_that_fit() == 0
    with pytest.raises(PagedKVError):
        kv.advance_rounds(1)  # b's next block has no room
    kv.check_integrity()


def test_a_shared_sequence_cannot_grow_in_closed_form() -> None:
    kv = make_manager(16, 8)
    kv.allocate("p", 20, final_len=40)
    kv.fork("p", "c")
    with pytest.raises(PagedKVError):
        kv.grow(["c"])  # its partial last block is shared: the next token copies it


def test_a_sequence_grown_past_its_final_length_fails_the_integrity_check() -> None:
    kv = make_manager(16, 4)
    kv.allocate("a", 16, final_len=20)
    kv.grow(["a"])
    kv.advance_rounds(5)  # one round more than its final length allows: the caller's error
    with pytest.raises(IntegrityError, match="final length"):
        kv.check_integrity()

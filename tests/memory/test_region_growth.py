"""Growth in the books of contiguous memory: an allocator whose decoding sequences grow inside
their regions in closed form (``grow``, ``advance_rounds``) says at every moment what one that
appends every token says.

Stateful: two allocators over the same address space see the same allocations, forks and frees;
in one the growing sequences advance k rounds at once, in the other each appends one token per
round. After every rule both give the same books and usage (allocator rounding included), the
same holes, and both pass ``check_integrity()``; ``rounds_that_fit`` is the first round a
growing region would pass full.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedkv.errors import IntegrityError, PagedKVError
from pagedkv.memory.config import ContiguousConfig, Placement, Reservation
from pagedkv.memory.contiguous import ContiguousAllocator
from tests.factories import CONTIGUOUS_VARIANTS


class RegionGrowthMachine(RuleBasedStateMachine):
    lazy: ContiguousAllocator
    eager: ContiguousAllocator

    @initialize(
        variant=st.sampled_from(CONTIGUOUS_VARIANTS),
        capacity=st.integers(16, 600),
        data=st.data(),
    )
    def setup(
        self, variant: tuple[Placement, Reservation], capacity: int, data: st.DataObject
    ) -> None:
        placement, reservation = variant
        mml = data.draw(st.integers(8, capacity), label="max_model_len")
        config = ContiguousConfig(
            capacity=capacity,
            max_model_len=mml,
            placement=placement,
            reservation=reservation,
            block_size=1,
        )
        self.lazy = ContiguousAllocator(config)
        self.eager = ContiguousAllocator(config)
        self.mml = mml
        self.tokens: dict[int, int] = {}  # every sequence's tokens now
        self.growing: list[int] = []  # in the order they joined (the eager appends so)
        self.next_id = 0

    def _idle(self) -> list[int]:
        return [s for s in self.tokens if s not in self.growing]

    @rule(data=st.data())
    def allocate(self, data: st.DataObject) -> None:
        tokens = data.draw(st.integers(0, self.mml))
        final: int | None = data.draw(st.integers(max(tokens, 1), self.mml) | st.none())
        if final is None and self.lazy.config.reservation in (Reservation.POW2, Reservation.ORACLE):
            final = max(tokens, 1)
        seq = self.next_id
        self.next_id += 1
        got = self.lazy.allocate(seq, tokens, final_len=final)
        assert got == self.eager.allocate(seq, tokens, final_len=final)
        if got is not None:
            self.tokens[seq] = tokens

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data())
    def grow(self, data: st.DataObject) -> None:
        idle = self._idle()
        if not idle:
            return
        picked = data.draw(st.lists(st.sampled_from(idle), unique=True, min_size=1))
        self.lazy.grow(picked)
        self.lazy.grow(picked[:1])  # growing ones go on as they were
        self.growing += picked

    @precondition(lambda self: bool(self.growing))
    @rule(data=st.data(), upto=st.booleans(), rounds=st.booleans())
    def advance(self, data: st.DataObject, upto: bool, rounds: bool) -> None:
        # The eager one's room within each final length: what the closed form may grow into.
        caps = [self._cap(s) for s in self.growing]
        fit = self.lazy.rounds_that_fit(spare=data.draw(st.integers(0, 3)))
        assert fit == min(caps)
        assert self.lazy.next_round_fits() == (fit != 0)
        if upto:
            asked = data.draw(st.integers(0, fit + 3))
            window = self.lazy.advance_rounds(asked, rounds=rounds, upto=True)
            assert window.k == min(asked, fit)
        else:
            k = data.draw(st.integers(0, fit))
            window = self.lazy.advance_rounds(k, rounds=rounds)
            assert window.k == k
        assert (window.blocks, window.s1, window.s2, window.lasts) == (0, 0, 0, [])
        assert window.rounds == ([] if rounds else None)
        for _ in range(window.k):
            for s in self.growing:
                assert self.eager.append_slots(s, 1) == []
                self.tokens[s] += 1

    def _cap(self, seq: int) -> int:
        """Tokens ``seq`` may still gain without passing its region or its final length."""
        _, reservation, _ = self.eager.region_books(seq)
        return min(reservation, self.eager.room(seq))

    @precondition(lambda self: bool(self.growing))
    @rule()
    def past_full(self) -> None:
        fit = self.lazy.rounds_that_fit()
        assert fit is not None
        with pytest.raises(PagedKVError):
            self.lazy.advance_rounds(fit + 1)  # changes nothing

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        self.lazy.free(seq)
        self.eager.free(seq)
        del self.tokens[seq]
        if seq in self.growing:
            self.growing.remove(seq)

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data(), how=st.sampled_from(["num_tokens", "room", "append", "fork", "region"]))
    def read(self, data: st.DataObject, how: str) -> None:
        """A read of one sequence settles it alone: it stops growing, the others go on."""
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        if how == "num_tokens":
            assert self.lazy.num_tokens(seq) == self.tokens[seq] == self.eager.num_tokens(seq)
        elif how == "room":
            assert self.lazy.rooms([seq]) == self.eager.rooms([seq])
        elif how == "region":
            assert self.lazy.region_books(seq) == self.eager.region_books(seq)
        elif how == "append":
            n = data.draw(st.integers(0, 3))
            got = self.lazy.append_slots(seq, n)
            assert got == self.eager.append_slots(seq, n)
            if got is not None:
                self.tokens[seq] += n
        else:
            child = self.next_id
            self.next_id += 1
            got = self.lazy.fork(seq, child)
            assert got == self.eager.fork(seq, child)
            if got is not None:
                self.tokens[child] = self.tokens[seq]
        if seq in self.growing:
            self.growing.remove(seq)
        assert not self.lazy.is_growing(seq)
        assert all(self.lazy.is_growing(s) for s in self.growing)

    @invariant()
    def same_books(self) -> None:
        if not hasattr(self, "lazy"):
            return
        self.lazy.check_integrity()
        self.eager.check_integrity()
        assert self.lazy.books() == self.eager.books()
        assert self.lazy.usage(True) == self.eager.usage(True)
        assert self.lazy.usage() == self.eager.usage()
        assert self.lazy.allocator_rounding == self.eager.allocator_rounding
        assert self.lazy.space.holes() == self.eager.space.holes()
        assert self.lazy.seq_ids() == self.eager.seq_ids()


RegionGrowthMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None
)
test_region_growth_equals_appending_every_token = RegionGrowthMachine.TestCase


def test_a_region_grown_past_full_fails_the_integrity_check() -> None:
    """The caller stops a grower at its final length; the books say when one passed it."""
    config = ContiguousConfig(
        capacity=64,
        max_model_len=64,
        placement=Placement.FIRST_FIT,
        reservation=Reservation.ORACLE,
        block_size=1,
    )
    kv = ContiguousAllocator(config)
    kv.allocate("a", 10, final_len=12)
    kv.grow(["a"])
    assert kv.rounds_that_fit() == 2
    kv.advance_rounds(2)
    kv.check_integrity()
    kv._growth.round += 1  # (what a caller that forgot the finish would make of it)
    with pytest.raises(IntegrityError):
        kv.check_integrity()

"""Random walks over every contiguous variant, checked against a simple model after each step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import numpy as np
import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from pagedkv.errors import ConfigError, UnknownSequenceError
from pagedkv.memory.config import ContiguousConfig, Placement, Reservation
from pagedkv.memory.contiguous import ContiguousAllocator
from pagedkv.memory.interface import AllocStatus, SlotCopy
from tests.factories import CONTIGUOUS_VARIANTS as COMBOS

BAD_CALLS = [
    "allocate: bad count",
    "allocate: bad final_len",
    "allocate: final_len below num_tokens",
    "allocate: longer than max_model_len",
    "allocate: an id already held",
    "append: bad count",
    "append: past the region",
    "append: unknown",
    "append_all: one unknown",
    "fork: child already held",
    "fork: unknown parent",
    "fork: bad final_len",
    "free: unknown",
]
SETTINGS = settings(max_examples=200, stateful_step_count=30, deadline=None)


def next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


@dataclass
class Seq:
    tokens: int
    final: int
    held: int
    prompt: int  # tokens at admission ('pow2' reserves prompt + pow2(output); forks inherit)
    reserved: int  # R, the slots asked for (held >= R: the placement may round it up)


class ContiguousMachine(RuleBasedStateMachine):
    placement: ClassVar[Placement]  # set by a subclass per combination
    reservation: ClassVar[Reservation]

    def __init__(self) -> None:
        super().__init__()
        self.model: dict[int, Seq] = {}
        self.next_id = 0

    @initialize(
        block_size=st.sampled_from([1, 16, 7]), num_blocks=st.integers(2, 24), data=st.data()
    )
    def setup(self, block_size: int, num_blocks: int, data: st.DataObject) -> None:
        capacity = num_blocks * block_size
        mml = data.draw(st.integers(block_size, capacity), label="max_model_len")
        self.config = ContiguousConfig(
            capacity=capacity,
            max_model_len=mml,
            placement=self.placement,
            reservation=self.reservation,
            block_size=block_size,
        )
        self.alloc = ContiguousAllocator(self.config)

    # ---------------------------------------------------------------- the model's rules
    def reserved(self, final: int | None, tokens: int) -> int:
        mml = self.config.max_model_len
        if final is None or self.reservation in (Reservation.MAX, Reservation.SLOTS):
            return mml
        if self.reservation is Reservation.POW2:  # prompt + next power of two of the output
            out = final - tokens
            return min(tokens + (next_pow2(out) if out > 0 else 0), mml)
        return final

    def held(self, reserved: int) -> int:
        if self.reservation is Reservation.SLOTS:
            return self.config.max_model_len
        return next_pow2(reserved) if self.placement is Placement.BUDDY else reserved

    def expected_status(
        self, tokens: int, final: int | None, prompt: int | None = None
    ) -> AllocStatus:
        c, mml = self.config.capacity, self.config.max_model_len
        if tokens > mml or (final is not None and final > mml):
            return AllocStatus.NEVER
        need = self.held(self.reserved(final, tokens if prompt is None else prompt))
        if self.placement is Placement.BUDDY and need > 1 << (c.bit_length() - 1):
            return AllocStatus.NEVER  # larger than the largest arena
        # Holes are the free runs (first fit), free blocks (buddy) or free slots (slots).
        fits = any(size >= need for _, size in self.alloc.space.holes())
        return AllocStatus.OK if fits else AllocStatus.LATER

    def draw_lengths(self, data: st.DataObject) -> tuple[int, int | None]:
        mml = self.config.max_model_len
        prompt = data.draw(st.integers(0, mml + 1), label="prompt")
        final: st.SearchStrategy[int | None] = st.integers(max(prompt, 1), mml + 2)
        if self.reservation in (Reservation.MAX, Reservation.SLOTS):
            final = st.none() | final
        return prompt, data.draw(final, label="final_len")

    def draw_seq(self, data: st.DataObject) -> int:
        return data.draw(st.sampled_from(sorted(self.model)), label="seq")

    # ------------------------------------------------------------------------- rules
    @rule(data=st.data())
    def allocate(self, data: st.DataObject) -> None:
        prompt, final = self.draw_lengths(data)
        sid, self.next_id = self.next_id, self.next_id + 1
        status = self.alloc.can_allocate(sid, prompt, final_len=final)
        event(f"allocate: {status.value}")
        assert status is self.expected_status(prompt, final)
        fresh = ContiguousAllocator(self.config).can_allocate(sid, prompt, final_len=final)
        assert (status is AllocStatus.NEVER) == (fresh is AllocStatus.NEVER)
        before = self.alloc.usage()
        got = self.alloc.allocate(sid, prompt, final_len=final)
        if status is AllocStatus.OK:
            assert got == 0
            reserved = self.reserved(final, prompt)
            mml = self.config.max_model_len
            self.model[sid] = Seq(
                prompt, mml if final is None else final, self.held(reserved), prompt, reserved
            )
        else:
            assert got is None
            assert self.alloc.usage() == before
            assert not self.alloc.has_seq(sid)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def append(self, data: st.DataObject) -> None:
        sid = self.draw_seq(data)
        m = self.model[sid]
        limit = min(m.held, self.config.max_model_len)
        n = data.draw(st.integers(0, limit - m.tokens + 2), label="num_tokens")
        before = self.alloc.usage()
        got = self.alloc.append_slots(sid, n)
        event(f"append: {'fits' if m.tokens + n <= limit else 'refused'}")
        if m.tokens + n <= limit:
            assert got == []
            m.tokens += n
            m.final = max(m.final, m.tokens)
        else:
            assert got is None
            assert self.alloc.usage() == before

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def append_all(self, data: st.DataObject) -> None:
        """Every sequence at once (the fast path's call): as one append each, when all fit."""
        seqs = data.draw(st.lists(st.sampled_from(sorted(self.model)), unique=True), label="seqs")
        mml = self.config.max_model_len
        room = min((min(self.model[s].held, mml) - self.model[s].tokens for s in seqs), default=0)
        n = data.draw(st.integers(0, room), label="num_tokens")
        event(f"append_all: {len(seqs)} sequences")
        assert self.alloc.append_slots_all(seqs, n) == []
        for s in seqs:
            m = self.model[s]
            m.tokens += n
            m.final = max(m.final, m.tokens)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        parent = self.draw_seq(data)
        p = self.model[parent]
        mml = self.config.max_model_len
        final = data.draw(st.none() | st.integers(max(p.tokens, 1), mml + 1), label="final")
        child_final = p.final if final is None else final
        child, self.next_id = self.next_id, self.next_id + 1
        status = self.expected_status(p.tokens, child_final, p.prompt)
        event(f"fork: {status.value}")
        before = self.alloc.usage()
        got = self.alloc.fork(parent, child, final_len=final)
        if status is AllocStatus.OK:
            assert got == [
                SlotCopy(self.alloc.region(parent)[0], self.alloc.region(child)[0], p.tokens)
            ]
            reserved = self.reserved(child_final, p.prompt)
            self.model[child] = Seq(p.tokens, child_final, self.held(reserved), p.prompt, reserved)
        else:
            assert got is None
            assert self.alloc.usage() == before

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        sid = self.draw_seq(data)
        self.alloc.free(sid)
        del self.model[sid]
        assert not self.alloc.has_seq(sid)

    # ------------------------------------------------------- failing calls change nothing
    def books(self) -> object:
        a = self.alloc
        seqs = {s: (a.region(s), a.num_tokens(s), a.region_books(s)) for s in sorted(self.model)}
        return a.space.holes(), a.usage(), a.usage(True), seqs

    @rule(data=st.data(), kind=st.sampled_from(BAD_CALLS))
    def failing_call(self, data: st.DataObject, kind: str) -> None:
        """A call with a bad argument raises the package's error, or (too large) returns
        None, and changes nothing."""
        a = self.alloc
        new = self.next_id + 1_000
        held = sorted(self.model)
        bad: Any = data.draw(st.sampled_from([1.5, 3.0, True, -1, "2", None]), label="bad")
        mml = self.config.max_model_len
        call: Callable[[], object]
        error: type[Exception] | None = ConfigError
        if kind == "allocate: bad count":
            call = partial(a.allocate, new, bad, final_len=mml)
        elif kind == "allocate: bad final_len" and bad is not None:
            call = partial(a.allocate, new, 1, final_len=bad)
        elif kind == "allocate: final_len below num_tokens":
            call = partial(a.allocate, new, 2, final_len=1)
        elif kind == "allocate: longer than max_model_len":
            call, error = partial(a.allocate, new, mml + 1, final_len=mml + 1), None
        elif kind == "allocate: an id already held" and held:
            seq = data.draw(st.sampled_from(held))
            call, error = partial(a.allocate, seq, 1, final_len=mml), UnknownSequenceError
        elif kind == "append: bad count" and held:
            seq = data.draw(st.sampled_from(held))
            call = partial(a.append_slots, seq, bad)
        elif kind == "append: past the region" and held:
            seq = data.draw(st.sampled_from(held))
            call, error = partial(a.append_slots, seq, mml + 1), None
        elif kind == "append: unknown":
            call, error = partial(a.append_slots, new, 1), UnknownSequenceError
        elif kind == "append_all: one unknown" and held:
            call, error = partial(a.append_slots_all, [*held, new], 0), UnknownSequenceError
        elif kind == "fork: child already held" and held:
            seq = data.draw(st.sampled_from(held))
            call, error = partial(a.fork, seq, seq), UnknownSequenceError
        elif kind == "fork: unknown parent":
            call, error = partial(a.fork, new, new + 1), UnknownSequenceError
        elif kind == "fork: bad final_len" and held and bad is not None:
            seq = data.draw(st.sampled_from(held))
            call = partial(a.fork, seq, new, final_len=bad)
        elif kind == "free: unknown":
            call, error = partial(a.free, new), UnknownSequenceError
        else:
            return
        before = self.books()
        if error is None:
            assert call() is None
        else:
            with pytest.raises(error):
                call()
        event(f"failing call: {kind}")
        assert self.books() == before
        a.check_integrity()

    @rule(n=st.integers(0, 4))
    def numpy_counts(self, n: int) -> None:
        """numpy integers are counts like ints; the books keep plain ints."""
        sid, self.next_id = self.next_id, self.next_id + 1
        final = np.int64(max(n, 1))
        status = self.alloc.can_allocate(sid, np.int64(n), final_len=final)
        assert status is self.expected_status(n, int(final))
        if self.alloc.allocate(sid, np.int32(n), final_len=final) is None:
            return
        assert type(self.alloc.num_tokens(sid)) is int
        reserved = self.reserved(int(final), n)
        self.model[sid] = Seq(n, int(final), self.held(reserved), n, reserved)

    # -------------------------------------------------------------------- invariants
    @invariant()
    def books_agree(self) -> None:
        a, c = self.alloc, self.config.capacity
        a.check_integrity()
        assert a.num_seqs == len(self.model)
        for sid, m in self.model.items():
            assert a.num_tokens(sid) == m.tokens
            assert a.region(sid)[1] == m.held
            assert a.room(sid) == min(m.held, self.config.max_model_len) - m.tokens
        u = a.usage()
        assert u.token_states == sum(m.tokens for m in self.model.values())
        assert u.reservation == sum(min(m.held, m.final) - m.tokens for m in self.model.values())
        assert u.internal_fragmentation == sum(
            m.held - min(m.held, m.final) for m in self.model.values()
        )
        assert u.free == a.num_free_slots == c - sum(m.held for m in self.model.values())
        # The allocator convention: only slots beyond both R and the final length are rounding.
        assert u.allocator_rounding == sum(
            max(0, m.held - max(m.reserved, m.final)) for m in self.model.values()
        )
        if self.placement is not Placement.BUDDY or self.reservation is Reservation.SLOTS:
            assert u.allocator_rounding == 0  # nothing rounds a reservation up
        if self.reservation is Reservation.ORACLE:
            assert u.internal_fragmentation_allocator_convention == 0  # the paper's Fig. 2
        assert (
            u.internal_fragmentation_allocator_convention
            + u.external_fragmentation_allocator_convention
            == u.internal_fragmentation + u.external_fragmentation
        )
        for waiting in (False, True):
            w = a.usage(waiting_for_memory=waiting)
            parts = (w.token_states, w.reservation, w.internal_fragmentation)
            assert sum(parts) + w.external_fragmentation + w.free == c
            assert (w.external_fragmentation > 0) <= waiting
            assert 0.0 <= w.token_utilization <= 1.0

    def teardown(self) -> None:
        if not hasattr(self, "alloc"):
            return
        for sid in list(self.model):
            self.alloc.free(sid)
        self.alloc.check_integrity()
        c, mml = self.config.capacity, self.config.max_model_len
        if self.reservation is Reservation.SLOTS:
            whole = [(i * mml, mml) for i in range(c // mml)]
            whole += [(c - c % mml, c % mml)] if c % mml else []
        elif self.placement is Placement.BUDDY:
            sizes = [1 << k for k in range(c.bit_length() - 1, -1, -1) if c >> k & 1]
            whole = [(sum(sizes[:i]), s) for i, s in enumerate(sizes)]
        else:
            whole = [(0, c)]
        assert self.alloc.space.holes() == whole
        assert self.alloc.usage().free == c


@pytest.mark.parametrize(
    ("placement", "reservation"), COMBOS, ids=[f"{p.value}-{r.value}" for p, r in COMBOS]
)
def test_contiguous_allocator_state_machine(placement: Placement, reservation: Reservation) -> None:
    class Machine(ContiguousMachine):
        pass

    Machine.placement, Machine.reservation = placement, reservation
    run_state_machine_as_test(Machine, settings=SETTINGS)

"""Growth under prefix caching (memory/keyed_growth.py): a manager whose decoding sequences
grow lazily, their blocks and keys made when the pool is read, ends in the very pool that one
appending every token round by round (in the growers' order) reaches: the same free queue,
block for block, the same cache map, the same tables.

Stateful: two managers see the same allocations (shared prefixes: hits), frees, lookups and
rounds; short rounds (blocks run out) free the latest grower until the token fits, as the
scheduler's decode loop preempts. After every rule both give the same books and pass
``check_integrity()``, and the pools are the same once read (``stats``).
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedkv.memory.manager import KVCacheManager
from pagedkv.memory.token_runs import TokenRuns
from pagedkv.workloads.token_ids import own_ids, prefix_ids
from tests.factories import make_manager


class KeyedGrowthMachine(RuleBasedStateMachine):
    lazy: KVCacheManager
    eager: KVCacheManager

    @initialize(block_size=st.sampled_from([1, 4, 16]), blocks=st.integers(8, 80))
    def setup(self, block_size: int, blocks: int) -> None:
        self.lazy = make_manager(block_size, blocks, prefix_caching=True)
        self.eager = make_manager(block_size, blocks, prefix_caching=True)
        self.ids: dict[int, TokenRuns] = {}  # every sequence's ids, to its final length
        self.tokens: dict[int, int] = {}
        self.final: dict[int, int] = {}
        self.growing: list[int] = []  # in order (the eager one appends so each round)
        self.next_id = 0

    @rule(
        prefix=st.sampled_from([None, 0, 1]),
        plen=st.integers(1, 20),
        own=st.integers(1, 12),
        out=st.integers(1, 40),
        repeat=st.booleans(),
    )
    def allocate(self, prefix: int | None, plen: int, own: int, out: int, repeat: bool) -> None:
        seq = self.next_id
        self.next_id += 1
        if repeat and self.ids:  # another sequence's ids, id for id: its keys again
            ids = self.ids[max(self.ids)]
            n = min(len(ids) - 1, plen + own)
        else:
            ids = own_ids(seq, 0, own + out)
            if prefix is not None:
                ids = prefix_ids(prefix, plen) + ids
            n = len(ids) - out
        got = self.lazy.allocate(seq, n, token_ids=ids[:n], final_len=len(ids))
        assert got == self.eager.allocate(seq, n, token_ids=ids[:n], final_len=len(ids))
        if got is not None:
            self.ids[seq], self.tokens[seq], self.final[seq] = ids, n, len(ids)

    @rule(data=st.data())
    def grow(self, data: st.DataObject) -> None:
        idle = [s for s in self.tokens if s not in self.growing and self.tokens[s] < self.final[s]]
        if not idle:
            return
        picked = data.draw(st.lists(st.sampled_from(idle), unique=True, min_size=1))
        future = [self.ids[s][self.tokens[s] :] for s in picked]
        self.lazy.grow(picked, token_ids=future, order=picked)
        self.growing = sorted({*self.growing, *picked})

    def _eager_round(self, seq: int) -> bool:
        t = self.tokens[seq]
        return self.eager.append_slots(seq, 1, token_ids=self.ids[seq][t : t + 1]) is not None

    @precondition(lambda self: bool(self.growing))
    @rule(data=st.data())
    def advance(self, data: st.DataObject) -> None:
        to_end = min(self.final[s] - self.tokens[s] for s in self.growing)
        fit = self.lazy.rounds_that_fit()
        most = to_end if fit is None else min(to_end, fit)
        k = data.draw(st.integers(min(1, most), most))
        assert self.lazy.advance_rounds(k).k == k
        for _ in range(k):
            for s in self.growing:
                assert self._eager_round(s)
                self.tokens[s] += 1

    @precondition(lambda self: bool(self.growing) and self.lazy.rounds_that_fit() == 0)
    @rule()
    def short(self) -> None:
        """A round short of blocks: in order, a grower that finds none frees the latest one
        until it fits (or it was the latest itself)."""
        if any(self.tokens[s] >= self.final[s] for s in self.growing):
            return
        freed: list[int] = []

        def make_room(seq: object) -> bool:
            victim = self.growing[-1]
            self.lazy.free(victim)
            freed.append(victim)
            self.growing.remove(victim)
            return victim != seq

        order = list(self.growing)
        self.lazy.short_round(make_room)
        victims = iter(freed)
        gone: set[int] = set()  # the eager one's victims so far
        for s in order:
            if s in gone:
                continue
            while not self._eager_round(s):
                victim = next(victims)
                self.eager.free(victim)
                gone.add(victim)
                del self.tokens[victim], self.final[victim], self.ids[victim]
                if victim == s:
                    break
            else:
                self.tokens[s] += 1
        assert next(victims, None) is None

    @precondition(lambda self: len(self.tokens) > 0)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        self.lazy.free(seq)
        self.eager.free(seq)
        del self.tokens[seq], self.final[seq], self.ids[seq]
        if seq in self.growing:
            self.growing.remove(seq)

    @precondition(lambda self: len(self.ids) > 0)
    @rule(data=st.data())
    def lookup(self, data: st.DataObject) -> None:
        """A lookup reads the pool: growth makes what it owes, the growers go on."""
        ids = self.ids[data.draw(st.sampled_from(sorted(self.ids)))]
        assert self.lazy.lookup_prefix(ids) == self.eager.lookup_prefix(ids)
        assert all(self.lazy.is_growing(s) for s in self.growing)
        self._same_pool()

    @precondition(lambda self: len(self.tokens) > 0)
    @rule()
    def read(self) -> None:
        """Reading the tables settles every grower: then they are the eager one's."""
        for s in self.tokens:
            assert self.lazy.block_ids(s) == self.eager.block_ids(s)
            assert self.lazy.num_tokens(s) == self.tokens[s]
        self.growing = []

    def _same_pool(self) -> None:
        assert self.lazy.gpu.free_blocks() == self.eager.gpu.free_blocks()
        assert self.lazy.gpu.block_hash == self.eager.gpu.block_hash
        assert self.lazy.gpu.num_evictions == self.eager.gpu.num_evictions

    @invariant()
    def same_books(self) -> None:
        if not hasattr(self, "lazy"):
            return
        assert self.lazy.books() == self.eager.books()
        assert self.lazy.num_free_blocks == self.eager.num_free_blocks
        assert self.lazy.blocks_saved_by_sharing == self.eager.blocks_saved_by_sharing
        self.lazy.check_integrity()
        self.eager.check_integrity()
        assert self.lazy.stats == self.eager.stats  # (a read of the pool: growth makes it)
        assert all(self.lazy.is_growing(s) for s in self.growing)
        self._same_pool()


KeyedGrowthMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
test_keyed_growth_equals_appending_every_token = KeyedGrowthMachine.TestCase


def test_a_hit_on_blocks_keyed_ahead_of_a_growers_table() -> None:
    """The one-pass replay chooses a grower's blocks and keys them ahead of its table's tokens
    (its table takes them when read); a prompt whose ids hit those blocks reads the grower, and
    every table, block and free-queue entry is then as appending every token leaves them."""
    lazy = make_manager(4, 32, prefix_caching=True)
    eager = make_manager(4, 32, prefix_caching=True)
    ids = own_ids(0, 0, 30)
    other = own_ids(1, 0, 5)
    for kv in (lazy, eager):
        assert kv.allocate(0, 6, token_ids=ids[:6], final_len=30) == 0
    lazy.grow([0], token_ids=[ids[6:]], order=[0])
    lazy.advance_rounds(9)
    for t in range(6, 15):
        assert eager.append_slots(0, 1, token_ids=ids[t : t + 1]) is not None
    for kv in (lazy, eager):  # (the pool read: the one pass runs)
        assert kv.allocate(1, 5, token_ids=other, final_len=5) == 0
    assert lazy._chosen  # blocks chosen,
    assert lazy._ahead  # and keyed ahead of the table
    lazy.check_integrity()
    assert lazy.books() == eager.books()
    hits = [kv.allocate(2, 14, token_ids=ids[:14], final_len=20) for kv in (lazy, eager)]
    assert hits[0] == hits[1] == 12  # three full blocks, the last two the grower's outputs'
    assert not lazy._ahead
    for kv in (lazy, eager):
        kv.check_integrity()
    assert lazy.books() == eager.books()
    assert lazy.gpu.free_blocks() == eager.gpu.free_blocks()
    assert [lazy.block_ids(s) for s in (0, 1, 2)] == [eager.block_ids(s) for s in (0, 1, 2)]

"""Stateful property test of the paged manager: any order of allocate, append, fork,
copy-on-write, free, swap out/in, prefix hits and evictions keeps the books whole.

A plain model (tokens per sequence, where each lives) predicts what the manager must say;
after every rule the invariants are checked, and once everything is freed every block is free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from typing import Any, cast

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import event, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedkv.errors import ConfigError, UnknownSequenceError
from pagedkv.memory.block_table import cdiv
from pagedkv.memory.config import EvictionPolicy
from pagedkv.memory.interface import AllocStatus, SeqId
from pagedkv.memory.manager import KVCacheManager
from pagedkv.memory.prefix_hash import hash_blocks
from tests.factories import BLOCK_SIZES, make_manager

BAD_CALLS = [
    "allocate: bad count",
    "allocate: float token ids",
    "allocate: token id outside int64",
    "allocate: too few token ids",
    "allocate: final_len below num_tokens",
    "allocate: bad cache_salt",
    "allocate: more than the pool",
    "allocate: an id already held",
    "can_allocate: bad count",
    "append: bad count",
    "append: wrong number of ids",
    "append: more than the pool",
    "append: unknown or swapped",
    "append_all: one unknown",
    "append_all: bad count",
    "fork: child already held",
    "fork: unknown parent",
    "fork: bad final_len",
    "free: unknown",
    "swap_out: repeated id",
    "swap_out: unknown or swapped",
    "swap_in: repeated id",
    "swap_in: not swapped",
    "register_prefix: pins off",
]


class _NoError(Exception):
    """Marks a failing call that returns None (no room) instead of raising."""


class PagedManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.m: KVCacheManager = make_manager()
        self.tokens: dict[int, list[int]] = {}  # every live sequence's token ids
        self.final: dict[int, int] = {}
        self.swapped: set[int] = set()
        self.next_id = 0
        self.families: dict[int, list[int]] = {}  # sequence groups: root -> members

    @initialize(
        bs=st.sampled_from(BLOCK_SIZES),
        gpu=st.integers(2, 24),
        cpu=st.integers(0, 16),
        caching=st.booleans(),
        watermark=st.sampled_from([0.0, 0.1]),
        eviction=st.sampled_from(["lru", "lfu"]),
    )
    def setup(
        self, bs: int, gpu: int, cpu: int, caching: bool, watermark: float, eviction: str
    ) -> None:
        self.m = make_manager(
            bs, gpu, num_cpu_blocks=cpu, watermark=watermark, prefix_caching=caching
        )
        if eviction != "lru":  # the eviction policy's pool (memory/eviction.py)
            config = dataclasses.replace(self.m.config, eviction_policy=EvictionPolicy(eviction))
            self.m = KVCacheManager(config)
        self.bs = bs

    # ----- helpers ---------------------------------------------------------------------------
    def on_gpu(self) -> list[int]:
        return sorted(s for s in self.tokens if s not in self.swapped)

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    # ----- rules -----------------------------------------------------------------------------
    @rule(
        prefix=st.integers(0, 2),
        shared=st.integers(0, 40),
        own=st.integers(0, 30),
        output=st.integers(0, 40),
    )
    def allocate(self, prefix: int, shared: int, own: int, output: int) -> None:
        seq = self.new_id()
        prompt = [10_000 * (prefix + 1) + k for k in range(shared)]
        prompt += [10_000_000 * seq + k for k in range(own)]
        final = len(prompt) + output
        status = self.m.can_allocate(seq, len(prompt), token_ids=prompt, final_len=final)
        free_before = self.m.num_free_blocks
        got = self.m.allocate(seq, len(prompt), token_ids=prompt, final_len=final)
        if status is AllocStatus.OK:
            assert got is not None
        if got is None:
            assert self.m.num_free_blocks == free_before
            assert not self.m.has_seq(seq)
            return
        assert got % self.bs == 0
        if got:
            event("prefix hit")
        assert got <= max(0, len(prompt) - 1)
        assert self.m.num_tokens(seq) == len(prompt)
        self.tokens[seq] = prompt
        self.final[seq] = final

    @precondition(lambda self: bool(self.on_gpu()))
    @rule(data=st.data(), n=st.integers(0, 20), alphabet=st.sampled_from([3, 10**6]))
    def append(self, data: st.DataObject, n: int, alphabet: int) -> None:
        seq = data.draw(st.sampled_from(self.on_gpu()))
        # A small alphabet makes siblings generate equal blocks (duplicate keys).
        ids = data.draw(st.lists(st.integers(0, alphabet), min_size=n, max_size=n))
        t = self.m.num_tokens(seq)
        blocks = self.m.block_ids(seq)
        cow = n > 0 and t % self.bs != 0 and self.m.gpu.ref_counts[blocks[-1]] > 1
        needed = cdiv(t + n, self.bs) - len(blocks) + int(cow)
        free_before = self.m.num_free_blocks
        copies = self.m.append_slots(seq, n, token_ids=ids)
        assert (copies is None) == (needed > free_before)
        if copies is None:
            assert self.m.num_tokens(seq) == t
            assert self.m.num_free_blocks == free_before
            return
        event("copy-on-write" if cow else "append")
        assert len(copies) == int(cow)
        for c in copies:
            assert c.src == blocks[-1]
            assert self.m.gpu.ref_counts[c.dst] == 1
        self.tokens[seq] = self.tokens[seq] + ids
        assert self.m.num_tokens(seq) == t + n

    @precondition(lambda self: bool(self.on_gpu()))
    @rule(data=st.data(), n=st.integers(0, 20))
    def append_all(self, data: st.DataObject, n: int) -> None:
        """The bulk append (a decode round or a fast-forward window) when the room is there:
        the same end state as one append_slots per sequence."""
        seqs = data.draw(st.lists(st.sampled_from(self.on_gpu()), unique=True, min_size=1))
        needed = 0
        cows = 0
        left = list(self.m.gpu.ref_counts)  # a copy-on-write leaves the shared block's others
        for seq in seqs:
            t, blocks = self.m.num_tokens(seq), self.m.block_ids(seq)
            cow = n > 0 and t % self.bs != 0 and left[blocks[-1]] > 1
            if cow:
                left[blocks[-1]] -= 1
            needed += cdiv(t + n, self.bs) - len(blocks) + int(cow)
            cows += cow
        if needed > self.m.num_free_blocks:
            return
        copies = self.m.append_slots_all(seqs, n)
        event("bulk append with copy-on-write" if cows else "bulk append")
        assert len(copies) == cows
        for seq in seqs:  # ids unknown to the bulk path: the sequence's later blocks go unkeyed
            self.tokens[seq] = self.tokens[seq] + [999_999_999] * n

    @precondition(lambda self: bool(self.on_gpu()))
    @rule(data=st.data(), extra=st.integers(0, 30))
    def fork(self, data: st.DataObject, extra: int) -> None:
        parent = data.draw(st.sampled_from(self.on_gpu()))
        child = self.new_id()
        free_before = self.m.num_free_blocks
        final = len(self.tokens[parent]) + extra
        assert self.m.fork(parent, child, final_len=final) == []
        assert self.m.num_free_blocks == free_before
        assert self.m.block_ids(child) == self.m.block_ids(parent)
        self.tokens[child] = list(self.tokens[parent])
        self.final[child] = final

    @precondition(lambda self: bool(self.on_gpu()))
    @rule(data=st.data(), n=st.integers(1, 5))
    def fork_and_write(self, data: st.DataObject, n: int) -> None:
        """Fork, then write into the child at once: the copy-on-write path."""
        parent = data.draw(st.sampled_from(self.on_gpu()))
        child = self.new_id()
        self.m.fork(parent, child)
        self.tokens[child] = list(self.tokens[parent])
        self.final[child] = len(self.tokens[parent]) + n
        shared_partial = len(self.tokens[parent]) % self.bs != 0
        copies = self.m.append_slots(child, n, token_ids=[7] * n)
        if copies is not None:
            assert len(copies) == int(shared_partial)
            if copies:
                event("copy-on-write")
            self.tokens[child] += [7] * n

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        self.m.free(seq)
        del self.tokens[seq], self.final[seq]
        self.swapped.discard(seq)

    @precondition(lambda self: bool(self.on_gpu()))
    @rule(data=st.data())
    def swap_out(self, data: st.DataObject) -> None:
        group = data.draw(st.sets(st.sampled_from(self.on_gpu()), min_size=1, max_size=3))
        can = self.m.can_swap_out(group)
        out = self.m.swap_out(group)
        assert (out is not None) == can
        if out is not None:
            self.swapped |= group
            event("swap out")

    @precondition(lambda self: bool(self.swapped))
    @rule(data=st.data())
    def swap_in(self, data: st.DataObject) -> None:
        group = data.draw(st.sets(st.sampled_from(sorted(self.swapped)), min_size=1, max_size=3))
        # the shortcut without cache or pins counts as block by block
        ids: list[SeqId] = [*sorted(group)]
        assert self.m._swap_in_blocks_taken(ids) == self.m._swap_in_blocks_taken_each(ids)
        status = self.m.can_swap_in(group)
        back = self.m.swap_in(group)
        if status is AllocStatus.OK:
            assert back is not None
        if back is not None:
            self.swapped -= group
            event("swap in")
        else:
            assert all(self.m.is_swapped(s) for s in group)

    # ----- sequence groups (parallel sampling, beams): all or nothing ---------------------------
    def live_families(self, swapped: bool) -> list[list[int]]:
        """Families whose live members are all on the GPU (swapped False) or all swapped out
        (the scheduler's two states of a group; other rules may free or move members alone)."""
        out = []
        for members in self.families.values():
            live = [s for s in members if s in self.tokens]
            if live and all((s in self.swapped) == swapped for s in live):
                out.append(live)
        return out

    @precondition(lambda self: any(s not in self.families for s in self.on_gpu()))
    @rule(data=st.data(), size=st.integers(2, 4))
    def fork_group(self, data: st.DataObject, size: int) -> None:
        """A sequence forks into a family of ``size`` (parallel sampling after a prefill)."""
        parent = data.draw(st.sampled_from([s for s in self.on_gpu() if s not in self.families]))
        free_before = self.m.num_free_blocks
        members = [parent]
        for _ in range(size - 1):
            child = self.new_id()
            assert self.m.fork(parent, child, final_len=self.final[parent]) == []
            self.tokens[child] = list(self.tokens[parent])
            self.final[child] = self.final[parent]
            members.append(child)
        assert self.m.num_free_blocks == free_before  # forks share, they never allocate
        self.families[parent] = members
        event("group fork")

    @precondition(lambda self: bool(self.live_families(swapped=False)))
    @rule(data=st.data(), n=st.integers(1, 5))
    def append_group(self, data: st.DataObject, n: int) -> None:
        """The group's step: ``can_append_all`` promises room for every member (copies of a
        shared last block included), then every append succeeds; or none is tried."""
        family = data.draw(st.sampled_from(self.live_families(swapped=False)))
        if not self.m.can_append_all(family, n):
            return
        for seq in family:
            ids = [seq % 97 + k for k in range(n)]  # members diverge after the fork
            assert self.m.append_slots(seq, n, token_ids=ids) is not None
            self.tokens[seq] = self.tokens[seq] + ids
        event("group append")

    @precondition(lambda self: bool(self.live_families(swapped=False)))
    @rule(data=st.data(), recompute=st.booleans())
    def preempt_group(self, data: st.DataObject, recompute: bool) -> None:
        """Preempt a whole family as the scheduler does: swap out all of it, if the CPU pool
        takes every distinct block (``can_swap_out``), else free all of it."""
        family = data.draw(st.sampled_from(self.live_families(swapped=False)))
        before = {s: self.m.block_ids(s) for s in family}
        can = self.m.can_swap_out(family)
        out = None if recompute else self.m.swap_out(family)
        if not recompute:
            assert (out is not None) == can
        if out is not None:
            assert all(self.m.is_swapped(s) for s in family)
            distinct = {b for blocks in before.values() for b in blocks}
            assert sorted(m.src for m in out) == sorted(distinct)  # shared blocks move once
            self.swapped |= set(family)
            event("group swapped out")
            return
        assert all(self.m.block_ids(s) == before[s] for s in family)  # none moved
        for seq in family:
            self.m.free(seq)
            del self.tokens[seq], self.final[seq]
        event("group freed")

    @precondition(lambda self: bool(self.live_families(swapped=True)))
    @rule(data=st.data())
    def resume_group(self, data: st.DataObject) -> None:
        """Swap a whole family back in: all of it, or (no room) none of it."""
        family = data.draw(st.sampled_from(self.live_families(swapped=True)))
        ids: list[SeqId] = list(family)
        assert self.m._swap_in_blocks_taken(ids) == self.m._swap_in_blocks_taken_each(ids)
        status = self.m.can_swap_in(family)
        back = self.m.swap_in(family)
        if status is AllocStatus.OK:
            assert back is not None
        if back is None:
            assert all(self.m.is_swapped(s) for s in family)
            return
        assert not any(self.m.is_swapped(s) for s in family)
        self.swapped -= set(family)
        event("group swapped in")

    # ----- failing calls change nothing ----------------------------------------------------------
    def books(self) -> object:
        """Everything a call could change: the pools (free queues in order, counts, keys), the
        counters, the usage and every sequence's table."""
        m = self.m
        seqs = {s: (m.block_ids(s), m.num_tokens(s), m.is_swapped(s)) for s in sorted(self.tokens)}
        gpu, cpu = m.gpu, m.cpu
        pools = [(p.free_blocks(), list(p.ref_counts), list(p.block_hash)) for p in (gpu, cpu)]
        return pools, m.stats, m.usage(), m.usage(True), m.books(), seqs

    @rule(data=st.data(), kind=st.sampled_from(BAD_CALLS))
    def failing_call(self, data: st.DataObject, kind: str) -> None:
        """A call with a bad argument (a type, an unknown or repeated id, a bound) raises the
        package's error, or (a size too large for the pool) returns None, and changes nothing."""
        m = self.m
        new = self.next_id + 1_000  # an id no rule has used
        gpu, swapped = self.on_gpu(), sorted(self.swapped)
        n = data.draw(st.integers(1, 20), label="n")
        bad_count: Any = data.draw(st.sampled_from([1.5, 2.0, True, -1, "3", None]), label="count")
        call: Callable[[], object]
        error: type[Exception] = ConfigError
        if kind == "allocate: bad count":
            call = partial(m.allocate, new, bad_count)
        elif kind == "allocate: float token ids" and m.config.enable_prefix_caching:
            call = partial(m.allocate, new, n, token_ids=cast(Any, [1.5] * n))
        elif kind == "allocate: token id outside int64" and m.config.enable_prefix_caching:
            call = partial(m.allocate, new, n, token_ids=[2**63] * n)
        elif kind == "allocate: too few token ids":
            call = partial(m.allocate, new, n, token_ids=list(range(n - 1)))
        elif kind == "allocate: final_len below num_tokens":
            call = partial(m.allocate, new, n, final_len=n - 1)
        elif kind == "allocate: bad cache_salt":
            call = partial(m.allocate, new, n, cache_salt=7)  # type: ignore[arg-type]
        elif kind == "allocate: more than the pool":
            call = partial(m.allocate, new, (m.gpu.num_blocks + 1) * self.bs)
            error = _NoError
        elif kind == "allocate: an id already held" and self.tokens:
            seq = data.draw(st.sampled_from(sorted(self.tokens)))
            call, error = partial(m.allocate, seq, n), UnknownSequenceError
        elif kind == "can_allocate: bad count":
            call = partial(m.can_allocate, new, bad_count)
        elif kind == "append: bad count" and gpu:
            seq = data.draw(st.sampled_from(gpu))
            call = partial(m.append_slots, seq, bad_count)
        elif kind == "append: wrong number of ids" and gpu:
            seq = data.draw(st.sampled_from(gpu))
            call = partial(m.append_slots, seq, n, token_ids=[1] * (n + 1))
        elif kind == "append: more than the pool" and gpu:
            seq = data.draw(st.sampled_from(gpu))
            call = partial(m.append_slots, seq, (m.gpu.num_blocks + 1) * self.bs)
            error = _NoError
        elif kind == "append: unknown or swapped":
            seq = data.draw(st.sampled_from([new, *swapped]))
            call, error = partial(m.append_slots, seq, 1), UnknownSequenceError
        elif kind == "append_all: one unknown" and gpu:
            seqs = [*data.draw(st.lists(st.sampled_from(gpu), unique=True, min_size=1)), new]
            call, error = partial(m.append_slots_all, seqs, 1), UnknownSequenceError
        elif kind == "append_all: bad count" and gpu:
            call = partial(m.append_slots_all, gpu, bad_count)
        elif kind == "fork: child already held" and gpu:
            parent = data.draw(st.sampled_from(gpu))
            child = data.draw(st.sampled_from(sorted(self.tokens)))
            call, error = partial(m.fork, parent, child), UnknownSequenceError
        elif kind == "fork: unknown parent":
            call, error = partial(m.fork, new, new + 1), UnknownSequenceError
        elif kind == "fork: bad final_len" and gpu:
            parent = data.draw(st.sampled_from(gpu))
            call = partial(m.fork, parent, new, final_len=bad_count)
            if bad_count is None:
                return  # (None is the default: inherit the parent's)
        elif kind == "free: unknown":
            call, error = partial(m.free, new), UnknownSequenceError
        elif kind == "swap_out: repeated id" and gpu:
            seq = data.draw(st.sampled_from(gpu))
            call = partial(m.swap_out, [seq, seq])
        elif kind == "swap_out: unknown or swapped":
            seqs = [*gpu[:1], data.draw(st.sampled_from([new, *swapped]))]
            call, error = partial(m.swap_out, seqs), UnknownSequenceError
        elif kind == "swap_in: repeated id" and swapped:
            seq = data.draw(st.sampled_from(swapped))
            call = partial(m.swap_in, [seq, seq])
        elif kind == "swap_in: not swapped":
            seqs = [*swapped[:1], data.draw(st.sampled_from([new, *gpu]))]
            call, error = partial(m.swap_in, seqs), UnknownSequenceError
        elif kind == "register_prefix: pins off":
            call = partial(m.register_prefix, "p", [1, 2, 3])
        else:
            return  # (the state has nothing this kind needs)
        before = self.books()
        if error is _NoError:
            assert call() is None
        else:
            with pytest.raises(error):
                call()
        event(f"failing call: {kind}")
        assert self.books() == before
        m.check_integrity()

    @precondition(lambda self: bool(self.on_gpu()))
    @rule(data=st.data(), n=st.integers(0, 3))
    def numpy_counts(self, data: st.DataObject, n: int) -> None:
        """numpy integers are counts like ints (what a caller's arrays hold); the books keep
        plain ints."""
        seq = data.draw(st.sampled_from(self.on_gpu()))
        copies = self.m.append_slots(seq, np.int64(n), token_ids=[5] * n)
        if copies is not None:
            self.tokens[seq] = self.tokens[seq] + [5] * n
        assert type(self.m.num_tokens(seq)) is int
        new = self.new_id()
        got = self.m.allocate(new, np.int32(n), final_len=np.uint16(n + 1))
        if got is not None:
            assert type(self.m.num_tokens(new)) is int
            self.tokens[new] = [999_999_999] * n  # (no ids given)
            self.final[new] = n + 1

    # ----- invariants ------------------------------------------------------------------------
    @invariant()
    def books_are_whole(self) -> None:
        m = self.m
        m.check_integrity()
        for waiting in (False, True):
            u = m.usage(waiting)  # MemoryUsage checks the categories sum to C
            assert 0.0 <= u.token_utilization <= 1.0
            assert u.allocated == m.gpu.num_used * self.bs
        refs = [0] * m.gpu.num_blocks
        for seq in self.on_gpu():
            for b in m.block_ids(seq):
                refs[b] += 1
        assert refs == m.gpu.ref_counts
        assert not {b for b, r in enumerate(refs) if r} & set(m.gpu.free_blocks())
        for seq, toks in self.tokens.items():
            assert m.num_tokens(seq) == len(toks)
            assert m.is_swapped(seq) == (seq in self.swapped)
        for seq in self.on_gpu():
            blocks = m.block_ids(seq)
            shared = bool(blocks) and m.gpu.ref_counts[blocks[-1]] > 1
            free_slots = len(blocks) * self.bs - m.num_tokens(seq)
            assert m.room(seq) == (0 if shared else free_slots)
            assert 0 <= m.room(seq) < self.bs
        assert m.rooms(self.on_gpu()) == [m.room(s) for s in self.on_gpu()]

    @invariant()
    def cached_keys_match_the_tokens_held(self) -> None:
        for seq in self.on_gpu():
            toks = self.tokens[seq]
            keys = hash_blocks(toks, self.bs)
            for j, b in enumerate(self.m.block_ids(seq)):
                key = self.m.gpu.block_hash[b]
                if key is not None:
                    assert key == keys[j]

    def teardown(self) -> None:
        if self.m.stats.evictions:
            event("eviction")
        for seq in list(self.tokens):
            self.m.free(seq)
        self.m.check_integrity()
        assert self.m.num_free_blocks == self.m.gpu.num_blocks
        assert self.m.stats.num_free_cpu_blocks == self.m.cpu.num_blocks
        assert self.m.usage().free == self.m.capacity


PagedManagerMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None
)
TestPagedManager = PagedManagerMachine.TestCase

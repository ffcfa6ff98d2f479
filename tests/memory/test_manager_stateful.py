"""Stateful property test of the paged manager: any order of allocate, append, fork,
copy-on-write, free, swap out/in, prefix hits and evictions keeps the books whole.

A plain model (tokens per sequence, where each lives) predicts what the manager must say;
after every rule the invariants are checked, and once everything is freed every block is free.
"""

from __future__ import annotations

import dataclasses

import hypothesis.strategies as st
from hypothesis import event, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedkv.memory.block_table import cdiv
from pagedkv.memory.config import EvictionPolicy
from pagedkv.memory.interface import AllocStatus
from pagedkv.memory.manager import KVCacheManager
from pagedkv.memory.prefix_hash import hash_blocks
from tests.factories import BLOCK_SIZES, make_manager


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

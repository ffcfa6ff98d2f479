"""Explicit (pinned) prefixes in the paged manager: register, share, copy-on-write, unregister,
swap; and a stateful machine that simulates every block's contents to show that a sequence
always reads its own tokens and never writes into a pinned block."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import event, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedkv.errors import ConfigError, IntegrityError, UnknownSequenceError
from pagedkv.memory.block_table import cdiv
from pagedkv.memory.config import CacheConfig
from pagedkv.memory.interface import AllocStatus, BlockCopy
from pagedkv.memory.manager import KVCacheManager

# (block size, prefix length): 1 and 16 dividing it, 16 and 7 not.
CASES = [(1, 20), (16, 32), (16, 20), (7, 20)]
PREFIX = [5000 + j for j in range(64)]


def pinned(bs: int, blocks: int, *, cpu: int = 0, watermark: float = 0.0) -> KVCacheManager:
    return KVCacheManager(
        CacheConfig(
            num_gpu_blocks=blocks,
            block_size=bs,
            num_cpu_blocks=cpu,
            watermark=watermark,
            enable_pinned_prefixes=True,
        )
    )


def own(seq: int, n: int) -> list[int]:
    return [100_000 * seq + j for j in range(n)]


@pytest.mark.parametrize(("bs", "plen"), CASES)
def test_register_pins_blocks_that_never_free(bs: int, plen: int) -> None:
    kv = pinned(bs, 64)
    prefix = kv.register_prefix("sys", PREFIX[:plen])
    assert len(prefix.blocks) == cdiv(plen, bs) == kv.num_pinned_blocks
    assert not set(prefix.blocks) & set(kv.gpu.free_blocks())
    u = kv.usage()
    assert u.token_states == plen  # the prefix's tokens, once
    assert u.internal_fragmentation == cdiv(plen, bs) * bs - plen  # its last block's empties
    assert kv.blocks_saved_by_sharing == -len(prefix.blocks)  # unused, a pin only costs
    kv.check_integrity()


@pytest.mark.parametrize(("bs", "plen"), CASES)
def test_a_request_shares_every_prefix_block_and_copies_the_partial_one(bs: int, plen: int) -> None:
    kv = pinned(bs, 64)
    prefix = kv.register_prefix("sys", PREFIX[:plen])
    prompt = PREFIX[:plen] + own(1, 9)
    assert kv.can_allocate("a", len(prompt), token_ids=prompt) is AllocStatus.OK
    assert kv.allocate("a", len(prompt), token_ids=prompt) == plen  # computed: the prefix
    full = plen // bs
    blocks = kv.block_ids("a")
    assert blocks[:full] == list(prefix.blocks[:full])
    copies = kv.take_copies()
    if plen % bs:  # the partial last block was copied before the prompt wrote into it
        assert copies == [BlockCopy(prefix.blocks[-1], blocks[full])]
        assert blocks[full] not in prefix.blocks
    else:
        assert copies == []
    assert kv.take_copies() == []  # each copy is handed out once
    assert not set(blocks[full:]) & set(prefix.blocks)
    assert len(blocks) == cdiv(len(prompt), bs)
    kv.allocate("b", len(prompt), token_ids=PREFIX[:plen] + own(2, 9))
    assert kv.take_copies() == (
        [BlockCopy(prefix.blocks[-1], kv.block_ids("b")[full])] if plen % bs else []
    )
    # two requests share `full` blocks with the pin: each saves them against running alone
    assert kv.blocks_saved_by_sharing == 2 * full - len(prefix.blocks)
    assert kv.stats.prefix_hit_tokens == 2 * plen
    # the prefix once, then each request's tokens past the shared full blocks (a copy of the
    # partial block's prefix tokens included)
    assert kv.usage().token_states == plen + 2 * (len(prompt) - full * bs)
    kv.check_integrity()


@pytest.mark.parametrize(("bs", "plen"), CASES)
def test_other_requests_allocate_as_without_pins(bs: int, plen: int) -> None:
    kv, plain = pinned(bs, 256), pinned(bs, 256)
    kv.register_prefix("sys", PREFIX[:plen])
    for seq, prompt in enumerate(
        [own(1, 30), PREFIX[:plen], PREFIX[: plen - 1] + own(2, 5), [PREFIX[0], *own(3, 40)]]
    ):
        # a prompt that is only the prefix has no token of its own to compute: no share
        assert kv.allocate(seq, len(prompt), token_ids=prompt) == 0
        assert plain.allocate(seq, len(prompt), token_ids=prompt) == 0
        assert len(kv.block_ids(seq)) == len(plain.block_ids(seq))
        assert not set(kv.block_ids(seq)) & set(kv.pinned_prefixes()[0].blocks)
    assert kv.take_copies() == []
    kv.check_integrity()


def test_the_longest_registered_prefix_wins() -> None:
    kv = pinned(4, 32)
    kv.register_prefix("short", PREFIX[:6])
    kv.register_prefix("long", PREFIX[:14])
    assert kv.allocate("a", 20, token_ids=PREFIX[:14] + own(1, 6)) == 14
    assert kv.allocate("b", 10, token_ids=PREFIX[:6] + own(2, 4)) == 6
    # a prompt of 14 tokens cannot use the 14-token prefix (no token left): the 6-token one
    assert kv.allocate("c", 14, token_ids=PREFIX[:14]) == 6
    kv.check_integrity()


@pytest.mark.parametrize(("bs", "plen"), CASES)
def test_unregister_leaves_shared_blocks_to_their_sequences(bs: int, plen: int) -> None:
    kv = pinned(bs, 64)
    prefix = kv.register_prefix("sys", PREFIX[:plen])
    kv.allocate("a", plen + 3, token_ids=PREFIX[:plen] + own(1, 3))
    kv.take_copies()
    kv.unregister_prefix("sys")
    kv.check_integrity()
    assert kv.num_pinned_blocks == 0
    held = set(kv.block_ids("a"))
    assert set(prefix.blocks) - held <= set(kv.gpu.free_blocks())
    assert kv.allocate("b", plen + 3, token_ids=PREFIX[:plen] + own(2, 3)) == 0  # no pin now
    kv.free("a")
    kv.free("b")
    kv.check_integrity()
    assert kv.num_free_blocks == 64
    assert kv.usage().token_states == 0
    with pytest.raises(UnknownSequenceError):
        kv.unregister_prefix("sys")


def test_register_errors_change_nothing() -> None:
    off = KVCacheManager(CacheConfig(num_gpu_blocks=8, block_size=4))
    with pytest.raises(ConfigError, match="enable_pinned_prefixes"):
        off.register_prefix("sys", PREFIX[:4])
    kv = pinned(4, 10, watermark=0.1)  # 1 block kept free
    kv.register_prefix("a", PREFIX[:8])
    for bad_id, ids, what in [
        ("a", PREFIX[20:24], "already registered"),
        ("b", PREFIX[:8], "already registered"),
        ("c", [], "at least 1 token"),
        ("d", PREFIX[:29], "the 7 free blocks above the watermark"),  # 8 > 10 - 2 - 1
    ]:
        with pytest.raises(ConfigError, match=what):
            kv.register_prefix(bad_id, ids)
    assert kv.num_pinned_blocks == 2
    assert kv.num_free_blocks == 8
    kv.check_integrity()
    with pytest.raises(ConfigError, match="excludes enable_prefix_caching"):
        CacheConfig(enable_prefix_caching=True, enable_pinned_prefixes=True)


def test_pins_shrink_what_can_ever_fit() -> None:
    kv = pinned(4, 10)
    kv.register_prefix("sys", PREFIX[:14])  # 4 blocks: 3 full, 1 partial
    assert kv.can_allocate("x", 28, token_ids=own(1, 28)) is AllocStatus.NEVER  # 7 > 6 left
    assert kv.can_allocate("y", 24, token_ids=own(1, 24)) is AllocStatus.OK
    # sharing 3 full blocks, a 36-token prompt with the prefix needs 9 - 3 = 6 new blocks
    assert kv.can_allocate("z", 36, token_ids=PREFIX[:14] + own(2, 22)) is AllocStatus.OK
    assert kv.can_allocate("w", 36, token_ids=own(2, 36)) is AllocStatus.NEVER
    assert kv.allocate("z", 36, token_ids=PREFIX[:14] + own(2, 22)) == 14
    assert kv.num_free_blocks == 0
    kv.check_integrity()


@pytest.mark.parametrize(("bs", "plen"), CASES)
def test_swap_in_reuses_the_pinned_blocks(bs: int, plen: int) -> None:
    kv = pinned(bs, 64, cpu=64)
    prefix = kv.register_prefix("sys", PREFIX[:plen])
    prompt = PREFIX[:plen] + own(1, 5)
    kv.allocate("a", len(prompt), token_ids=prompt)
    kv.take_copies()
    before = kv.block_ids("a")
    out = kv.swap_out(["a"])
    assert out is not None
    assert len(out) == len(before)  # the CPU copy is complete
    kv.check_integrity()
    back = kv.swap_in(["a"])
    full = plen // bs
    assert back is not None
    assert len(back) == len(before) - full  # the pinned blocks are not copied back
    assert kv.block_ids("a")[:full] == list(prefix.blocks[:full])
    kv.check_integrity()


def test_integrity_sees_a_lost_pin() -> None:
    kv = pinned(4, 8)
    prefix = kv.register_prefix("sys", PREFIX[:6])
    kv.allocate("a", 9, token_ids=PREFIX[:6] + own(1, 3))
    kv.gpu.decref(prefix.blocks[0])  # a pin dropped behind the books' back
    with pytest.raises(IntegrityError, match="reference counts"):
        kv.check_integrity()


# ----- stateful: simulated block contents --------------------------------------------------
PREFIXES = {
    "p0": [7000 + j for j in range(23)],
    "p1": [7000 + j for j in range(23)] + [8000 + j for j in range(9)],  # extends p0
    "p2": [9000 + j for j in range(5)],
}


class PinnedMachine(RuleBasedStateMachine):
    """Every GPU and CPU block's slots hold simulated token ids: copies and swaps move them,
    writes fill them. After every rule, each sequence reads exactly its tokens through its
    table, and each pinned block still holds its prefix (so no sequence wrote into it)."""

    def __init__(self) -> None:
        super().__init__()
        self.m = pinned(4, 8)
        self.bs = 4
        self.tokens: dict[int, list[int]] = {}
        self.swapped: set[int] = set()
        self.gpu: dict[int, list[int | None]] = {}
        self.cpu: dict[int, list[int | None]] = {}
        self.next_id = 0

    @initialize(
        bs=st.sampled_from([1, 16, 7, 4]),
        gpu_tokens=st.integers(24, 300),
        cpu=st.integers(0, 40),
        watermark=st.sampled_from([0.0, 0.1]),
        first=st.sampled_from([None, *sorted(PREFIXES)]),
    )
    def setup(
        self, bs: int, gpu_tokens: int, cpu: int, watermark: float, first: str | None
    ) -> None:
        self.m = pinned(bs, max(2, gpu_tokens // bs), cpu=cpu, watermark=watermark)
        self.bs = bs
        if first is not None:
            self.register(first)

    # ----- helpers ---------------------------------------------------------------------
    def slot(self, pool: dict[int, list[int | None]], block: int) -> list[int | None]:
        return pool.setdefault(block, [None] * self.bs)

    def pinned_blocks(self) -> set[int]:
        return {b for p in self.m.pinned_prefixes() for b in p.blocks}

    def write(self, seq: int, start: int, end: int) -> None:
        """The executor writes tokens [start, end) of ``seq`` through its table."""
        blocks = self.m.block_ids(seq)
        pins = self.pinned_blocks()
        for t in range(start, end):
            block = blocks[t // self.bs]
            assert block not in pins, f"sequence {seq} writes token {t} into pinned {block}"
            self.slot(self.gpu, block)[t % self.bs] = self.tokens[seq][t]

    def copy(self, copies: list[BlockCopy]) -> None:
        for c in copies:
            self.gpu[c.dst] = list(self.slot(self.gpu, c.src))

    def on_gpu(self) -> list[int]:
        return sorted(s for s in self.tokens if s not in self.swapped)

    # ----- rules -----------------------------------------------------------------------
    @rule(name=st.sampled_from(sorted(PREFIXES)))
    def register(self, name: str) -> None:
        ids = PREFIXES[name]
        room = self.m.num_free_blocks - self.m.config.watermark_blocks
        registered = {p.prefix_id for p in self.m.pinned_prefixes()}
        if name in registered or cdiv(len(ids), self.bs) > room:
            with pytest.raises(ConfigError):
                self.m.register_prefix(name, ids)
            return
        prefix = self.m.register_prefix(name, ids)
        for j, block in enumerate(prefix.blocks):  # computed once, by the registrar
            chunk = ids[j * self.bs : (j + 1) * self.bs]
            self.gpu[block] = [*chunk, *[None] * (self.bs - len(chunk))]
        event("register")

    @rule(name=st.sampled_from(sorted(PREFIXES)))
    def unregister(self, name: str) -> None:
        if name not in {p.prefix_id for p in self.m.pinned_prefixes()}:
            with pytest.raises(UnknownSequenceError):
                self.m.unregister_prefix(name)
            return
        self.m.unregister_prefix(name)

    @rule(
        name=st.sampled_from([None, *sorted(PREFIXES), *sorted(PREFIXES)]),
        cut=st.sampled_from([0, 0, 1, 3]),
        extra=st.integers(0, 20),
    )
    def allocate(self, name: str | None, cut: int, extra: int) -> None:
        seq = self.next_id = self.next_id + 1
        head = PREFIXES[name] if name else []
        prompt = head[: len(head) - cut] + own(seq, extra)
        if not prompt:
            return
        pins = {tuple(p.token_ids): p for p in self.m.pinned_prefixes()}
        fitting = [
            len(ids) for ids in pins if len(ids) < len(prompt) and tuple(prompt[: len(ids)]) == ids
        ]
        want = max(fitting, default=0)
        free = self.m.num_free_blocks
        status = self.m.can_allocate(seq, len(prompt), token_ids=prompt)
        computed = self.m.allocate(seq, len(prompt), token_ids=prompt)
        if computed is None:
            assert status is not AllocStatus.OK
            assert self.m.num_free_blocks == free
            assert not self.m.has_seq(seq)
            return
        assert computed == want
        event("pinned hit" if want else "no hit")
        self.tokens[seq] = list(prompt)
        self.copy(self.m.take_copies())
        self.write(seq, computed, len(prompt))

    @precondition(lambda self: bool(self.on_gpu()))
    @rule(data=st.data(), n=st.integers(1, 9))
    def append(self, data: st.DataObject, n: int) -> None:
        seq = data.draw(st.sampled_from(self.on_gpu()))
        start = len(self.tokens[seq])
        new = own(seq, start + n)[start:]
        copies = self.m.append_slots(seq, n, token_ids=new)
        if copies is None:
            return
        self.tokens[seq] += new
        self.copy(copies)
        self.write(seq, start, start + n)

    @precondition(lambda self: bool(self.on_gpu()))
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        parent = data.draw(st.sampled_from(self.on_gpu()))
        child = self.next_id = self.next_id + 1
        assert self.m.fork(parent, child) == []
        self.tokens[child] = list(self.tokens[parent])

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        self.m.free(seq)
        del self.tokens[seq]
        self.swapped.discard(seq)

    @precondition(lambda self: bool(self.on_gpu()))
    @rule(data=st.data())
    def swap_out(self, data: st.DataObject) -> None:
        group = data.draw(st.sets(st.sampled_from(self.on_gpu()), min_size=1, max_size=3))
        out = self.m.swap_out(group)
        if out is None:
            return
        for mapping in out:
            self.cpu[mapping.dst] = list(self.slot(self.gpu, mapping.src))
        self.swapped |= group
        event("swap out")

    @precondition(lambda self: bool(self.swapped))
    @rule(data=st.data())
    def swap_in(self, data: st.DataObject) -> None:
        group = data.draw(st.sets(st.sampled_from(sorted(self.swapped)), min_size=1, max_size=3))
        back = self.m.swap_in(group)
        if back is None:
            return
        for mapping in back:
            self.gpu[mapping.dst] = list(self.slot(self.cpu, mapping.src))
        self.swapped -= group
        pins = self.pinned_blocks()
        event(
            "swap in onto pins"
            if any(set(self.m.block_ids(s)) & pins for s in group)
            else "swap in"
        )

    # ----- invariants ------------------------------------------------------------------
    @invariant()
    def books_are_whole(self) -> None:
        self.m.check_integrity()
        assert not self.pinned_blocks() & set(self.m.gpu.free_blocks())

    @invariant()
    def pinned_blocks_hold_their_prefix(self) -> None:
        for p in self.m.pinned_prefixes():
            for t, token in enumerate(p.token_ids):
                assert self.gpu[p.blocks[t // self.bs]][t % self.bs] == token

    @invariant()
    def every_sequence_reads_its_tokens(self) -> None:
        for seq, toks in self.tokens.items():
            pool = self.cpu if seq in self.swapped else self.gpu
            blocks = self.m.block_ids(seq)
            assert len(blocks) == cdiv(len(toks), self.bs)
            read = [self.slot(pool, blocks[t // self.bs])[t % self.bs] for t in range(len(toks))]
            assert read == toks, f"sequence {seq}"

    def teardown(self) -> None:
        for seq in list(self.tokens):
            self.m.free(seq)
        for p in self.m.pinned_prefixes():
            self.m.unregister_prefix(p.prefix_id)
        self.m.check_integrity()
        assert self.m.num_free_blocks == self.m.gpu.num_blocks
        assert self.m.usage().free == self.m.capacity


PinnedMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=35, deadline=None)
TestPinnedMachine = PinnedMachine.TestCase

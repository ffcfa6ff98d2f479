"""Eviction policies of the prefix cache: LRU and LFU pick different victims, each picks the one
its definition says (a model-based Hypothesis test), uncached blocks always go first, and the
books stay whole after every operation."""

from __future__ import annotations

import json
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import event, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedkv.cli import main
from pagedkv.errors import ConfigError
from pagedkv.memory.block_pool import BlockPool, UncachedBlockPool
from pagedkv.memory.config import CacheConfig, EvictionPolicy
from pagedkv.memory.eviction import LFUBlockPool, gpu_pool
from pagedkv.memory.manager import KVCacheManager
from pagedkv.simulation import SimulationConfig, simulate
from tests.factories import BLOCK_SIZES

POLICIES = ("lru", "lfu")


def manager(bs: int, blocks: int, policy: str) -> KVCacheManager:
    config = CacheConfig(
        num_gpu_blocks=blocks,
        block_size=bs,
        watermark=0.0,
        enable_prefix_caching=True,
        eviction_policy=policy,  # type: ignore[arg-type]  # the name, as YAML gives it
    )
    return KVCacheManager(config)


def prompt(tag: int, bs: int, seq: int) -> list[int]:
    """One full block of ``tag``'s tokens, then one token of ``seq``'s own (the last token is
    never a hit, and with block size 1 it fills a block of its own, keyed apart)."""
    return [tag * 1000 + k for k in range(bs)] + [10**6 * seq]


def hit(m: KVCacheManager, tag: int, bs: int) -> bool:
    return m.lookup_prefix(prompt(tag, bs, 0)).num_computed_tokens == bs


# ----- LRU and LFU evict different blocks ------------------------------------------------------
@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_lru_and_lfu_evict_different_blocks(bs: int) -> None:
    """Prefix A is used twice and freed before prefix B, used once. Taking blocks until one of
    the two is evicted: LRU gives up A (least recently freed), LFU gives up B (fewest uses)."""
    kept = {}
    for policy in POLICIES:
        m = manager(bs, 8, policy)
        for seq, tag in ((1, 1), (2, 1), (3, 2)):  # A, A again (a hit), then B
            m.allocate(seq, bs + 1, token_ids=prompt(tag, bs, seq))
            m.free(seq)
            m.check_integrity()
        assert m.stats.prefix_hit_tokens == bs  # the second A hit A's full block
        seq = 10
        while hit(m, 1, bs) and hit(m, 2, bs):
            assert m.allocate(seq, 1) == 0  # one block, no tokens: evicts once none is uncached
            m.check_integrity()
            seq += 1
        assert m.stats.evictions > 0
        kept[policy] = [tag for tag in (1, 2) if hit(m, tag, bs)]
    assert kept == {"lru": [2], "lfu": [1]}


@pytest.mark.parametrize("bs", BLOCK_SIZES)
@pytest.mark.parametrize("policy", POLICIES)
def test_uncached_free_blocks_go_before_any_cached_one(bs: int, policy: str) -> None:
    m = manager(bs, 6, policy)
    m.allocate(1, 2 * bs + 1, token_ids=[5] * (2 * bs + 1))  # 2 keyed blocks (3 if bs is 1)
    m.free(1)
    cached = m.gpu.num_cached_free
    assert cached == (3 if bs == 1 else 2)
    m.allocate(2, (m.num_free_blocks - cached) * bs)  # exactly the uncached free blocks
    assert m.stats.evictions == 0
    assert m.gpu.num_cached_free == cached
    assert m.lookup_prefix([5] * (2 * bs + 1)).num_computed_tokens == 2 * bs
    m.check_integrity()


def test_the_pool_follows_the_policy_and_lru_keeps_the_plain_pool() -> None:
    lru = gpu_pool(CacheConfig(num_gpu_blocks=8, enable_prefix_caching=True))
    assert type(lru) is BlockPool  # the hot path runs exactly the LRU code
    for policy in EvictionPolicy:  # nothing cached: nothing to rank, the plain stack
        off = CacheConfig(num_gpu_blocks=8, eviction_policy=policy)
        assert type(gpu_pool(off)) is UncachedBlockPool
    on = CacheConfig(num_gpu_blocks=8, enable_prefix_caching=True, eviction_policy="lfu")  # type: ignore[arg-type]
    assert type(gpu_pool(on)) is LFUBlockPool
    assert on.eviction_policy is EvictionPolicy.LFU


@pytest.mark.parametrize("bad", ["LFU", "fifo", 1, None])
def test_a_bad_policy_names_the_field_and_the_choices(bad: object) -> None:
    with pytest.raises(ConfigError) as info:
        CacheConfig(eviction_policy=bad)  # type: ignore[arg-type]
    assert info.value.field == "eviction_policy"
    assert "'lru'" in str(info.value)
    assert "'lfu'" in str(info.value)
    with pytest.raises(ConfigError):
        SimulationConfig.from_flat({"eviction_policy": bad})


def test_the_stale_heap_entries_stay_bounded() -> None:
    """Hits on a free cached block leave stale heap entries; rebuilds keep them O(live)."""
    pool = LFUBlockPool(4)
    block = pool.allocate()
    pool.cache_block(block, b"k" * 32)
    for _ in range(1000):
        pool.decref(block)
        pool.incref(block)  # a hit: its entry goes stale
    assert len(pool._heap) <= 2 * pool.num_cached_free + 64 + 1
    assert pool.uses[block] == 1001
    pool.check_integrity([1 if b == block else 0 for b in range(4)])


# ----- model-based: every eviction is the one the policy's definition names --------------------
class PoolModel(RuleBasedStateMachine):
    """Random allocate / free / hit / cache operations on a pool, beside a plain model: each
    block's uses (references taken since its allocation) and when it was last freed. An
    allocation with no uncached free block must evict the cached free block that is minimal by
    (freed) under LRU, by (uses, freed) under LFU."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(1)
        self.policy = "lru"
        self.refs: list[int] = []
        self.uses: dict[int, int] = {}
        self.freed_at: dict[int, int] = {}  # block -> time of its last free
        self.clock = 0
        self.keys = 0

    @initialize(policy=st.sampled_from(POLICIES), blocks=st.integers(1, 12))
    def setup(self, policy: str, blocks: int) -> None:
        self.policy = policy
        self.pool = (
            LFUBlockPool(blocks) if policy == "lfu" else BlockPool(blocks, enable_caching=True)
        )
        self.refs = [0] * blocks

    def free_cached(self) -> list[int]:
        return [
            b for b, r in enumerate(self.refs) if r == 0 and self.pool.block_hash[b] is not None
        ]

    def rank(self, block: int) -> tuple[int, ...]:
        if self.policy == "lru":
            return (self.freed_at[block],)
        return (self.uses[block], self.freed_at[block])

    @precondition(lambda self: 0 in self.refs)
    @rule()
    def allocate(self) -> None:
        uncached = [b for b, r in enumerate(self.refs) if r == 0 and b not in self.free_cached()]
        cached = self.free_cached()
        evictions = self.pool.num_evictions
        block = self.pool.allocate()
        if uncached:
            assert block in uncached
            assert self.pool.num_evictions == evictions
        else:
            event("eviction")
            assert self.pool.num_evictions == evictions + 1
            assert self.rank(block) == min(self.rank(b) for b in cached)
            assert self.pool.block_hash[block] is None
        self.refs[block] = 1
        self.uses[block] = 1

    @precondition(lambda self: any(self.refs))
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        block = data.draw(st.sampled_from([b for b, r in enumerate(self.refs) if r]))
        became_free = self.pool.decref(block)
        self.refs[block] -= 1
        assert became_free == (self.refs[block] == 0)
        if became_free:
            self.clock += 1
            self.freed_at[block] = self.clock

    @precondition(lambda self: any(self.refs) or bool(self.free_cached()))
    @rule(data=st.data())
    def hit(self, data: st.DataObject) -> None:
        """A reference on a used block (a hit or a fork) or on a free cached one (a hit)."""
        choices = [b for b, r in enumerate(self.refs) if r] + self.free_cached()
        block = data.draw(st.sampled_from(choices))
        if self.refs[block] == 0:
            event("hit on a free cached block")
            assert self.pool.lookup(self.pool.block_hash[block] or b"") == block
        self.pool.incref(block)
        self.refs[block] += 1
        self.uses[block] += 1

    @precondition(
        lambda self: any(
            r and k is None for r, k in zip(self.refs, self.pool.block_hash, strict=True)
        )
    )
    @rule(data=st.data())
    def cache(self, data: st.DataObject) -> None:
        unkeyed = [b for b, r in enumerate(self.refs) if r and self.pool.block_hash[b] is None]
        block = data.draw(st.sampled_from(unkeyed))
        self.keys += 1
        assert self.pool.cache_block(block, self.keys.to_bytes(32, "little"))

    @invariant()
    def books_are_whole(self) -> None:
        self.pool.check_integrity(self.refs)
        assert self.pool.num_free == self.refs.count(0)
        if isinstance(self.pool, LFUBlockPool):
            for b, r in enumerate(self.refs):
                if r or self.pool.block_hash[b] is not None:
                    assert self.pool.uses[b] == self.uses[b]
        order = self.pool.free_blocks()  # uncached first, then cached in eviction order
        cached = [b for b in order if self.pool.block_hash[b] is not None]
        assert order[len(order) - len(cached) :] == cached
        assert cached == sorted(cached, key=self.rank)


PoolModel.TestCase.settings = settings(max_examples=150, stateful_step_count=50, deadline=None)
TestPoolModel = PoolModel.TestCase


# ----- the simulator: the flag, the YAML key, and no eviction means no difference -------------
def _flat(num_gpu_blocks: int, policy: str) -> dict[str, object]:
    return {
        "workload": "shared-prefix",
        "prefix_len": 64,
        "num_prefixes": 8,
        "share_ratio": 0.5,
        "num_requests": 40,
        "lengths": "alpaca-like",
        "request_rate": 10.0,
        "cost_model": "unit",
        "enable_prefix_caching": True,
        "num_gpu_blocks": num_gpu_blocks,
        "eviction_policy": policy,
    }


def test_without_evictions_the_policies_give_the_same_run() -> None:
    runs = {p: simulate(SimulationConfig.from_flat(_flat(4000, p))).to_dict() for p in POLICIES}
    assert runs["lfu"]["config"]["eviction_policy"] == "lfu"
    assert runs["lfu"]["summary"]["prefix_cache"]["evictions"] == 0
    assert runs["lru"]["summary"] == runs["lfu"]["summary"]
    assert runs["lru"]["requests"] == runs["lfu"]["requests"]


def test_lfu_runs_whole_under_eviction_pressure() -> None:
    result = simulate(SimulationConfig.from_flat(_flat(60, "lfu")), check_integrity=True)
    assert result.summary["prefix_cache"]["evictions"] > 0
    assert result.summary["finished"] == 40


def test_the_cli_flag_and_the_yaml_key(tmp_path: Path) -> None:
    base = ["simulate", "--workload", "lesson", "--cost-model", "unit", "--num-gpu-blocks", "100"]
    out = tmp_path / "flag.json"
    assert main([*base, "--eviction-policy", "lfu", "--quiet", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["config"]["eviction_policy"] == "lfu"
    yaml = tmp_path / "c.yaml"
    yaml.write_text("workload: lesson\ncost_model: unit\neviction_policy: lfu\n")
    assert SimulationConfig.from_yaml(yaml).hardware.eviction_policy is EvictionPolicy.LFU
    bad = tmp_path / "bad.json"
    assert main([*base, "--eviction-policy", "fifo", "--quiet", "--json", str(bad)]) == 2
    assert not bad.exists()

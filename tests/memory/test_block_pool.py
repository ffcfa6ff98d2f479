"""BlockPool: reference counts, the O(1) free queue in eviction order, the prefix cache."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from pagedkv.errors import IntegrityError, PagedKVError
from pagedkv.memory.block_pool import BlockPool, UncachedBlockPool
from tests.memory.pool_diff import OPS, drive


def test_allocate_takes_every_block_once_then_refuses() -> None:
    pool = BlockPool(5)
    got = [pool.allocate() for _ in range(5)]
    assert sorted(got) == list(range(5))
    assert pool.num_free == 0
    assert pool.num_used == 5
    with pytest.raises(PagedKVError):
        pool.allocate()


def test_free_only_at_zero_and_never_twice() -> None:
    pool = BlockPool(3)
    b = pool.allocate()
    pool.incref(b)
    assert pool.decref(b) is False  # still referenced
    assert pool.num_free == 2
    assert pool.decref(b) is True
    assert pool.num_free == 3
    with pytest.raises(IntegrityError):
        pool.decref(b)


def test_uncached_freed_block_is_reused_first() -> None:
    pool = BlockPool(4, enable_caching=True)
    a, b = pool.allocate(), pool.allocate()
    assert pool.cache_block(a, b"k" * 32)
    pool.decref(a)  # cached: goes to the tail
    pool.decref(b)  # uncached: goes to the head
    assert pool.free_blocks()[0] == b
    assert pool.free_blocks()[-1] == a
    assert pool.allocate() == b


def test_lru_eviction_drops_the_key_of_the_least_recently_freed() -> None:
    pool = BlockPool(2, enable_caching=True)
    a, b = pool.allocate(), pool.allocate()
    pool.cache_block(a, b"a" * 32)
    pool.cache_block(b, b"b" * 32)
    pool.decref(b)
    pool.decref(a)  # a is the most recently used
    assert pool.num_cached_free == 2
    first = pool.allocate()
    assert first == b
    assert pool.lookup(b"b" * 32) is None
    assert pool.lookup(b"a" * 32) == a
    assert pool.num_evictions == 1
    assert pool.num_cached_free == 1


def test_hit_on_free_cached_block_takes_it_out_of_the_queue() -> None:
    pool = BlockPool(3, enable_caching=True)
    a = pool.allocate()
    pool.cache_block(a, b"x" * 32)
    pool.decref(a)
    assert a in pool.free_blocks()
    pool.incref(a)
    assert a not in pool.free_blocks()
    assert pool.ref_counts[a] == 1
    assert pool.num_cached_free == 0
    pool.check_integrity([1 if i == a else 0 for i in range(3)])


def test_cache_block_keeps_the_first_holder_of_a_key() -> None:
    pool = BlockPool(2, enable_caching=True)
    a, b = pool.allocate(), pool.allocate()
    assert pool.cache_block(a, b"k" * 32)
    assert not pool.cache_block(b, b"k" * 32)
    assert pool.lookup(b"k" * 32) == a
    assert pool.block_hash[b] is None


def test_caching_disabled_never_caches() -> None:
    pool = BlockPool(2)
    a = pool.allocate()
    assert not pool.cache_block(a, b"k" * 32)
    assert pool.num_cached == 0


def test_check_integrity_catches_a_wrong_count() -> None:
    pool = BlockPool(3)
    pool.allocate()
    with pytest.raises(IntegrityError):
        pool.check_integrity([0, 0, 0])


def test_a_free_block_in_a_released_chain_is_caught() -> None:
    """The stack pool's chain release trusts its O(1) test (every used block held once) and
    does not look at each count; a free block named in the chain is then caught by the
    integrity check (the free stack holds it twice), as the slow path would have raised."""
    pool = UncachedBlockPool(4)
    held = pool.allocate_many(2)
    pool.release(held[:1])
    pool.release(held)  # held[0] is free already: a double free
    with pytest.raises(IntegrityError):
        pool.check_integrity([0] * 4)


@settings(max_examples=150, deadline=None)
@given(size=st.integers(1, 12), ops=OPS)
def test_the_stack_pool_hands_out_what_the_queue_pool_does(
    size: int, ops: list[tuple[str, int]]
) -> None:
    """Differential: the list-stack pool (caching off) and BlockPool without caching take the
    same blocks in the same order through any allocate (one or many) / incref / decref / release
    sequence."""
    drive(BlockPool(size), UncachedBlockPool(size), ops)


def _state(pool: BlockPool) -> tuple[object, ...]:
    return (
        pool.ref_counts,
        pool.block_hash,
        pool.free_blocks(),
        dict(pool._cache),
        pool.num_cached_free,
        pool.num_evictions,
        pool.num_refs,
    )


bulk_ops = st.lists(
    st.tuples(st.sampled_from(["allocate", "release", "cache", "hit"]), st.integers(0, 6)),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(bulk_ops, st.booleans())
def test_bulk_steps_are_the_single_steps(ops: list[tuple[str, int]], caching: bool) -> None:
    """Differential: ``allocate_many``, ``release`` and ``cache_many`` (one loop each; and
    ``cache_new`` where every pair is new) leave a pool exactly as ``allocate``, ``decref`` and
    ``cache_block`` one at a time do, evictions, the free queue's order and double frees
    included; ``hits`` walks a chain as ``lookup`` of each key to the first miss."""
    bulk, single = BlockPool(8, enable_caching=caching), BlockPool(8, enable_caching=caching)
    held: list[int] = []
    made = 0
    for op, n in ops:
        if op == "allocate":
            n = min(n, bulk.num_free)
            got = bulk.allocate_many(n)
            assert got == [single.allocate() for _ in range(n)]
            held += got
        elif op == "release":  # the newest n held, with a block named twice now and then
            some = held[-n:] if n else []
            del held[len(held) - len(some) :]
            if n == 6 and some:
                some.append(some[0])  # a double free: both raise, their books alike
            try:
                freed = bulk.release(list(some))
            except IntegrityError:
                with pytest.raises(IntegrityError):
                    single._release_each(list(some))
            else:
                assert freed == single._release_each(list(some))
        elif op == "cache":  # keys from a small set, so some are held already
            blocks = held[-n:] if n else []
            keys = [bytes([(b * 3 + made) % 5]) * 32 for b in blocks]
            made += 1
            fresh = len(set(keys)) == len(keys) and not bulk.any_cached(keys)
            if fresh and all(bulk.block_hash[b] is None for b in blocks):
                bulk.cache_new(blocks, keys)  # (its callers' case: every pair registers)
            else:
                bulk.cache_many(blocks, keys)
            for block, key in zip(blocks, keys, strict=True):
                single.cache_block(block, key)
        else:  # a hit revives a free cached block
            key = bytes([n % 5]) * 32
            hit = bulk.lookup(key)
            assert hit == single.lookup(key)
            assert bulk.any_cached([key, b"x" * 32]) == (hit is not None)
            chain = [bytes([k % 5]) * 32 for k in range(n, n + 3)]
            walk = [single.lookup(k) for k in chain]
            assert bulk.hits(chain) == [*walk, None][: [*walk, None].index(None)]
            if hit is not None:
                bulk.incref(hit)
                single.incref(hit)
                held.append(hit)
        assert _state(bulk) == _state(single)

"""``V1BlockPool``, vLLM 0.33's block pool (the vllm-v1 policy's): uncached blocks freed
together go to the head in the order given, cached ones to the tail, a key may be cached on
several blocks (a lookup finds the earliest still cached), and the books stay whole; checked
against a plain model of vLLM's queue and hash map under random operations."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from pagedkv.memory.eviction import V1BlockPool, V1UncachedBlockPool, v1_pool
from pagedkv.memory.prefix_hash import hash_block
from tests.memory.pool_diff import OPS, drive


def key(n: int) -> bytes:
    return hash_block(None, (n,))


def test_uncached_frees_go_to_the_head_in_order_and_cached_to_the_tail() -> None:
    pool = V1BlockPool(6, enable_caching=True)
    a, b, c, d = pool.allocate_many(4)
    pool.cache_block(c, key(1))
    pool.release([a, b, c, d])  # d, a, b uncached; c cached
    assert pool.free_blocks() == [a, b, d, 4, 5, c]
    pool.check_integrity([0] * 6)


def test_a_key_on_two_blocks_survives_the_eviction_of_the_first() -> None:
    pool = V1BlockPool(3, enable_caching=True)
    x, y = pool.allocate_many(2)
    assert pool.cache_block(x, key(7))
    assert pool.cache_block(y, key(7))
    assert pool.lookup(key(7)) == x
    pool.release([x])
    pool.release([y])  # free queue: 2, x, y
    pool.check_integrity([0, 0, 0])
    assert pool.allocate() == 2
    assert pool.allocate() == x  # evicts x's copy of the key
    assert pool.lookup(key(7)) == y
    assert pool.allocate() == y
    assert pool.lookup(key(7)) is None
    pool.check_integrity([1, 1, 1])


ops = st.lists(
    st.tuples(st.sampled_from(["alloc", "free", "cache", "hit"]), st.integers(0, 7)),
    max_size=80,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_the_pool_follows_a_model_of_vllms_queue(steps: list[tuple[str, int]]) -> None:
    """Model: a free list (head first) and key -> [blocks in caching order]."""
    n = 6
    pool = V1BlockPool(n, enable_caching=True)
    free = list(range(n))
    refs = [0] * n
    keys: dict[int, int] = {}  # block -> key number
    cached: dict[int, list[int]] = {}
    for op, arg in steps:
        if op == "alloc" and free:
            block = free.pop(0)
            if block in keys:
                cached[keys[block]].remove(block)
                del keys[block]
            refs[block] = 1
            assert pool.allocate() == block
        elif op == "free":
            held = [b for b in range(n) if refs[b]]
            if not held:
                continue
            chosen = held[: 1 + arg % len(held)]
            for b in chosen:
                refs[b] -= 1
            now = [b for b in chosen if refs[b] == 0]
            free = [b for b in now if b not in keys] + free + [b for b in now if b in keys]
            pool.release(chosen)
        elif op == "cache":
            held = [b for b in range(n) if refs[b] and b not in keys]
            if held:
                block = held[arg % len(held)]
                keys[block] = arg % 3
                cached.setdefault(arg % 3, []).append(block)
                assert pool.cache_block(block, key(arg % 3))
        elif op == "hit":
            want = cached.get(arg % 3)
            got = pool.lookup(key(arg % 3))
            assert got == (want[0] if want else None)
            if got is not None:
                if refs[got] == 0:
                    free.remove(got)
                refs[got] += 1
                pool.incref(got)
        assert pool.free_blocks() == free
        pool.check_integrity(refs)


@settings(max_examples=150, deadline=None)
@given(size=st.integers(1, 12), steps=OPS)
def test_the_uncached_stack_hands_out_what_the_v1_queue_does(
    size: int, steps: list[tuple[str, int]]
) -> None:
    """Differential: ``v1_pool`` without caching (a stack) and ``V1BlockPool`` with caching
    off take the same blocks in the same order and free them to the same places, through any
    allocate (one or many) / incref / decref / release sequence, double frees included."""
    stack = v1_pool(size, enable_caching=False)
    assert isinstance(stack, V1UncachedBlockPool)
    drive(V1BlockPool(size), stack, steps)

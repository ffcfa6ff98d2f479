"""Prefix caching: full blocks only, chained keys, never the last prompt token, LRU eviction."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from pagedkv.memory.block_table import cdiv
from pagedkv.memory.config import CacheConfig
from pagedkv.memory.eviction import v1_pool
from pagedkv.memory.interface import AllocStatus
from pagedkv.memory.manager import KVCacheManager
from pagedkv.memory.prefix_hash import hash_block
from pagedkv.memory.token_runs import TokenRuns
from tests.factories import BLOCK_SIZES, make_manager, make_request


@pytest.mark.parametrize("bs", BLOCK_SIZES)
@pytest.mark.parametrize("extra", [0, 1, 3])
def test_second_request_hits_the_shared_prefix(bs: int, extra: int) -> None:
    m = make_manager(bs, 64, prefix_caching=True)
    prefix = tuple(range(3 * bs))
    a = make_request(1, prompt_len=3 * bs + extra, prefix=prefix)
    b = make_request(2, prompt_len=3 * bs + extra, prefix=prefix)
    assert a.token_ids is not None
    assert b.token_ids is not None
    assert m.allocate(a.seq_id, a.prompt_len, token_ids=a.token_ids) == 0
    hit = m.allocate(b.seq_id, b.prompt_len, token_ids=b.token_ids)
    # Whole blocks within the first P - 1 tokens: with extra == 0 the last prefix block is
    # recomputed, because the last prompt token needs its logits.
    expect_blocks = min(3, (b.prompt_len - 1) // bs)
    assert hit == expect_blocks * bs
    assert m.block_ids(2)[:expect_blocks] == m.block_ids(1)[:expect_blocks]
    assert m.stats.prefix_hit_tokens == hit
    assert m.stats.prefix_query_tokens == a.prompt_len + b.prompt_len
    m.check_integrity()


@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_different_prefixes_never_share(bs: int) -> None:
    m = make_manager(bs, 64, prefix_caching=True)
    a = make_request(1, prompt_len=4 * bs, prefix=tuple(range(4 * bs)))
    b = make_request(2, prompt_len=4 * bs, prefix=(7, *range(1, 4 * bs)))  # differs in token 0
    assert a.token_ids is not None
    assert b.token_ids is not None
    m.allocate(1, a.prompt_len, token_ids=a.token_ids)
    assert m.allocate(2, b.prompt_len, token_ids=b.token_ids) == 0
    assert not set(m.block_ids(1)) & set(m.block_ids(2))


@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_freed_blocks_stay_cached_and_revive(bs: int) -> None:
    m = make_manager(bs, 16, prefix_caching=True)
    toks = tuple(range(4 * bs + 1))
    m.allocate("a", len(toks), token_ids=toks)
    full = m.block_ids("a")[:4]
    m.free("a")
    assert m.stats.num_cached_free_blocks == len(toks) // bs  # every full block
    assert m.num_free_blocks == 16
    assert m.lookup_prefix(toks).blocks == tuple(full)
    assert m.allocate("b", len(toks), token_ids=toks) == 4 * bs
    assert m.block_ids("b")[:4] == full
    # Only a full last block (bs 1) stays cached-free: the recomputed last token got a new one.
    assert m.stats.num_cached_free_blocks == len(toks) // bs - 4
    m.check_integrity()


@pytest.mark.parametrize("bs", [2, 16, 7])
def test_eviction_is_lru_with_the_chain_tail_first(bs: int) -> None:
    m = make_manager(bs, 6, prefix_caching=True)
    old = tuple(range(100, 100 + 2 * bs + 1))
    new = tuple(range(500, 500 + 2 * bs + 1))
    m.allocate("old", len(old), token_ids=old)
    m.free("old")
    m.allocate("new", len(new), token_ids=new)
    m.free("new")
    # 6 free blocks: 2 uncached partial tails at the head, then old's chain, then new's.
    m.allocate("x", 3 * bs)  # takes the 2 uncached blocks and 1 cached: old's tail
    assert m.stats.evictions == 1
    assert m.lookup_prefix(old).num_computed_tokens == bs  # head of old's chain survives
    assert m.lookup_prefix(new).num_computed_tokens == 2 * bs
    m.check_integrity()


@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_hits_on_used_blocks_cost_no_free_blocks(bs: int) -> None:
    m = make_manager(bs, 5, prefix_caching=True)
    toks = tuple(range(3 * bs + 1))
    m.allocate("a", len(toks), token_ids=toks)  # 4 blocks, 1 free left
    assert m.can_allocate("b", len(toks), token_ids=toks) is AllocStatus.OK
    assert m.can_allocate("c", len(toks)) is AllocStatus.LATER  # no ids: no hits
    assert m.allocate("b", len(toks), token_ids=toks) == 3 * bs
    m.check_integrity()


@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_salt_keeps_tenants_apart(bs: int) -> None:
    m = make_manager(bs, 32, prefix_caching=True)
    toks = tuple(range(2 * bs + 1))
    m.allocate("a", len(toks), token_ids=toks, cache_salt="tenant-a")
    assert m.allocate("b", len(toks), token_ids=toks, cache_salt="tenant-b") == 0
    assert m.allocate("c", len(toks), token_ids=toks, cache_salt="tenant-a") == 2 * bs


@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_generated_tokens_become_cacheable(bs: int) -> None:
    m = make_manager(bs, 32, prefix_caching=True)
    prompt = tuple(range(bs))
    m.allocate("a", bs, token_ids=prompt)
    out = tuple(range(900, 900 + bs))
    for t in out:
        m.append_slots("a", 1, token_ids=[t])
    m.check_integrity()
    conversation = prompt + out + (1,)
    assert m.lookup_prefix(conversation).num_computed_tokens == 2 * bs


@pytest.mark.parametrize("v1", [False, True])
@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_a_last_key_taken_back_is_made_again_later(bs: int, v1: bool) -> None:
    """``take_back_last_keys``: the key of a last block its last token filled leaves the
    table and the cache map (a lookup stops before it), a partial last block keeps its keys,
    and ``cache_known_blocks`` makes it again. On vLLM's pool a key may sit on two blocks:
    taken back from the first, the lookup finds the second; the base pool caches a key once."""
    cache = CacheConfig(num_gpu_blocks=32, block_size=bs, enable_prefix_caching=True)
    m = KVCacheManager(cache, v1_pool(32, enable_caching=True) if v1 else None)
    prompt = tuple(range(2 * bs))
    asked = (*prompt, 7)
    m.allocate("a", 2 * bs, token_ids=prompt)
    m.allocate("b", bs + 1, token_ids=prompt[: bs + 1])  # a hit, then a partial block
    m.take_back_last_keys(["a", "b"])
    m.check_integrity()
    assert m.lookup_prefix(asked).num_computed_tokens == bs
    m.allocate("c", 2 * bs, token_ids=prompt)  # computes its own second block, keyed
    m.cache_known_blocks("a", 2 * bs)  # a's second block keyed again (v1: a second copy)
    m.take_back_last_keys(["c"])
    m.check_integrity()
    assert m.lookup_prefix(asked).num_computed_tokens == (2 * bs if v1 else bs)
    m.cache_known_blocks("c", 2 * bs)
    m.check_integrity()
    assert m.lookup_prefix(asked).num_computed_tokens == 2 * bs


@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_caching_off_means_no_hits(bs: int) -> None:
    m = make_manager(bs, 32, prefix_caching=False)
    toks = tuple(range(3 * bs))
    m.allocate("a", len(toks), token_ids=toks)
    assert m.allocate("b", len(toks), token_ids=toks) == 0
    assert m.stats.prefix_query_tokens == 0


@pytest.mark.parametrize("bs", [2, 16, 7])
def test_swap_in_reuses_a_block_still_cached_on_gpu(bs: int) -> None:
    m = make_manager(bs, 8, num_cpu_blocks=8, prefix_caching=True)
    toks = tuple(range(2 * bs + 1))
    m.allocate("a", len(toks), token_ids=toks)
    m.allocate("b", len(toks), token_ids=toks)  # shares a's 2 full blocks
    out = m.swap_out(["a"])
    assert out is not None
    assert len(out) == 3
    back = m.swap_in(["a"])
    assert back is not None
    assert len(back) == 1  # only the partial block travels; full ones are still on the GPU
    assert m.block_ids("a")[:2] == m.block_ids("b")[:2]
    m.check_integrity()


@settings(max_examples=100, deadline=None)
@given(
    bs=st.sampled_from(BLOCK_SIZES),
    spare=st.integers(0, 6),
    prompt=st.integers(1, 30),
    outputs=st.integers(1, 30),
    cuts=st.lists(st.integers(1, 30), max_size=6),
    alphabet=st.sampled_from([2, 10**6]),
)
def test_one_append_of_many_tokens_equals_many_appends_of_one(
    bs: int, spare: int, prompt: int, outputs: int, cuts: list[int], alphabet: int
) -> None:
    """What the fast-forward relies on, with prefix caching: appending k tokens at once leaves
    the books as k appends of one do (the same blocks taken, keyed, evicted, in the same free
    order), also when the new tokens give keys that free cached blocks hold (a request that
    repeats a finished one's output). Found by tests/test_fuzz_configs.py: evictions differed."""
    prompt_ids = [k % alphabet for k in range(prompt)]
    out_ids = [(7 * k + 3) % alphabet for k in range(outputs)]
    pool = cdiv(prompt + outputs, bs) + 1 + spare

    def run(chunks: list[int]) -> object:
        m = make_manager(bs, pool, prefix_caching=True)
        for seq in (1, 2):  # the second repeats the first: its output keys are cached, free
            if m.allocate(seq, prompt, token_ids=prompt_ids) is None:
                return None
            done = 0
            for n in chunks:
                if m.append_slots(seq, n, token_ids=out_ids[done : done + n]) is None:
                    return None
                done += n
            m.check_integrity()
            m.free(seq)
        return m.gpu.free_blocks(), list(m.gpu.block_hash), m.stats

    chunks, left = [], outputs
    for c in cuts:
        if left:
            chunks.append(min(c, left))
            left -= chunks[-1]
    chunks += [left] if left else []
    assert run(chunks) == run([1] * outputs)


@settings(max_examples=100, deadline=None)
@given(
    bs=st.sampled_from(BLOCK_SIZES),
    spare=st.integers(0, 6),
    prompt=st.integers(1, 20),
    outputs=st.integers(2, 20),
    width=st.integers(2, 3),
    alphabet=st.sampled_from([2, 10**6]),
)
def test_a_bulk_append_of_many_rounds_equals_the_rounds(
    bs: int, spare: int, prompt: int, outputs: int, width: int, alphabet: int
) -> None:
    """The fast-forward's window, with prefix caching: ``append_slots_all(seqs, k)`` leaves
    the books as k rounds of one token each do, when equal requests run together and a
    finished one's blocks are cached free (whose key a sequence registers first, and what an
    allocation evicts before, depend on the order; found by tests/test_fuzz_configs.py)."""
    prompt_ids = [k % alphabet for k in range(prompt)]
    out_ids = [(7 * k + 3) % alphabet for k in range(outputs)]
    pool = width * cdiv(prompt + outputs, bs) + 1 + spare
    seqs = list(range(1, width + 1))

    def run(rounds: list[int]) -> object:
        m = make_manager(bs, pool, prefix_caching=True)
        m.allocate(0, prompt, token_ids=prompt_ids)  # finished before: cached, free
        m.append_slots(0, outputs, token_ids=out_ids)
        m.free(0)
        for seq in seqs:
            if m.allocate(seq, prompt, token_ids=prompt_ids) is None:
                return None
        done = 0
        for n in rounds:
            if not m.can_append_all(seqs, n):
                return None
            m.append_slots_all(seqs, n, [out_ids[done : done + n]] * width)
            done += n
        m.check_integrity()
        return m.gpu.free_blocks(), list(m.gpu.block_hash), m.stats, [m.block_ids(s) for s in seqs]

    assert run([outputs]) == run([1] * outputs)


def _walked(
    m: KVCacheManager, ids: list[int], salt: bytes | None
) -> tuple[tuple[int, ...], int, tuple[bytes, ...]]:
    """A lookup from first principles: chain ``hash_block`` over the whole blocks within the
    first len - 1 ids, stopping at the first key the pool does not hold."""
    bs = m.block_size
    blocks: list[int] = []
    keys: list[bytes] = []
    for j in range((len(ids) - 1) // bs):
        key = hash_block(keys[-1] if keys else None, ids[j * bs : (j + 1) * bs], salt)
        block = m.gpu.lookup(key)
        if block is None:
            break
        blocks.append(block)
        keys.append(key)
    return tuple(blocks), len(blocks) * bs, tuple(keys)


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(BLOCK_SIZES),
    st.lists(
        st.tuples(
            st.integers(0, 23),  # which prompt (more than the lookup keeps keys of)
            st.sampled_from(["list", "tuple", "runs"]),
            st.sampled_from([None, "t"]),
            st.sampled_from(["look", "allocate", "free"]),
        ),
        min_size=1,
        max_size=40,
    ),
)
def test_lookups_equal_the_chain_walked_afresh(
    bs: int, steps: list[tuple[int, str, str | None, str]]
) -> None:
    """Differential: ``lookup_prefix`` (which keeps the keys of the last ids it was asked, a
    waiting request being asked again at every step) finds exactly the blocks that walking
    the chain afresh finds, while allocations and frees change what the cache holds, with
    ids as lists, tuples or runs and with or without a salt."""
    prompts = [list(range(3 * bs + 1)), [*range(2 * bs), *range(500, 500 + 2 * bs)], [9] * 4 * bs]
    prompts.append(prompts[0][: bs + 1])
    prompts += [
        [*range(bs * (j % 4)), *range(10**6 * j, 10**6 * j + j % 3 * bs + 1)] for j in range(20)
    ]
    m = make_manager(bs, 12, prefix_caching=True)
    held: list[int] = []
    for n, (which, kind, salt, act) in enumerate(steps):
        ids = prompts[which]
        given_ids = {"list": list(ids), "tuple": tuple(ids), "runs": _runs(ids)}[kind]
        hit = m.lookup_prefix(given_ids, cache_salt=salt)
        assert (hit.blocks, hit.num_computed_tokens, hit.block_keys) == _walked(
            m, ids, None if salt is None else b"t"
        )
        if act == "allocate":
            if m.allocate(n, len(ids), token_ids=given_ids, cache_salt=salt) is not None:
                held.append(n)
        elif act == "free" and held:
            m.free(held.pop(0))
        m.check_integrity()


def _runs(ids: list[int]) -> TokenRuns:
    return TokenRuns(range(t, t + 1) for t in ids)

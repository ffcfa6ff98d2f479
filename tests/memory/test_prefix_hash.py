"""Prefix keys: chained, collision-resistant, deterministic."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given

from pagedkv.memory.prefix_hash import hash_block, hash_blocks, int64_le, iter_keys
from pagedkv.memory.token_runs import TokenRuns

tokens = st.lists(st.integers(min_value=0, max_value=2**40), min_size=1, max_size=40)


@given(tokens, tokens)
def test_different_blocks_have_different_keys(a: list[int], b: list[int]) -> None:
    assert (hash_block(None, a) == hash_block(None, b)) == (a == b)


@given(tokens, st.integers(1, 8))
def test_a_key_depends_on_the_whole_prefix(toks: list[int], bs: int) -> None:
    keys = hash_blocks(toks, bs)
    assert len(keys) == len(toks) // bs
    if len(keys) >= 2:
        changed = [toks[0] + 1, *toks[1:]]
        # Same last block, different first block: every key differs.
        assert all(x != y for x, y in zip(keys, hash_blocks(changed, bs), strict=True))


def test_salt_separates_tenants_and_is_chained() -> None:
    toks = list(range(32))
    plain, salted = hash_blocks(toks, 16), hash_blocks(toks, 16, salt=b"tenant")
    assert plain[0] != salted[0]
    assert plain[1] != salted[1]
    assert hash_blocks(toks, 16, salt=b"tenant") == salted


def test_keys_are_stable_32_byte_digests() -> None:
    key = hash_block(None, [1, 2, 3])
    assert len(key) == 32
    assert key == hash_block(None, (1, 2, 3))


def test_max_blocks_limits_the_chain() -> None:
    toks = list(range(64))
    assert hash_blocks(toks, 16, max_blocks=2) == hash_blocks(toks, 16)[:2]


@given(
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=60),
    st.integers(1, 8),
    st.sampled_from([None, b"", b"tenant"]),
    st.booleans(),
    st.booleans(),
)
def test_the_bulk_chain_is_hash_block_chained(
    toks: list[int], bs: int, salt: bytes | None, with_parent: bool, as_runs: bool
) -> None:
    """Differential: ``hash_blocks`` (one encoding, one digest per block) and ``iter_keys``
    give exactly the keys of ``hash_block`` applied block after block."""
    parent = hash_block(None, [7]) if with_parent else None
    want, key = [], parent
    for j in range(len(toks) // bs):
        key = hash_block(key, toks[j * bs : (j + 1) * bs], salt)
        want.append(key)
    ids = TokenRuns(range(t, t + 1) for t in toks) if as_runs else tuple(toks)
    assert hash_blocks(ids, bs, salt, parent) == want
    assert list(iter_keys(int64_le(ids), bs, salt, parent)) == want

"""Prefix keys: chained, collision-resistant, deterministic."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given

from pagedkv.memory.prefix_hash import block_code, hash_block, hash_blocks, iter_keys, keys_of
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
    st.data(),
)
def test_the_bulk_chain_is_hash_block_chained(
    toks: list[int],
    bs: int,
    salt: bytes | None,
    with_parent: bool,
    as_runs: bool,
    data: st.DataObject,
) -> None:
    """Differential: ``hash_blocks``, ``keys_of`` (any range of blocks, runs coded from their
    bounds) and ``iter_keys`` give exactly the keys of ``hash_block`` applied block after
    block."""
    parent = hash_block(None, [7]) if with_parent else None
    want, key = [], parent
    for j in range(len(toks) // bs):
        key = hash_block(key, toks[j * bs : (j + 1) * bs], salt)
        want.append(key)
    ids = TokenRuns(range(t, t + 1) for t in toks) if as_runs else tuple(toks)
    assert hash_blocks(ids, bs, salt, parent) == want
    if not with_parent:
        assert list(iter_keys(ids, bs, salt)) == want
    j1 = data.draw(st.integers(0, len(want)))
    j0 = data.draw(st.integers(0, j1))
    before = want[j0 - 1] if j0 else parent
    assert keys_of(ids, j0, j1, bs, salt, before) == want[j0:j1]


# Sequences made of runs that often continue one another (consecutive ids across a run's end,
# which merge), of runs that do not, and of single ids: every way a block can be consecutive or
# not, straddle runs or lie in one.
pieces = st.lists(
    st.tuples(st.sampled_from(["continue", "jump", "back"]), st.integers(0, 9)), max_size=8
)


def ids_of(parts: list[tuple[str, int]], base: int) -> list[int]:
    out: list[int] = []
    at = base
    for how, n in parts:
        if how == "jump":
            at += 1000
        elif how == "back":
            at -= 3
        out.extend(range(at, at + n))
        at += n
    return out


def as_held(ids: list[int], how: str) -> TokenRuns | tuple[int, ...] | list[int]:
    if how == "runs":  # (consecutive ids merge into one run)
        return TokenRuns(range(t, t + 1) for t in ids)
    return tuple(ids) if how == "tuple" else list(ids)


held = st.sampled_from(["runs", "tuple", "list"])


@given(pieces, pieces, st.integers(0, 3), st.integers(1, 6), held, held, st.booleans())
def test_keys_are_equal_iff_the_chained_prefixes_are(
    a: list[tuple[str, int]],
    b: list[tuple[str, int]],
    shift: int,
    bs: int,
    how_a: str,
    how_b: str,
    salted: bool,
) -> None:
    """Two sequences' keys of block j are equal exactly when their first (j + 1) x bs ids
    are, whatever holds the ids (runs, a tuple, a list) and whether a block is consecutive
    (coded by its bounds) or not (coded id by id)."""
    x, y = ids_of(a, 0), ids_of(b, shift)
    salt = b"tenant" if salted else None
    kx = hash_blocks(as_held(x, how_a), bs, salt)
    ky = hash_blocks(as_held(y, how_b), bs, salt)
    for j in range(min(len(kx), len(ky))):
        assert (kx[j] == ky[j]) == (x[: (j + 1) * bs] == y[: (j + 1) * bs])
    assert len(set(kx)) == len(kx)  # within one chain every key differs (each extends the last)


@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=12), st.booleans())
def test_a_block_code_depends_on_the_ids_alone(toks: list[int], as_runs: bool) -> None:
    """One code per content: runs of the same ids code alike, and ``R`` (first id and count)
    exactly when the ids are consecutive."""
    ids = TokenRuns(range(t, t + 1) for t in toks) if as_runs else toks
    code = block_code(ids)
    assert code == block_code(tuple(toks))
    consecutive = bool(toks) and toks == list(range(toks[0], toks[0] + len(toks)))
    assert code[:1] == (b"R" if consecutive else b"T")

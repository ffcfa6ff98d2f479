"""TokenRuns against the tuple of the same ids: every operation agrees (Hypothesis)."""

from __future__ import annotations

import pickle
import struct

import hypothesis.strategies as st
import pytest
from hypothesis import given

from pagedkv.errors import ConfigError
from pagedkv.memory.prefix_hash import check_token_ids, hash_block, hash_blocks
from pagedkv.memory.token_runs import TokenRuns
from pagedkv.workloads.spec import RequestSpec

run = st.builds(
    lambda start, n: range(start, start + n), st.integers(-(2**40), 2**40), st.integers(0, 9)
)
# Runs that often continue one another, so merging is exercised.
chained = st.lists(st.tuples(st.booleans(), st.integers(0, 6), st.integers(0, 50)), max_size=6)


def build(parts: list[tuple[bool, int, int]]) -> TokenRuns:
    runs, at = [], 0
    for jump, n, gap in parts:
        at = at + gap * 1000 if jump else at
        runs.append(range(at, at + n))
        at += n
    return TokenRuns(runs)


@given(st.lists(run, max_size=6))
def test_sequence_ops_match_the_tuple(runs: list[range]) -> None:
    ids = TokenRuns(runs)
    model = tuple(i for r in runs for i in r)
    assert len(ids) == len(model)
    assert tuple(ids) == model
    assert ids == model
    assert model == ids
    assert hash(ids) == hash(model)
    assert all(ids[i] == model[i] for i in range(-len(model), len(model)))
    for bad in (len(model), -len(model) - 1):
        with pytest.raises(IndexError):
            ids[bad]
    assert ids.bounds() == ((min(model), max(model)) if model else None)
    assert all(r.step == 1 and len(r) > 0 for r in ids.runs)
    assert all(a.stop != b.start for a, b in zip(ids.runs, ids.runs[1:], strict=False))


@given(st.lists(run, max_size=5), st.integers(-12, 60), st.integers(-12, 60))
def test_slices_match_the_tuple(runs: list[range], a: int, b: int) -> None:
    ids = TokenRuns(runs)
    model = tuple(i for r in runs for i in r)
    piece = ids[a:b]
    assert isinstance(piece, TokenRuns)
    assert piece == model[a:b]
    assert piece == TokenRuns([range(i, i + 1) for i in model[a:b]])  # one canonical form
    assert ids[a:] + ids[:a] == model[a:] + model[:a]


@given(chained, chained)
def test_concatenation_matches_the_tuple(
    x: list[tuple[bool, int, int]], y: list[tuple[bool, int, int]]
) -> None:
    a, b = build(x), build(y)
    both = a + b
    assert isinstance(both, TokenRuns)
    assert both == tuple(a) + tuple(b)
    assert len(both.runs) <= len(a.runs) + len(b.runs)
    assert a + tuple(b) == tuple(a) + tuple(b) == tuple(a) + b
    assert a + list(b) == tuple(a) + tuple(b)


@given(chained)
def test_keys_match_the_tuple(parts: list[tuple[bool, int, int]]) -> None:
    ids = build(parts)
    model = tuple(ids)
    assert hash_block(None, ids, b"salt") == hash_block(None, model, b"salt")
    assert hash_blocks(ids, 3) == hash_blocks(model, 3)
    check_token_ids("token_ids", ids)
    assert pickle.loads(pickle.dumps(ids)) == ids


def test_refusals() -> None:
    with pytest.raises(ValueError, match="step 1"):
        TokenRuns([range(0, 10, 2)])
    with pytest.raises(ConfigError, match=r"2\*\*63"):
        check_token_ids("token_ids", TokenRuns([range(2**63 - 2, 2**63 + 1)]))
    with pytest.raises(ConfigError, match="prompt_len = 4"):
        RequestSpec(0, 4, 1, token_ids=TokenRuns([range(5)]))
    with pytest.raises(ConfigError, match="token_ids"):
        RequestSpec(0, 2, 1, token_ids=TokenRuns([range(-1, 1)]))
    spec = RequestSpec(0, 3, 2, token_ids=TokenRuns([range(3)]), output_token_ids=(7, 8))
    assert spec.token_ids == (0, 1, 2)
    with pytest.raises(ValueError, match="step 1"):
        TokenRuns([range(4)])[::2]


@given(
    st.lists(
        st.one_of(st.integers(-(2**64), 2**64), st.booleans(), st.floats(), st.text(max_size=1)),
        max_size=3,
    )
)
def test_the_id_check_refuses_exactly_what_the_keys_cannot_encode(ids: list[object]) -> None:
    try:
        struct.pack(f"<{len(ids)}q", *ids)
        encodable = True
    except (struct.error, TypeError):
        encodable = False
    try:
        check_token_ids("token_ids", ids)  # type: ignore[arg-type]
        accepted = True
    except ConfigError:
        accepted = False
    assert accepted == encodable

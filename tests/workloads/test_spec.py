"""RequestSpec validation: every bad field is named, whichever path the check takes."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedkv.errors import ConfigError
from pagedkv.workloads.spec import RequestSpec, columns_pass


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("request_id", -1),
        ("request_id", True),
        ("prompt_len", 0),
        ("prompt_len", 3.0),
        ("output_len", False),
        ("arrival_time", -0.5),
        ("arrival_time", "1"),
        ("extra", []),
        ("extra", (("prompt_len", "1"),)),
        ("n", True),
        ("n", 0),
        ("beam_width", True),
        ("beam_seed", False),
        ("beam_seed", -1),
        ("think_time", False),
        ("think_time", float("inf")),
        ("parent_id", 7),  # its own id
        ("token_ids", (1, 2)),  # not prompt_len long
        ("token_ids", (1, 2, 2**63)),  # beyond int64
        ("token_ids", (1, -1, 2)),
        ("output_token_ids", (2**64, 0)),
    ],
)
def test_a_bad_field_is_named(field: str, value: Any) -> None:
    fields: dict[str, Any] = {"request_id": 7, "prompt_len": 3, "output_len": 2}
    fields[field] = value
    with pytest.raises(ConfigError) as err:
        RequestSpec(**fields)
    assert err.value.field == field


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"arrival_time": 0},
        {"arrival_time": 2.5, "think_time": 0},
        {"extra": (("prefix_id", "3"),)},
        {"n": 2},
        {"token_ids": (4, 5, 6), "parent_id": 1, "think_time": 1.5},
        {"token_ids": (0, 2**63 - 1, 6)},  # the int64 range, both ends
    ],
)
def test_good_specs_pass_either_path(fields: dict[str, Any]) -> None:
    spec = RequestSpec(request_id=7, prompt_len=3, output_len=2, **fields)
    assert spec.final_len == 5


_LEN = st.integers(-2, 5000) | st.booleans() | st.floats(-1, 10, allow_nan=False)
_TIME = st.floats(allow_nan=True) | st.integers(-3, 10**6) | st.booleans()


_VALID = st.tuples(st.integers(1, 5000), st.integers(1, 5000), st.floats(0, 1e9))


@given(st.lists(_VALID, max_size=12) | st.lists(_VALID | st.tuples(_LEN, _LEN, _TIME), max_size=4))
def test_columns_that_pass_in_bulk_make_the_specs_the_checks_make(
    rows: list[tuple[Any, Any, Any]],
) -> None:
    """columns_pass is sound: when it says the columns pass, every spec of them passes
    RequestSpec's own checks, and checked_already makes that very spec; when it does not,
    make_workload makes them through RequestSpec, which raises its one-line error."""
    prompts, outputs, times = [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]
    if not columns_pass(prompts, outputs, times):
        return
    for i, (p, o, t) in enumerate(rows):
        spec = RequestSpec(i, p, o, t)
        fast = RequestSpec.checked_already(i, p, o, t)
        assert fast == spec
        assert hash(fast) == hash(spec)
        assert [type(getattr(fast, f.name)) for f in dataclasses.fields(fast)] == [
            type(getattr(spec, f.name)) for f in dataclasses.fields(spec)
        ]


@pytest.mark.parametrize(
    ("prompts", "outputs", "times"),
    [([0], [1], [0.0]), ([1], [True], [0.0]), ([1], [1], [-1.0]), ([1], [1], [0])],
)
def test_columns_that_fail_in_bulk_are_refused(
    prompts: list[Any], outputs: list[Any], times: list[Any]
) -> None:
    assert not columns_pass(prompts, outputs, times)


def test_a_bad_spec_still_gets_its_one_line_error() -> None:
    with pytest.raises(ConfigError) as info:
        RequestSpec(0, 0, 5)
    assert str(info.value).splitlines() == [str(info.value)]
    assert info.value.field == "prompt_len"


_ID = (
    st.integers(-3, 2**64)
    | st.sampled_from([0, 2**63 - 1, 2**63])
    | st.booleans()
    | st.floats(0, 9)
)


@given(st.lists(_ID, min_size=1, max_size=6))
def test_prompt_ids_pass_exactly_when_each_is_a_plain_int64_id(ids: list[Any]) -> None:
    """The tuple check (in bulk) accepts exactly what the per-id rule does: each a plain
    int (no bool, no float) in [0, 2^63 - 1]; a refusal is one error naming token_ids."""
    each = all(type(t) is int and 0 <= t <= 2**63 - 1 for t in ids)
    if each:
        assert RequestSpec(0, len(ids), 1, token_ids=tuple(ids)).token_ids == tuple(ids)
    else:
        with pytest.raises(ConfigError) as info:
            RequestSpec(0, len(ids), 1, token_ids=tuple(ids))
        assert info.value.field == "token_ids"

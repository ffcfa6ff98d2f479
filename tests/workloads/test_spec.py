"""RequestSpec validation: every bad field is named, whichever path the check takes."""

from __future__ import annotations

from typing import Any

import pytest

from pagedkv.errors import ConfigError
from pagedkv.workloads.spec import RequestSpec


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

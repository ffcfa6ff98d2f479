"""Request's memory layout: slotted, and the forked samples' ids only once a group uses them."""

from __future__ import annotations

import pytest

from pagedkv.engine.request import Request
from pagedkv.workloads.spec import RequestSpec


def test_a_request_is_slotted_so_a_misspelt_field_is_an_error() -> None:
    r = Request.from_spec(RequestSpec(0, 10, 5, 1.5))
    with pytest.raises(AttributeError):
        r.num_computed_token = 3  # type: ignore[attr-defined]
    assert not hasattr(r, "__dict__")


def test_the_forked_ids_are_made_on_first_use_and_kept() -> None:
    r = Request.from_spec(RequestSpec(0, 10, 5, n=2))
    assert r._children is None  # a request that never forks holds no dict
    r.output_token_ids.append(7)
    r.num_output_tokens = 1
    r.complete_samples()  # unforked after its one token: the samples share it
    assert r.child_output_ids == {(0, 1): [7]}
    assert r.outputs_of((0, 1)) == [7]
    r.child_output_ids = {}
    assert r.child_output_ids == {}
    assert r.outputs_of(0) == [7]

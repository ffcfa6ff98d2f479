"""Kind 'random' (vllm bench serve --dataset-name random): vLLM's length ranges, its defaults,
one shared prefix, and the fixed kind when the range ratio is 0."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pagedkv.errors import ConfigError
from pagedkv.workloads.config import VLLM_RANDOM_DEFAULTS, WorkloadConfig
from pagedkv.workloads.factory import make_workload
from pagedkv.workloads.token_ids import owner_of

BIG = 1 << 16  # a max_model_len that cuts nothing here


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 2000),
    st.integers(1, 500),
    st.floats(0.0, 0.99),
    st.integers(0, 64),
    st.integers(0, 2**32),
)
def test_lengths_lie_in_vllms_ranges(
    input_len: int, output_len: int, ratio: float, prefix: int, seed: int
) -> None:
    lo_in, hi_in = math.floor(input_len * (1 - ratio)), math.ceil(input_len * (1 + ratio))
    assume(prefix + lo_in >= 1)  # vLLM refuses the rest (test_what_vllm_refuses_is_one_error)
    config = WorkloadConfig(
        kind="random",  # type: ignore[arg-type]
        num_requests=50,
        seed=seed,
        random_input_len=input_len,
        random_output_len=output_len,
        random_range_ratio=ratio,
        random_prefix_len=prefix,
        max_model_len=BIG,
    )
    lo_out = max(1, math.floor(output_len * (1 - ratio)))
    hi_out = max(1, math.ceil(output_len * (1 + ratio)))
    requests = make_workload(config)
    assert len(requests) == 50
    for r in requests:
        assert lo_in <= r.prompt_len - prefix <= hi_in
        assert lo_out <= r.output_len <= hi_out
        assert r.arrival_time == 0.0
        if prefix:  # one prefix, shared by all: prefix 0's ids, then the request's own
            assert r.token_ids is not None
            assert {owner_of(t) for t in r.token_ids[:prefix]} == {("prefix", 0)}
            assert {owner_of(t) for t in r.token_ids[prefix:]} <= {("request", r.request_id)}
        else:
            assert r.token_ids is None


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 2047), st.integers(1, 1000), st.integers(0, 2**32))
def test_ratio_zero_is_the_fixed_kind(input_len: int, output_len: int, seed: int) -> None:
    assume(input_len + output_len <= 2048)  # both kinds refuse requests they would all cut
    common = {"num_requests": 30, "seed": seed, "arrival": "poisson", "request_rate": 3.0}
    random = WorkloadConfig(
        kind="random",  # type: ignore[arg-type]
        random_input_len=input_len,
        random_output_len=output_len,
        **common,  # type: ignore[arg-type]
    )
    fixed = WorkloadConfig(
        kind="fixed",  # type: ignore[arg-type]
        prompt_len=input_len,
        output_len=output_len,
        **common,  # type: ignore[arg-type]
    )
    assert make_workload(random) == make_workload(fixed)


def test_vllms_defaults_fill_what_is_not_given() -> None:
    config = WorkloadConfig(kind="random")  # type: ignore[arg-type]
    assert {k: getattr(config, k) for k in VLLM_RANDOM_DEFAULTS} == VLLM_RANDOM_DEFAULTS
    assert config.num_requests == 1000  # vLLM's --num-prompts
    assert WorkloadConfig(**config.__dict__) == config  # filled, it validates again


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (
            {"kind": "fixed", "prompt_len": 5, "output_len": 5, "random_input_len": 9},
            "random_input_len",
        ),
        ({"random_prefix_len": 3}, "random_prefix_len"),
        ({"kind": "random", "random_range_ratio": 1.0}, "random_range_ratio"),
        ({"kind": "random", "random_range_ratio": -0.1}, "random_range_ratio"),
        ({"kind": "random", "random_input_len": 0}, "random_input_len"),
        ({"kind": "random", "random_input_len": 1, "random_range_ratio": 0.5}, "random_input_len"),
        ({"kind": "random", "random_output_len": 0}, "random_output_len"),
        ({"kind": "random", "random_prefix_len": 2047}, "random_prefix_len"),
        (
            {"kind": "random", "random_input_len": 2000, "random_output_len": 100},
            "random_input_len",
        ),
    ],
)
def test_what_vllm_refuses_is_one_error(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        WorkloadConfig(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_a_prefix_with_no_input_is_a_prompt() -> None:
    config = WorkloadConfig(
        kind="random",  # type: ignore[arg-type]
        num_requests=3,
        random_input_len=0,
        random_prefix_len=8,
    )
    assert [r.prompt_len for r in make_workload(config)] == [8, 8, 8]

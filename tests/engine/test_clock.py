"""The clock's integer ticks: the conversions, and what quantising prices to ticks costs in
fidelity (at most 1e-9 of a step's price against the float formulas)."""

from __future__ import annotations

import math

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from pagedkv.engine.batch_shape import BatchShape
from pagedkv.engine.clock import TICKS_PER_SECOND, to_seconds, to_ticks
from pagedkv.engine.cost_model import RooflineCost, expected_blocks
from pagedkv.engine.profile import Profile, load_profile
from pagedkv.engine.profiled_cost import ProfiledCost
from pagedkv.errors import ConfigError
from pagedkv.models.gpus import GPUS
from pagedkv.models.models import MODELS, ModelSpec
from pagedkv.profiles import builtin_names
from pagedkv.tensors.model_shapes import resolve_model
from pagedkv.workloads.spec import RequestSpec
from tests.engine.profiles import synthetic_profile
from tests.factories import make_engine

RELATIVE = 1e-9
chunks = st.lists(st.tuples(st.integers(0, 2048), st.integers(0, 4096)), min_size=1, max_size=12)
TINY = resolve_model("tiny-llama", "float32")[1]


@given(st.integers(0, 2**50))
def test_ticks_read_as_seconds_come_back(ticks: int) -> None:
    assert to_ticks(to_seconds(ticks)) == ticks


@given(st.floats(0, 1e6), st.floats(0, 1e6))
def test_to_ticks_keeps_the_order(a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    assert to_ticks(lo) <= to_ticks(hi)
    assert abs(to_seconds(to_ticks(a)) - a) <= max(1e-15 * a, 1 / TICKS_PER_SECOND)


def test_whole_seconds_are_exact() -> None:
    assert to_ticks(1.0) == TICKS_PER_SECOND
    assert to_seconds(3 * TICKS_PER_SECOND) == 3.0
    assert to_seconds(10**6 * TICKS_PER_SECOND + 1) == 1e6  # an int true division: rounded once


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_a_time_that_is_not_finite_is_refused_by_name(bad: float) -> None:
    with pytest.raises(ConfigError) as info:
        to_ticks(bad, "arrival_time")
    assert info.value.field == "arrival_time"


def test_an_engine_refuses_an_infinite_arrival_before_it_runs() -> None:
    with pytest.raises(ConfigError) as info:
        make_engine("vllm", [RequestSpec(0, 4, 4, 0.0), RequestSpec(1, 4, 4, math.inf)])
    assert info.value.field == "requests[1].arrival_time"


def roofline_seconds(cost: RooflineCost, shape: BatchShape) -> float:
    """The roofline's step time in floating point, from its docstring (one GPU, tp = 1)."""
    gpu, model, cfg = cost.gpu, cost.model, cost.config
    t, s, p, r = shape.as_tuple()
    flop_s = gpu.bf16_flops * cfg.compute_efficiency
    byte_s = gpu.mem_bandwidth * cfg.memory_efficiency
    flops = (
        2 * model.active_non_embedding_params * t
        + 2 * model.lm_head_params * s
        + model.num_layers * model.attention_flops_per_pair_per_layer * p
    )
    kv = model.kv_bytes_per_token_per_gpu(1)
    weights = (model.non_embedding_params + model.lm_head_params) * model.dtype_bytes
    block = cfg.paged_block_overhead * 16 * kv / byte_s
    memory = (weights + kv * (r + t)) / byte_s + block * expected_blocks(s, r, cfg.block_size)
    return max(flops / flop_s, memory) + cfg.step_overhead_s + cfg.per_sequence_s * s


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(GPUS)), st.sampled_from(sorted(MODELS)), chunks)
def test_roofline_prices_stay_within_1e_9_of_the_float_formula(
    gpu: str, model: str, cs: list[tuple[int, int]]
) -> None:
    cost = RooflineCost(GPUS[gpu], MODELS[model])
    shape = BatchShape.from_chunks(cs)
    want = roofline_seconds(cost, shape)
    assert abs(cost.step_time(shape) - want) <= RELATIVE * want


def test_the_opt_13b_a100_roofline_in_particular() -> None:
    cost = RooflineCost(GPUS["A100-40GB"], MODELS["OPT-13B"])
    for shape in (
        BatchShape.decode(1, 1),
        BatchShape.decode(256, 15_000),
        BatchShape.from_chunks([(2048, 0)]),
        BatchShape.from_chunks([(512, 1536)] * 8),
    ):
        want = roofline_seconds(cost, shape)
        assert abs(cost.step_time(shape) - want) <= RELATIVE * want


def profiled_seconds(cost: ProfiledCost, shape: BatchShape) -> float:
    """The profiled step time in floating point, from ``profiled_cost``'s docstring (tp = 1)."""
    p, layers = cost.profile, cost.model.num_layers
    t, s, pairs, reads = shape.as_tuple()
    decode = p.decode_attention[cost.block_size]
    if t == s:
        attention = decode.context.at(reads) + decode.per_sequence_s * s
    else:
        a = p.prefill_attention
        attention = (
            a.per_call_s + a.per_sequence_s * s + a.per_pair_s * pairs + a.per_read_token_s * reads
        )
    linear = p.linear.at(t) + (0.0 if p.layer_residual is None else p.layer_residual.at(t))
    return (
        p.per_iteration_s
        + p.per_sequence_s * s
        + p.per_token_s * t
        + p.embedding.at(t)
        + p.lm_head.at(s)
        + layers * (linear + attention)
    )


def _profiles() -> list[tuple[Profile, ModelSpec]]:
    out = [(synthetic_profile(TINY, [16], seed), TINY) for seed in range(4)]
    for name in builtin_names():
        model = next(m for m in MODELS.values() if m.name.lower() == name.split("/")[1])
        out.append((load_profile(name), model))
    return out


PROFILES = _profiles()


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(range(len(PROFILES))), chunks, st.booleans())
def test_profiled_prices_stay_within_1e_9_of_the_float_formula(
    which: int, cs: list[tuple[int, int]], decode: bool
) -> None:
    """A tiny-llama profile (synthetic) and every built-in one."""
    profile, model = PROFILES[which]
    cost = ProfiledCost(profile, model, 16)
    shape = BatchShape.decode(len(cs), sum(c for _, c in cs)) if decode else None
    shape = shape or BatchShape.from_chunks(cs)
    want = profiled_seconds(cost, shape)
    assert abs(cost.step_time(shape) - want) <= RELATIVE * want

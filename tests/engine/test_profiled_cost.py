"""ProfiledCost: closed-form window sums equal the rounds summed one by one, and the fast path
gives the same runs as stepping every round."""

from __future__ import annotations

import dataclasses
import math

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from pagedkv.engine.batch_shape import BatchShape
from pagedkv.engine.clock import TICKS_PER_SECOND as SECOND
from pagedkv.engine.cost_model import CostModel
from pagedkv.engine.policies import SCHEDULERS
from pagedkv.engine.profiled_cost import ProfiledCost
from pagedkv.engine.segments import SegmentCurve
from pagedkv.errors import ConfigError
from pagedkv.models.gpus import get_gpu
from pagedkv.models.models import get_model
from pagedkv.workloads.spec import RequestSpec
from tests.engine.profiles import synthetic_profile
from tests.engine.test_fast_forward import MAX_LEN, both_equal, workloads

OPT = get_model("OPT-13B")
SIZES = [1, 7, 16]


def cost(seed: int, block_size: int = 16) -> ProfiledCost:
    return ProfiledCost(synthetic_profile(OPT, SIZES, seed), OPT, block_size)


def loop(c: ProfiledCost, base: BatchShape, delta: BatchShape, k: int) -> tuple[int, int]:
    """The window's sums as the reference loop adds them: step by step, in ticks."""
    d = [c.step_ticks(base + delta * j) for j in range(k)]
    return sum(d), sum(j * x for j, x in enumerate(d))


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def test_is_a_cost_model() -> None:
    assert isinstance(cost(0), CostModel)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    n=st.integers(1, 64),
    context=st.integers(0, 5000),
    k=st.integers(0, 400),
    bs=st.sampled_from(SIZES),
)
def test_decode_window_equals_the_rounds(seed: int, n: int, context: int, k: int, bs: int) -> None:
    c = cost(seed, bs)
    base = BatchShape(n, n, context + n, context + n)
    want = loop(c, base, BatchShape.decode_growth(n), k)
    for curve in (c.decode_curve(n, context), c.curve(base, BatchShape.decode_growth(n))):
        assert curve.sums(k) == want  # exactly: integer lines, integer series
        assert curve.totals([k]) == [want[0]]
    assert c.window(base, BatchShape.decode_growth(n), k) == want


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    base=st.tuples(st.integers(1, 600), st.integers(1, 40), st.integers(0, 10**5)),
    delta=st.tuples(st.integers(0, 8), st.integers(0, 3), st.integers(0, 500)),
    k=st.integers(0, 200),
)
def test_prefill_window_equals_the_rounds(
    seed: int, base: tuple[int, int, int], delta: tuple[int, int, int], k: int
) -> None:
    """Windows whose every step has a prefill in it (tokens > sequences throughout)."""
    t, s, p = base
    b = BatchShape(t + s, s, p, p // 2)
    d = BatchShape(delta[0] + delta[1], delta[1], delta[2], delta[2] // 3)
    c = cost(seed)
    assert c.curve(b, d).sums(k) == loop(c, b, d, k)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    n=st.integers(1, 64),
    context=st.integers(0, 5000),
    duration=st.integers(0, 2 * SECOND),
)
def test_steps_to_reach_is_the_smallest(seed: int, n: int, context: int, duration: int) -> None:
    c = cost(seed)
    curve = c.decode_curve(n, context)
    k, sums = curve.reach(duration)
    assert sums == curve.sums(k)
    assert curve.sums(k)[0] >= duration
    assert k == 0 or curve.sums(k - 1)[0] < duration
    assert (
        c.steps_to_reach(
            BatchShape(n, n, context + n, context + n), BatchShape.decode_growth(n), duration
        )
        == k
    )


def test_a_window_that_changes_kind_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        cost(0).curve(BatchShape(2, 2, 4, 4), BatchShape(1, 0, 3, 1))
    assert err.value.field == "delta"


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    chunks=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 2000)), min_size=1, max_size=20),
)
def test_layer_residual_adds_layers_times_its_value(
    seed: int, chunks: list[tuple[int, int]]
) -> None:
    """Differential: a profile with ``layer_residual`` prices a step at the same profile
    without it plus layers x residual(tokens), decode-only or not."""
    with_it = synthetic_profile(OPT, [16], seed, residual=True)
    residual = with_it.layer_residual
    assert residual is not None
    without = dataclasses.replace(with_it, layer_residual=None)
    shape = BatchShape.from_chunks(chunks)
    a = ProfiledCost(with_it, OPT, 16).step_time(shape)
    b = ProfiledCost(without, OPT, 16).step_time(shape)
    assert math.isclose(
        a, b + OPT.num_layers * residual.at(shape.num_tokens), rel_tol=1e-9, abs_tol=1e-12
    )
    assert a > 0


def test_swap_time() -> None:
    c = cost(5)
    assert c.swap_time(0) == 0.0
    sw = c.profile.swap[16]
    assert close(c.swap_time(3), OPT.num_layers * (sw.fixed_s + 3 * sw.per_block_s))
    with pytest.raises(ConfigError):
        c.swap_time(-1)


def test_block_size_must_be_profiled() -> None:
    with pytest.raises(ConfigError) as err:
        ProfiledCost(synthetic_profile(OPT, [16]), OPT, 32)
    assert err.value.field == "block_size"


def test_tensor_parallel_needs_a_gpu_and_adds_all_reduces() -> None:
    profile = synthetic_profile(OPT, [16])
    with pytest.raises(ConfigError) as err:
        ProfiledCost(profile, OPT, 16, tensor_parallel_size=2)
    assert err.value.field == "gpu"
    one = ProfiledCost(profile, OPT, 16)
    two = ProfiledCost(profile, OPT, 16, 2, get_gpu("A100-40GB"))
    shape = BatchShape.decode(8, 100)
    assert two.step_time(shape) != one.step_time(shape)


@settings(max_examples=40, deadline=None)
@given(
    workload=workloads(),
    scheduler=st.sampled_from(sorted(SCHEDULERS)),
    block_size=st.sampled_from(SIZES),
    blocks_tokens=st.integers(MAX_LEN + 32, 2000),
    mode=st.sampled_from(["recompute", "swap"]),
    chunked=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_fast_forward_equals_reference_with_a_profile(
    workload: list[RequestSpec],
    scheduler: str,
    block_size: int,
    blocks_tokens: int,
    mode: str,
    chunked: bool,
    seed: int,
) -> None:
    chunked = chunked and scheduler != "static"
    both_equal(
        workload,
        cost(seed, block_size),
        scheduler,
        block_size,
        blocks_tokens,
        mode,
        chunked=chunked,
        max_num_batched_tokens=512 if chunked else None,
        max_model_len=MAX_LEN,
    )


@settings(max_examples=100, deadline=None)
@given(
    lines=st.lists(
        st.tuples(st.integers(SECOND // 10**4, SECOND // 100), st.integers(0, SECOND // 10**4)),
        min_size=1,
        max_size=5,
    ),
    gaps=st.lists(st.integers(1, 50), min_size=4, max_size=4),
    k=st.integers(0, 300),
    duration=st.integers(0, 5 * SECOND),
)
def test_segment_curve_sums_are_the_rounds_summed(
    lines: list[tuple[int, int]], gaps: list[int], k: int, duration: int
) -> None:
    starts = [0]
    for g in gaps[: len(lines) - 1]:
        starts.append(starts[-1] + g)
    curve = SegmentCurve.of(starts, lines)

    def d(j: int) -> int:
        s = max(i for i, start in enumerate(starts) if start <= j)
        return lines[s][0] + lines[s][1] * j

    want = (sum(d(j) for j in range(k)), sum(j * d(j) for j in range(k)))
    assert curve.sums(k) == want
    assert curve.totals([k]) == [want[0]]
    steps, _ = curve.reach(duration)
    assert curve.sums(steps)[0] >= duration
    assert steps == 0 or curve.sums(steps - 1)[0] < duration

"""Batch shapes, the unit and roofline cost models, and their closed-form windows."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedkv.engine.batch_shape import BatchShape
from pagedkv.engine.clock import TICKS_PER_SECOND as SECOND
from pagedkv.engine.cost_model import (
    CostModel,
    RooflineConfig,
    RooflineCost,
    UnitCost,
    expected_blocks,
)
from pagedkv.engine.windows import WindowCurve
from pagedkv.errors import ConfigError
from pagedkv.models.gpus import GPUS
from pagedkv.models.models import MODELS
from pagedkv.validation import field_help

OPT13 = RooflineCost(GPUS["A100-40GB"], MODELS["OPT-13B"])
MODELS_UNDER_TEST: list[CostModel] = [
    UnitCost(),
    OPT13,
    RooflineCost(GPUS["H100-SXM"], MODELS["Llama-2-70B"], tensor_parallel_size=4),
    RooflineCost(GPUS["L4"], MODELS["Mistral-7B"], config=RooflineConfig(step_overhead_s=0.0)),
    # the per-block kernel term at its largest (block size 1) and with a large overhead
    RooflineCost(GPUS["A100-40GB"], MODELS["OPT-13B"], config=RooflineConfig(block_size=1)),
    RooflineCost(
        GPUS["H100-SXM"],
        MODELS["Llama-3-8B"],
        config=RooflineConfig(block_size=7, paged_block_overhead=5.0, per_sequence_s=1e-4),
    ),
]

chunks = st.lists(st.tuples(st.integers(0, 2048), st.integers(0, 4096)), max_size=12)
shapes = st.builds(
    BatchShape,
    st.integers(0, 8192),
    st.integers(0, 256),
    st.integers(0, 10**8),
    st.integers(0, 10**6),
)
deltas = st.builds(
    BatchShape,
    st.integers(0, 256),
    st.integers(0, 4),
    st.integers(0, 10**5),
    st.integers(0, 10**4),
)
cost_models = st.sampled_from(MODELS_UNDER_TEST)


def loop_window(model: CostModel, base: BatchShape, delta: BatchShape, k: int) -> tuple[int, int]:
    """The window's sums as the reference loop adds them: step by step, in ticks."""
    times = [model.step_ticks(base + delta * i) for i in range(k)]
    return sum(times), sum(i * d for i, d in enumerate(times))


def test_from_chunks_counts() -> None:
    # 3 new tokens after 2 cached: they attend to 3, 4 and 5 positions; read 5 K/V tokens.
    assert BatchShape.from_chunks([(3, 2)]) == BatchShape(3, 1, 12, 5)
    assert BatchShape.from_chunks([(1, 511)] * 4) == BatchShape.decode(4, 511)
    assert BatchShape.from_chunks([(0, 100), (2, 0)]) == BatchShape(2, 1, 3, 2)
    assert BatchShape.from_chunks([]) == BatchShape()
    with pytest.raises(ConfigError, match="num_cached_tokens"):
        BatchShape.from_chunks([(1, -1)])
    with pytest.raises(ConfigError) as info:
        BatchShape(num_seqs=-1)
    assert info.value.field == "num_seqs"


@given(chunks)
def test_from_chunks_matches_brute_force(cs: list[tuple[int, int]]) -> None:
    small = [(n % 40, c % 40) for n, c in cs]
    pairs = sum(p + 1 for n, c in small for p in range(c, c + n))
    shape = BatchShape.from_chunks(small)
    assert shape.attn_pairs == pairs
    assert shape.num_tokens == sum(n for n, _ in small)
    assert shape.kv_read_tokens == sum(n + c for n, c in small if n)


def test_shape_arithmetic() -> None:
    a, b = BatchShape(1, 2, 3, 4), BatchShape(10, 20, 30, 40)
    assert a + b == BatchShape(11, 22, 33, 44)
    assert 3 * a == a * 3 == BatchShape(3, 6, 9, 12)
    decode = BatchShape.decode(8, 100)
    assert decode + BatchShape.decode_growth(8) == BatchShape.decode(8, 101)


def test_cost_models_satisfy_the_protocol() -> None:
    assert all(isinstance(m, CostModel) for m in MODELS_UNDER_TEST)


@given(chunks, st.integers(0, 11), st.integers(1, 64), cost_models)
def test_more_tokens_never_cost_less(
    cs: list[tuple[int, int]], which: int, extra: int, model: CostModel
) -> None:
    before = model.step_time(BatchShape.from_chunks(cs))
    grown = list(cs) or [(0, 0)]
    n, c = grown[which % len(grown)]
    grown[which % len(grown)] = (n + extra, c)
    assert model.step_time(BatchShape.from_chunks(grown)) >= before
    assert model.step_time(BatchShape.from_chunks([*cs, (extra, 0)])) >= before


def test_small_decode_is_memory_bound() -> None:
    shape = BatchShape.decode(1, 512)
    assert OPT13.memory_time(shape) > 10 * OPT13.compute_time(shape)
    cfg, model, gpu = OPT13.config, MODELS["OPT-13B"], GPUS["A100-40GB"]
    weights_time = model.weight_bytes / (gpu.mem_bandwidth * cfg.memory_efficiency)
    assert OPT13.step_time(shape) == pytest.approx(weights_time + cfg.step_overhead_s, rel=0.05)


def test_large_prefill_is_compute_bound() -> None:
    shape = BatchShape.from_chunks([(2048, 0)])
    assert OPT13.compute_time(shape) > 5 * OPT13.memory_time(shape)
    flops = 2 * MODELS["OPT-13B"].num_params * 2048
    peak = GPUS["A100-40GB"].bf16_flops * OPT13.config.compute_efficiency
    assert OPT13.compute_time(shape) == pytest.approx(flops / peak, rel=0.1)


@given(st.integers(1, 256), st.integers(1, 5000))
def test_expected_blocks_is_the_mean_over_where_the_last_block_is_cut(bs: int, c: int) -> None:
    # A sequence of c + i tokens for i in 0..bs-1 cuts its last block at every offset once.
    mean = sum(-(-(c + i) // bs) for i in range(bs)) / bs
    assert expected_blocks(1, c + (bs - 1) / 2, bs) == pytest.approx(mean)  # type: ignore[arg-type]
    assert expected_blocks(3, 3 * c, bs) == pytest.approx(3 * expected_blocks(1, c, bs))


@given(st.integers(1, 256), st.integers(1, 256), st.integers(0, 4096))
def test_paged_kernel_pays_per_block(n: int, bs: int, context: int) -> None:
    """Decode reads cost more on smaller blocks, by the configured overhead per block read."""
    gpu, model = GPUS["A100-40GB"], MODELS["OPT-13B"]
    small, large = (
        RooflineCost(gpu, model, config=RooflineConfig(block_size=b)) for b in (bs, 256)
    )
    free = RooflineCost(gpu, model, config=RooflineConfig(block_size=bs, paged_block_overhead=0))
    shape = BatchShape.decode(n, context)
    assert small.memory_time(shape) >= large.memory_time(shape) >= free.memory_time(shape)
    extra = small.block_overhead_s * expected_blocks(n, shape.kv_read_tokens, bs)
    assert small.memory_time(shape) - free.memory_time(shape) == pytest.approx(extra)
    kv = 16 * model.kv_bytes_per_token_per_gpu(1)
    per_block = 0.23 * kv / (gpu.mem_bandwidth * 0.8)
    assert small.block_overhead_s == pytest.approx(per_block)


def test_per_sequence_cost_is_on_the_host() -> None:
    cfg = RooflineConfig(per_sequence_s=1e-3)
    busy = RooflineCost(GPUS["A100-40GB"], MODELS["OPT-13B"], config=cfg)
    shape = BatchShape.decode(10, 100)
    assert busy.step_time(shape) - OPT13.step_time(shape) == pytest.approx(
        10 * (1e-3 - OPT13.config.per_sequence_s)
    )


def test_tensor_parallelism_splits_the_work() -> None:
    gpu, model = GPUS["A100-80GB"], MODELS["Llama-2-13B"]
    one, two = RooflineCost(gpu, model), RooflineCost(gpu, model, tensor_parallel_size=2)
    prefill, decode = BatchShape.from_chunks([(1024, 0)]), BatchShape.decode(16, 1000)
    assert two.compute_time(prefill) == pytest.approx(one.compute_time(prefill) / 2)
    assert two.memory_time(decode) == pytest.approx(one.memory_time(decode) / 2)
    assert one.step_time(prefill) / 2 < two.step_time(prefill) < one.step_time(prefill)


@given(cost_models, shapes, deltas, st.integers(0, 300))
def test_window_equals_the_loop(
    model: CostModel, base: BatchShape, delta: BatchShape, k: int
) -> None:
    """Exactly: integer prices make the closed form the same integers as the loop's sums."""
    assert model.window(base, delta, k) == loop_window(model, base, delta, k)


@pytest.mark.parametrize(
    ("base", "delta"),
    [
        (BatchShape.decode(64, 512), BatchShape(32, 0, 0, 0)),  # memory-bound, then compute
        (BatchShape.from_chunks([(512, 0)]), BatchShape(0, 0, 0, 10_000)),  # the reverse
    ],
)
def test_window_across_a_regime_switch(base: BatchShape, delta: BatchShape) -> None:
    k = 60

    def compute_bound(i: int) -> bool:
        shape = base + delta * i
        return OPT13.compute_time(shape) > OPT13.memory_time(shape)

    assert compute_bound(0) != compute_bound(k - 1)
    for n in range(k + 1):
        assert OPT13.window(base, delta, n) == loop_window(OPT13, base, delta, n)


@given(cost_models, shapes, deltas, st.integers(0, 50 * SECOND))
def test_steps_to_reach_is_the_smallest(
    model: CostModel, base: BatchShape, delta: BatchShape, duration: int
) -> None:
    k = model.steps_to_reach(base, delta, duration)
    assert model.window(base, delta, k)[0] >= duration
    assert k == 0 or model.window(base, delta, k - 1)[0] < duration
    if 0 < k <= 500:  # against the explicit running sum, ties included (exact integers)
        total = sum(model.step_ticks(base + delta * i) for i in range(k - 1))
        last = model.step_ticks(base + delta * (k - 1))
        assert total < duration <= total + last


def test_steps_to_reach_unit_and_edges() -> None:
    unit, base, delta = UnitCost(), BatchShape.decode(1, 1), BatchShape()
    durations = (-1, 0, SECOND // 2, 3 * SECOND, 3 * SECOND + SECOND // 5)
    assert [unit.steps_to_reach(base, delta, d) for d in durations] == [0, 0, 1, 3, 4]
    assert unit.window(base, delta, 5) == (5 * SECOND, 10 * SECOND)
    assert unit.step_time(base) == 1.0
    assert OPT13.steps_to_reach(base, delta, 0) == 0
    # large k, O(log k) evaluations
    assert OPT13.steps_to_reach(base, delta, 10**6 * SECOND) > 10**7
    for model in (unit, OPT13):
        for bad in (math.nan, 1.5, True):  # a duration is an integer of ticks
            with pytest.raises(ConfigError) as info:
                model.steps_to_reach(base, delta, bad)  # type: ignore[arg-type]
            assert info.value.field == "duration"
        with pytest.raises(ConfigError, match=r"^k:"):
            model.window(base, delta, -1)


def test_swap_time() -> None:
    times = [OPT13.swap_time(n) for n in (0, 1, 2, 100)]
    assert times[0] == 0.0
    assert times == sorted(times)
    assert len(set(times)) == 4
    block = 16 * 819_200  # one OPT-13B block: 12.5 MiB over ~25.6 GB/s of PCIe 4.0
    copies = 2 * 40 * RooflineConfig().swap_copy_overhead_s  # K and V of each of 40 layers
    assert times[1] == pytest.approx(block / (32e9 * 0.8) + copies)
    assert UnitCost().swap_time(100) == 0.0
    with pytest.raises(ConfigError) as info:
        OPT13.swap_time(-1)
    assert info.value.field == "num_blocks"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"compute_efficiency": 0.0}, "compute_efficiency"),
        ({"memory_efficiency": 1.5}, "memory_efficiency"),
        ({"pcie_efficiency": "high"}, "pcie_efficiency"),
        ({"interconnect_efficiency": True}, "interconnect_efficiency"),
        ({"step_overhead_s": -1e-3}, "step_overhead_s"),
        ({"swap_copy_overhead_s": math.inf}, "swap_copy_overhead_s"),
        ({"paged_block_overhead": -0.1}, "paged_block_overhead"),
        ({"per_sequence_s": math.nan}, "per_sequence_s"),
        ({"allreduce_latency_s": math.nan}, "allreduce_latency_s"),
        ({"block_size": 0}, "block_size"),
    ],
)
def test_roofline_config_rejects(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        RooflineConfig(**kwargs)
    assert info.value.field == field
    assert field_help(RooflineConfig, field)


def test_roofline_rejects_bad_tensor_parallelism() -> None:
    with pytest.raises(ConfigError) as info:
        RooflineCost(GPUS["A100-40GB"], MODELS["OPT-13B"], tensor_parallel_size=3)
    assert info.value.field == "tensor_parallel_size"


@given(cost_models, shapes, deltas, st.integers(0, 10**4 * SECOND), st.lists(st.integers(-2, 5000)))
def test_curve_closed_forms_equal_the_search_and_the_sums(
    model: CostModel, base: BatchShape, delta: BatchShape, duration: int, ks: list[int]
) -> None:
    """steps_to_reach solves a quadratic; totals skips a call per k: both must give exactly
    the smallest k that ``sums`` reaches the duration with and ``sums`` itself."""
    curve = model.curve(base, delta)
    k = curve.steps_to_reach(duration)
    assert curve.sums(k)[0] >= duration  # step times are >= 0: the first k past the duration
    assert k == 0 or curve.sums(k - 1)[0] < duration
    assert curve.reach(duration) == (k, curve.sums(k))
    assert curve.totals(ks) == [curve.sums(k)[0] for k in ks]


@given(cost_models, st.integers(1, 512), st.integers(0, 10**7))
def test_decode_curve_is_the_curve_of_decode_shapes(
    model: CostModel, num_seqs: int, context: int
) -> None:
    """The fast-forward's shortcut gives the very lines of ``curve`` on the decode shapes."""
    n = num_seqs
    want = model.curve(BatchShape(n, n, context + n, context + n), BatchShape.decode_growth(n))
    got = model.decode_curve(n, context)
    assert isinstance(got, WindowCurve)
    assert isinstance(want, WindowCurve)
    assert (got.head, got.tail, got.split) == (want.head, want.tail, want.split)

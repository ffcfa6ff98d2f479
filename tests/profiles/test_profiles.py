"""The built-in GPU profiles: each loads, is of its preset, names its source, agrees with the
roofline where it stands in for a missing measurement, and is picked by name or by GPU x model."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from pagedkv.engine.batch_shape import BatchShape
from pagedkv.engine.cost_model import RooflineConfig, RooflineCost
from pagedkv.engine.profile import load_profile
from pagedkv.engine.profiled_cost import ProfiledCost
from pagedkv.errors import ConfigError
from pagedkv.models.gpus import GPUS
from pagedkv.models.models import MODELS
from pagedkv.profiles import builtin_for, builtin_names, builtin_path
from pagedkv.profiles.derive import GPU_DIRS, SOURCES, Layer, layer_of
from pagedkv.simulation import SimulationConfig
from tests.engine.test_fast_forward import MAX_LEN, both_equal, workloads

NAMES = builtin_names()
SIZES = (1, 16, 256)


def test_every_gpu_preset_and_model_has_one() -> None:
    want = sorted(f"{g.lower()}/{m.lower()}" for g in GPU_DIRS for m in SOURCES)
    assert want == NAMES
    assert set(SOURCES) == set(MODELS)


@pytest.mark.parametrize("name", NAMES)
def test_loads_matches_its_preset_and_names_its_source(name: str) -> None:
    profile = load_profile(name)
    gpu, model = (k for k in (*GPUS, *MODELS) if k.lower() in name.split("/"))
    profile.check_model(MODELS[model])
    assert profile.source["device_name"] == gpu
    assert profile.source["repository"] == "microsoft/vidur"
    assert len(profile.source["commit"]) == 40
    assert profile.source["path"].endswith("mlp.csv")
    assert "no published measurement" in profile.source["attention"]
    assert builtin_for(gpu, model) == name


@pytest.mark.parametrize("name", NAMES)
def test_where_nothing_was_measured_it_is_the_roofline(name: str) -> None:
    """Swap and the paged kernel's per-block cost: the same formulas, the same constants."""
    gpu_name, model_name = name.split("/")
    gpu = next(g for k, g in GPUS.items() if k.lower() == gpu_name)
    model = next(m for k, m in MODELS.items() if k.lower() == model_name)
    profile = load_profile(name)
    for bs in SIZES:
        profiled = ProfiledCost(profile, model, bs)
        roofline = RooflineCost(gpu, model, config=RooflineConfig(block_size=bs))
        for m in (1, 7, 300):
            assert profiled.swap_time(m) == pytest.approx(roofline.swap_time(m), rel=1e-12)
    shape = BatchShape.decode(32, 1000)
    fine, coarse = (ProfiledCost(profile, model, b) for b in (1, 256))
    rf, rc = (RooflineCost(gpu, model, config=RooflineConfig(block_size=b)) for b in (1, 256))
    assert fine.step_time(shape) - coarse.step_time(shape) == pytest.approx(
        rf.memory_time(shape) - rc.memory_time(shape), rel=1e-9
    )


@settings(max_examples=80, deadline=None)
@given(
    name=st.sampled_from(NAMES),
    bs=st.sampled_from(SIZES),
    n=st.integers(1, 256),
    context=st.integers(0, 10**6),
    k=st.integers(0, 500),
)
def test_decode_windows_are_the_rounds_summed(
    name: str, bs: int, n: int, context: int, k: int
) -> None:
    model = next(m for key, m in MODELS.items() if key.lower() == name.split("/")[1])
    cost = ProfiledCost(load_profile(name), model, bs)
    base = BatchShape(n, n, context + n, context + n)
    times = [cost.step_ticks(base + BatchShape.decode_growth(n) * j) for j in range(k)]
    # exactly: integer prices, integer series
    assert cost.decode_curve(n, context).sums(k) == (
        sum(times),
        sum(j * d for j, d in enumerate(times)),
    )


@settings(max_examples=15, deadline=None)
@given(
    workload=workloads(),
    bs=st.sampled_from(SIZES),
    blocks_tokens=st.integers(MAX_LEN + 32, 2000),
    mode=st.sampled_from(["recompute", "swap"]),
)
def test_fast_forward_equals_reference_with_a_builtin(
    workload: list[object], bs: int, blocks_tokens: int, mode: str
) -> None:
    model = MODELS["OPT-13B"]
    cost = ProfiledCost(load_profile("a100-40gb/opt-13b"), model, bs)
    both_equal(workload, cost, "vllm", bs, blocks_tokens, mode, max_model_len=MAX_LEN)  # type: ignore[arg-type]


def flat(**extra: object) -> dict[str, object]:
    return {"model": "OPT-13B", "gpu": "A100-40GB", "workload": "alpaca-like", **extra}


def test_picked_by_gpu_and_model_or_by_name() -> None:
    auto = SimulationConfig.from_flat(flat(cost_model="profiled"))
    assert auto.hardware.profile == "a100-40gb/opt-13b"
    named = SimulationConfig.from_flat(flat(cost_model="profiled", profile="A100-80GB/OPT-13B"))
    assert named.hardware.profile == "A100-80GB/OPT-13B"
    assert builtin_path("h100-80gb/opt-13b") == builtin_path("h100-sxm/opt-13b") is not None
    for bad in ("a100-40gb/opt-14b", "nowhere", "a/b/c"):
        assert builtin_path(bad) is None
        with pytest.raises(ConfigError) as info:
            SimulationConfig.from_flat(flat(cost_model="profiled", profile=bad))
        assert info.value.field == "profile"
    with pytest.raises(ConfigError) as info:
        SimulationConfig.from_flat(flat(cost_model="profiled", gpu="L4"))
    assert info.value.field == "profile"
    assert "none built in" in str(info.value)


def test_a_layer_scaled_to_itself_is_unchanged() -> None:
    for model in MODELS.values():
        layer: Layer = layer_of(model)
        assert all(
            r == (1.0 if layer.rope or o != "attn_rope" else 0.0)
            for o, r in layer.scale(layer).items()
        )

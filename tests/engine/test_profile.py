"""The profile file: round-trips, and a bad or mismatched one is one error naming the field."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from pagedkv.engine.profile import Curve, Profile, load_profile
from pagedkv.errors import ConfigError
from pagedkv.models.models import get_model
from tests.engine.profiles import profile_dict

OPT = get_model("OPT-13B")


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), sizes=st.lists(st.integers(1, 64), min_size=1, unique=True))
def test_round_trip(seed: int, sizes: list[int]) -> None:
    data = profile_dict(OPT, sizes, seed)
    profile = Profile.from_dict(data)
    again = Profile.from_dict(json.loads(json.dumps(profile.to_dict())))
    assert again == profile
    assert again.to_dict() == data


def test_write_and_load(tmp_path: Path) -> None:
    profile = Profile.from_dict(profile_dict(OPT, [16], 3))
    path = profile.write(tmp_path / "p.json")
    assert load_profile(path) == profile


@settings(max_examples=60, deadline=None)
@given(
    xs=st.lists(st.integers(1, 5000), min_size=1, max_size=8, unique=True),
    steps=st.lists(st.floats(0, 1), min_size=9, max_size=9),
    at=st.integers(0, 5000),
)
def test_curve_interpolates_between_points(xs: list[int], steps: list[float], at: int) -> None:
    x = [0, *sorted(xs)]
    y = list(np.cumsum(steps[: len(x)]))
    curve = Curve(tuple(x), tuple(float(v) for v in y)).check("c")
    if at <= x[-1]:
        assert curve.at(at) == pytest.approx(float(np.interp(at, x, y)), abs=1e-12)
    else:  # the last line goes on
        slope = (y[-1] - y[-2]) / (x[-1] - x[-2])
        assert curve.at(at) == pytest.approx(y[-1] + slope * (at - x[-1]), abs=1e-12)


def _set(data: dict[str, Any], path: str, value: Any) -> None:
    keys = path.split(".")
    for k in keys[:-1]:
        data = data[k]
    if value is _DELETE:
        del data[keys[-1]]
    else:
        data[keys[-1]] = value


_DELETE = object()
BAD = [
    ("format", "other", "profile.format"),
    ("version", 2, "profile.version"),
    ("per_iteration_s", 0.0, "profile.per_iteration_s"),
    ("per_sequence_s", -1.0, "profile.per_sequence_s"),
    ("per_token_s", "fast", "profile.per_token_s"),
    ("dtype", "int4", "profile.dtype"),
    ("block_sizes", [], "profile.block_sizes"),
    ("block_sizes", [16, 0], "profile.block_sizes[1]"),
    ("model.hidden_size", 0, "profile.model.hidden_size"),
    ("linear.x", [1, 2], "profile.linear.x"),
    ("linear.x", [0, 5, 5], "profile.linear.x"),
    ("linear.y", [2.0, 1.0], "profile.linear.y"),
    ("lm_head", [1, 2], "profile.lm_head"),
    ("prefill_attention.per_pair_s", float("nan"), "profile.prefill_attention.per_pair_s"),
    ("prefill_attention.extra", 1.0, "profile.prefill_attention.extra"),
    ("decode_attention.16.per_sequence_s", None, "profile.decode_attention.16.per_sequence_s"),
    ("decode_attention.32", {}, "profile.decode_attention.32"),
    ("swap.16.fixed_s", -1, "profile.swap.16.fixed_s"),
    ("rates.matmul_flops", 0, "profile.rates.matmul_flops"),
    ("source", {"device": 1}, "profile.source"),
    ("surprise", 1, "profile.surprise"),
    ("embedding", _DELETE, "profile.embedding"),
    ("layer_residual", [0.0], "profile.layer_residual"),
    ("layer_residual.y", [0.0, float("inf")], "profile.layer_residual.y[1]"),
    ("layer_residual.y", [0.0, -1.0], "profile.layer_residual.y"),  # its last line falls
    ("layer_residual.y", [-1.0, -1.0], "profile.layer_residual"),  # a layer below 0 s
    ("timing", [], "profile.timing"),
    ("timing.passes", -1, "profile.timing.passes"),
    ("timing.rounds", 3, "profile.timing.rounds"),
    ("timing.points.linear", {"runs": [3]}, "profile.timing.points.linear"),
    ("timing.points.linear.runs", [3, 0], "profile.timing.points.linear.runs[1]"),
    ("timing.points.linear.spread", [0.1], "profile.timing.points.linear.spread"),
    ("timing.points.linear.spread", [0.1, -0.2], "profile.timing.points.linear.spread[1]"),
]


@pytest.mark.parametrize(("path", "value", "field"), BAD)
def test_bad_profile_names_the_field(path: str, value: Any, field: str) -> None:
    data = copy.deepcopy(profile_dict(OPT, [16], 1))
    if path.startswith("timing"):
        data["timing"] = {"passes": 3, "points": {"linear": {"runs": [3, 3], "spread": [0, 0]}}}
    if path == "layer_residual.y":
        data["layer_residual"] = {"x": [0, 10], "y": [0.0, 0.0]}
    if path == "linear.x":
        data["linear"]["y"] = [0.0] * len(value)
    if path == "linear.y":
        data["linear"]["x"] = [0, 10]
    _set(data, path, value)
    with pytest.raises(ConfigError) as err:
        Profile.from_dict(data)
    assert err.value.field == field
    assert "\n" not in str(err.value)


def test_mismatched_model_and_block_size() -> None:
    profile = Profile.from_dict(profile_dict(OPT, [16], 1))
    with pytest.raises(ConfigError) as err:
        profile.check_model(get_model("OPT-66B"))
    assert err.value.field.startswith("profile.model.")
    with pytest.raises(ConfigError) as err:
        profile.check_block_size(8)
    assert err.value.field == "block_size"


@pytest.mark.parametrize("text", ["{not json", "[]"])
def test_load_rejects_bad_files(tmp_path: Path, text: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_profile(path)
    assert err.value.field == "profile"
    with pytest.raises(ConfigError):
        load_profile(tmp_path / "missing.json")


def test_token_curves_may_fall_context_curves_may_not() -> None:
    """A GEMM over 3 rows can take longer than over 4: the token and row curves may fall
    between points (never on their last line); a decode window's context curve may not."""
    data = copy.deepcopy(profile_dict(OPT, [16], 1))
    wavy = {"x": [0, 3, 4, 8], "y": [1e-4, 3e-4, 2e-4, 4e-4]}
    for name in ("linear", "lm_head", "embedding"):
        data[name] = wavy
    loaded = Profile.from_dict(data)
    assert loaded.linear.at(4) < loaded.linear.at(3)
    assert Profile.from_dict(loaded.to_dict()) == loaded
    falling_last = copy.deepcopy(data)
    falling_last["linear"] = {"x": [0, 3, 4], "y": [1e-4, 3e-4, 2e-4]}
    with pytest.raises(ConfigError) as err:
        Profile.from_dict(falling_last)
    assert err.value.field == "profile.linear.y"
    data["decode_attention"]["16"]["context"] = wavy
    with pytest.raises(ConfigError) as err:
        Profile.from_dict(data)
    assert err.value.field == "profile.decode_attention.16.context.y"


def test_layer_residual_is_optional_signed_and_round_trips() -> None:
    """A file without ``layer_residual`` (older ones, the built-in profiles) loads with None
    (the operators' sum); one with it keeps its negative values through a round trip."""
    without = profile_dict(OPT, [16], 2, residual=False)
    assert "layer_residual" not in without
    assert Profile.from_dict(without).layer_residual is None
    data = profile_dict(OPT, [16], 2, residual=True)
    data["layer_residual"] = {"x": [0, 10], "y": [-1e-9, -1e-9]}
    data["linear"] = {"x": [0, 10], "y": [1e-6, 1e-6]}
    loaded = Profile.from_dict(data)
    assert loaded.layer_residual is not None
    assert loaded.layer_residual.at(5) < 0
    assert Profile.from_dict(json.loads(json.dumps(loaded.to_dict()))) == loaded


def test_timing_is_optional_and_round_trips() -> None:
    """``timing`` records how the points were measured; a file without it loads with None, and
    the cost model does not read it (the same prices with it or without)."""
    from pagedkv.engine.batch_shape import BatchShape
    from pagedkv.engine.profiled_cost import ProfiledCost

    data = profile_dict(OPT, [16], 3)
    assert "timing" in data
    with_timing = Profile.from_dict(data)
    assert with_timing.timing is not None
    assert Profile.from_dict(json.loads(json.dumps(with_timing.to_dict()))) == with_timing
    without = {k: v for k, v in data.items() if k != "timing"}
    bare = Profile.from_dict(without)
    assert bare.timing is None
    assert "timing" not in bare.to_dict()
    shape = BatchShape.decode(4, 100)
    prices = [ProfiledCost(p, OPT, 16).step_time(shape) for p in (with_timing, bare)]
    assert prices[0] == prices[1]

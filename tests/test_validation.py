"""The validation helpers: bounded fields (every numeric field of every config has finite
bounds, shown in its help and enforced first), checked numbers, and input files read into one
clear error."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedkv.engine.config import SchedulerConfig
from pagedkv.engine.cost_model import RooflineConfig
from pagedkv.errors import ConfigError
from pagedkv.memory.config import CacheConfig, ContiguousConfig
from pagedkv.simulation import HardwareConfig
from pagedkv.sweep.plan_spec import PlanSpec
from pagedkv.tensors.generate_config import GenerateConfig
from pagedkv.tensors.model_config import DecoderConfig
from pagedkv.validation import (
    Bounds,
    JsonShape,
    check_float,
    check_int,
    check_json_shape,
    read_text,
    read_yaml,
)
from pagedkv.workloads.config import WorkloadConfig

CONFIGS: list[type] = [
    HardwareConfig,
    SchedulerConfig,
    WorkloadConfig,
    CacheConfig,
    ContiguousConfig,
    RooflineConfig,
    GenerateConfig,
    DecoderConfig,
    PlanSpec,
]
PLAN_ARGS: dict[str, Any] = {
    "options": {},
    "gpus": {"A100-40GB": 1.0},
    "tensor_parallel_sizes": (1,),
    "block_sizes": (16,),
    "schedulers": ("vllm",),
    "slo": {"ttft_p99": 1.0},
    "seeds": (0,),
}


def _numeric_fields(cls: type) -> list[tuple[str, type]]:
    """(name, int or float) of every field of ``cls`` typed int, float or either | None."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        kinds = [a for a in args if a in (int, float)]
        if kinds and all(a in (int, float, type(None)) for a in args):
            out.append((f.name, kinds[0]))
    return out


def _make(cls: type, **values: Any) -> Any:
    return cls(**PLAN_ARGS, **values) if cls is PlanSpec else cls(**values)


def test_every_numeric_field_has_finite_bounds_in_its_help() -> None:
    seen = 0
    for cls in CONFIGS:
        for f in dataclasses.fields(cls):
            if f.name not in dict(_numeric_fields(cls)):
                continue
            seen += 1
            bounds = f.metadata.get("bounds")
            assert isinstance(bounds, Bounds), f"{cls.__name__}.{f.name} has no bounds"
            assert math.isfinite(bounds.lo)
            assert math.isfinite(bounds.hi)
            assert bounds.lo <= bounds.hi
            assert f"Allowed: {bounds.describe()}." in f.metadata["help"]
    assert seen >= 60  # every config above has several


@pytest.mark.parametrize(
    ("cls", "name", "kind"),
    [(cls, name, kind) for cls in CONFIGS for name, kind in _numeric_fields(cls)],
    ids=lambda x: getattr(x, "__name__", str(x)),
)
def test_out_of_bounds_is_refused_first_naming_the_field(cls: type, name: str, kind: type) -> None:
    bounds = next(f.metadata["bounds"] for f in dataclasses.fields(cls) if f.name == name)
    bad: list[object] = [bounds.hi + 1, bounds.lo - 1]
    if kind is float:
        bad += [math.nan, math.inf, -math.inf, 1e308 * 10]
    else:
        bad += [10**30, 1.5, True]
    for value in bad:
        with pytest.raises(ConfigError) as err:
            _make(cls, **{name: value})
        assert err.value.field == name
        assert bounds.describe().split(" in ")[1] in str(err.value) or "integer" in str(err.value)
        assert "\n" not in str(err.value)


@given(
    lo=st.integers(-(10**6), 10**6),
    width=st.integers(0, 10**6),
    value=st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.booleans()),
)
def test_integer_bounds_accept_exactly_the_range(lo: int, width: int, value: object) -> None:
    hi = lo + width
    inside = type(value) is int and lo <= value <= hi
    if inside:
        assert Bounds(lo, hi, True).check("x", value) == value
    else:
        with pytest.raises(ConfigError):
            check_int("x", value, lo, hi)


@given(
    lo=st.floats(-1e6, 1e6),
    width=st.floats(0, 1e6),
    lo_open=st.booleans(),
    hi_open=st.booleans(),
    value=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**1100), 2**1100)
    ),
)
def test_float_bounds_accept_exactly_the_finite_range(
    lo: float, width: float, lo_open: bool, hi_open: bool, value: float | int
) -> None:
    hi = lo + width
    x = float(value) if abs(value) < 2**1023 else math.inf
    inside = (
        math.isfinite(x) and (x > lo if lo_open else x >= lo) and (x < hi if hi_open else x <= hi)
    )
    if inside:
        assert check_float("x", value, lo, hi, lo_open=lo_open, hi_open=hi_open) == x
    else:
        with pytest.raises(ConfigError, match="finite number"):
            check_float("x", value, lo, hi, lo_open=lo_open, hi_open=hi_open)


def test_read_text_drops_a_bom_and_names_a_bad_byte_by_line(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_bytes(b"\xef\xbb\xbfa: 1\n")
    assert read_text("config", good) == "a: 1\n"
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"a: 1\nb: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"line 2: byte 0xe9") as err:
        read_text("config", bad)
    assert err.value.field == "config"
    assert str(bad) in str(err.value)
    with pytest.raises(ConfigError, match="not a directory"):
        read_text("config", tmp_path)
    with pytest.raises(ConfigError, match="no such file"):
        read_text("config", tmp_path / "missing.yaml")


def test_read_yaml_names_the_line_of_a_syntax_error(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("a: 1\nb: [1, 2\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"must be valid YAML \(line 3"):
        read_yaml("spec", path)
    path.write_text("", encoding="utf-8")
    assert read_yaml("spec", path) is None
    path.write_text("block_size: 1" + "0" * 5000 + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"must be valid YAML .*4300 digits"):
        read_yaml("spec", path)  # Python refuses to parse an integer this long


def test_json_shape_names_the_key() -> None:
    shape: JsonShape = {"rows": (list, dict), "title": (str, None)}
    check_json_shape("r.json", {"rows": [{}], "title": "t"}, shape, required=True)
    check_json_shape("r.json", {}, shape, required=False)
    for data, key in (
        ({"rows": [1], "title": "t"}, "rows"),
        ({"rows": {}, "title": "t"}, "rows"),
        ({"rows": []}, "title"),
    ):
        with pytest.raises(ConfigError) as err:
            check_json_shape("r.json", data, shape, required=True)
        assert err.value.field == f"r.json: {key}"
    with pytest.raises(ConfigError, match="must be a JSON object"):
        check_json_shape("r.json", [1], shape, required=False)


def test_read_text_refuses_a_file_over_its_limit_unread_and_a_device_once_read(
    tmp_path: Path,
) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("a: 1\n" * 100, encoding="utf-8")
    assert read_text("config", path, max_bytes=500) == "a: 1\n" * 100
    with pytest.raises(ConfigError, match=r"must be at most 499 bytes \(it has 500\)"):
        read_text("config", path, max_bytes=499)
    zero = tmp_path / "zero.csv"
    zero.symlink_to("/dev/zero")  # endless: stopped at the limit
    with pytest.raises(ConfigError, match="must be at most 4194304 bytes"):
        read_text("trace_path", zero, max_bytes=4 << 20)

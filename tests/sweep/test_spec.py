"""Sweep specs: the points they expand to, stable ids, and bad specs failing before any run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.cli import main
from pagedkv.engine.policies import SCHEDULERS
from pagedkv.errors import ConfigError
from pagedkv.simulation import SimulationConfig, build_engine
from pagedkv.sweep.spec import SweepSpec
from pagedkv.sweep.sweep import run_sweep
from pagedkv.workloads.factory import make_workload
from tests.sweep.helpers import SMALL_SPEC


def test_points_are_grid_times_zip_times_seeds_in_order() -> None:
    spec = SweepSpec.from_dict({**SMALL_SPEC, "seeds": 2})
    points = spec.points()
    assert len(points) == 2 * 2 * 3 * 2
    assert [p.index for p in points] == list(range(len(points)))
    first, last = points[0], points[-1]
    assert first.varied == {
        "block_size": 8,
        "scheduler": "vllm",
        "request_rate": 2.0,
        "max_num_seqs": 8,
    }
    assert (first.options["seed"], points[1].options["seed"]) == (0, 1)
    assert last.varied["block_size"] == 16
    assert last.varied["request_rate"] == 32.0
    # zipped lists stay side by side: no rate is paired with another row's max_num_seqs
    pairs = {(p.varied["request_rate"], p.varied["max_num_seqs"]) for p in points}
    assert pairs == {(2.0, 8), (8.0, 16), (32.0, 64)}
    assert len({p.point_id for p in points}) == len(points)


def test_point_id_ignores_key_order_and_explicit_defaults() -> None:
    a = SweepSpec.from_dict({"workload": "alpaca-like", "num_requests": 5})
    b = SweepSpec.from_dict({"num_requests": 5, "block_size": 16, "workload": "alpaca-like"})
    assert [p.point_id for p in a.points()] == [p.point_id for p in b.points()]


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"blok_size": 16}, "blok_size"),
        ({"grid": {"blok_size": [16]}}, "grid.blok_size"),
        ({"zip": {"nope": [1]}}, "zip.nope"),
        ({"grid": {}}, "grid"),
        ({"grid": {"block_size": []}}, "grid.block_size"),
        ({"grid": {"block_size": 16}}, "grid.block_size"),
        ({"grid": {"block_size": [16, "big"]}}, "block_size"),
        ({"zip": {"block_size": [8, 16], "request_rate": [1.0]}}, "zip"),
        ({"seeds": 0}, "seeds"),
        ({"seeds": [1, 1]}, "seeds"),
        ({"seed": 3}, "seed"),
        ({"grid": {"seed": [1, 2]}}, "seed"),
        ({"block_size": 8, "grid": {"block_size": [16]}}, "block_size"),
        ({"grid": {"block_size": [16, 16]}}, "spec"),
        (["block_size"], "spec"),
    ],
)
def test_bad_spec_is_one_clear_error(spec: Any, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        SweepSpec.from_dict(spec).points()
    assert err.value.field == field
    assert field.split(".")[-1] in str(err.value)


def test_bad_value_fails_before_any_point_runs(tmp_path: Path) -> None:
    # the bad value is in the last point: the first must not have run either
    spec = SweepSpec.from_dict({"num_requests": 5, "grid": {"block_size": [16, 0]}})
    with pytest.raises(ConfigError, match="block_size"):
        run_sweep(spec, tmp_path / "out", workers=1)
    assert not (tmp_path / "out").exists()


def test_cli_bad_spec_exits_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("num_requests: 5\ngrid:\n  scheduler: [vllm, fifo]\n", encoding="utf-8")
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "scheduler" in err
    assert "'fifo'" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("grid", "field", "words"),
    [
        # a contiguous policy's space must hold max_model_len: 40 blocks x 16 < 2048
        ({"scheduler": ["vllm", "orca-max"]}, "max_model_len", "must be <= capacity (640)"),
        ({"num_gpu_blocks": [200, 1 << 30]}, "num_gpu_blocks", "would hold about"),
    ],
)
def test_what_the_engine_build_refuses_is_refused_when_the_spec_is_read(
    grid: dict[str, list[Any]], field: str, words: str, tmp_path: Path
) -> None:
    base = {"num_requests": 4, "num_gpu_blocks": 40, "cost_model": "unit", "grid": grid}
    if "num_gpu_blocks" in grid:
        del base["num_gpu_blocks"]
    spec = SweepSpec.from_dict(base)
    with pytest.raises(ConfigError) as err:
        spec.points()
    assert err.value.field == field
    assert words in str(err.value)
    # the same error as building that point's engine: one rule, checked early
    bad = {**{k: v for k, v in base.items() if k != "grid"}, **{k: v[-1] for k, v in grid.items()}}
    with pytest.raises(ConfigError) as built:
        build_engine(SimulationConfig.from_flat({**bad, "seed": 0}))
    assert str(built.value) == str(err.value)
    with pytest.raises(ConfigError):
        run_sweep(spec, tmp_path / "out", workers=1)
    assert not (tmp_path / "out").exists()


def test_pinned_prefixes_that_do_not_fit_are_refused_when_the_spec_is_read() -> None:
    base = {
        "workload": "shared-prefix",
        "prefix_len": 200,
        "num_prefixes": 4,
        "num_requests": 40,
        "enable_pinned_prefixes": True,
        "cost_model": "unit",
        "grid": {"num_gpu_blocks": [400, 30]},  # 4 x 13 blocks of prefixes: not in 30
    }
    with pytest.raises(ConfigError) as err:
        SweepSpec.from_dict(base).points()
    assert err.value.field == "enable_pinned_prefixes"
    assert "must fit" in str(err.value)


def test_a_missing_trace_is_refused_when_the_spec_is_read(tmp_path: Path) -> None:
    spec = {"workload": "trace", "grid": {"trace_path": [str(tmp_path / "absent.csv")]}}
    with pytest.raises(ConfigError, match="no such file"):
        SweepSpec.from_dict(spec).points()


def test_each_distinct_workload_is_made_once_for_the_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[object] = []
    real = make_workload

    def counting(config: Any) -> Any:
        made.append(config)
        return real(config)

    monkeypatch.setattr("pagedkv.simulation.make_workload", counting)
    points = SweepSpec.from_dict({**SMALL_SPEC, "seeds": 2}).points()
    assert len(points) == 24
    assert len(made) == len(set(made)) == 2 * 3  # two seeds x three zipped rates


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (
            {"grid": {"block_size": list(range(1, 401)), "max_num_seqs": list(range(1, 301))}},
            "spec",
        ),
        ({"seeds": 10**6}, "seeds"),
        ({"seeds": [2**64]}, "seeds"),
        ({"grid": {"swap_space": [4, float("nan")]}}, "swap_space"),
    ],
)
def test_sizes_and_numbers_are_bounded(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        SweepSpec.from_dict({"num_requests": 5, **spec}).points()
    assert err.value.field == field


def test_a_spec_that_is_not_utf8_is_one_error(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_bytes(b"num_requests: 5\n# \xe9t\xe9\n")
    with pytest.raises(ConfigError, match=r"UTF-8 text \(line 2") as err:
        SweepSpec.from_yaml(path)
    assert err.value.field == "spec"


@settings(max_examples=60, deadline=None)
@given(
    scheduler=st.sampled_from(sorted(SCHEDULERS)),
    block_size=st.sampled_from([1, 8, 16, 64]),
    num_gpu_blocks=st.integers(1, 400),
    max_model_len=st.sampled_from([16, 128, 2048]),
    workload=st.sampled_from(
        [
            {"workload": "alpaca-like", "num_requests": 6},
            {"workload": "shared-prefix", "prefix_len": 12, "num_prefixes": 3, "num_requests": 9},
            {"workload": "chat", "num_sessions": 2, "chat_turns": 2},
        ]
    ),
    pinned=st.booleans(),
)
def test_a_point_the_spec_accepts_builds(
    scheduler: str,
    block_size: int,
    num_gpu_blocks: int,
    max_model_len: int,
    workload: dict[str, Any],
    pinned: bool,
) -> None:
    options = {
        **workload,
        "scheduler": scheduler,
        "block_size": block_size,
        "num_gpu_blocks": num_gpu_blocks,
        "max_model_len": max_model_len,
        "enable_pinned_prefixes": pinned,
        "cost_model": "unit",
    }
    try:
        (point,) = SweepSpec.from_dict(options).points()
    except ConfigError:
        return  # refused when read: nothing to build
    build_engine(SimulationConfig.from_flat(point.options))  # must not raise

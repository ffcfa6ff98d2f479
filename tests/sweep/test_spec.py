"""Sweep specs: the points they expand to, stable ids, and bad specs failing before any run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pagedkv.cli import main
from pagedkv.errors import ConfigError
from pagedkv.sweep.spec import SweepSpec
from pagedkv.sweep.sweep import run_sweep
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

"""Sweeps: the same table however the points ran (serial, pool, interrupted and resumed),
failing points as rows, and the CLI."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from pagedkv.cli import main
from pagedkv.simulation import SimulationConfig, simulate
from pagedkv.sweep.spec import SweepSpec
from pagedkv.sweep.sweep import JOURNAL, run_sweep
from tests.sweep.helpers import COUNTER_ENV, SMALL_SPEC, counted_run_point, fail_large_blocks


@pytest.fixture(scope="module")
def spec() -> SweepSpec:
    return SweepSpec.from_dict(SMALL_SPEC)


@pytest.fixture(scope="module")
def reference(spec: SweepSpec, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted serial sweep every other way of running must reproduce."""
    out = tmp_path_factory.mktemp("reference")
    run_sweep(spec, out, workers=1)
    return out


def test_table_has_one_row_per_point_with_its_metrics(spec: SweepSpec, reference: Path) -> None:
    with (reference / "results.csv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    points = spec.points()
    assert [int(r["point"]) for r in rows] == [p.index for p in points]
    assert [r["point_id"] for r in rows] == [p.point_id for p in points]
    assert {"block_size", "scheduler", "request_rate", "seed", "ttft_p99", "tpot_p99"} <= set(
        rows[0]
    )
    # a row's metrics are that point's simulation, not another's
    direct = simulate(SimulationConfig.from_flat(points[5].options)).summary
    assert float(rows[5]["ttft_p99"]) == direct["ttft"]["p99"]
    assert int(rows[5]["finished"]) == direct["finished"]
    parquet = pq.read_table(reference / "results.parquet").to_pylist()
    assert [r["ttft_p99"] for r in parquet] == [float(r["ttft_p99"]) for r in rows]


def test_pool_gives_the_same_table_as_serial(
    spec: SweepSpec, reference: Path, tmp_path: Path
) -> None:
    run_sweep(spec, tmp_path, workers=2)
    assert _tables(tmp_path) == _tables(reference)


@pytest.mark.parametrize(("workers", "stop_after"), [(1, 5), (2, 3)])
def test_resume_after_interrupt_gives_the_same_table_and_runs_no_point_twice(
    spec: SweepSpec,
    reference: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    workers: int,
    stop_after: int,
) -> None:
    counter = tmp_path / "runs.txt"
    monkeypatch.setenv(COUNTER_ENV, str(counter))
    seen: list[str] = []

    def ctrl_c_after_some(entry: dict[str, Any]) -> None:
        seen.append(entry["point_id"])
        if len(seen) == stop_after:
            raise KeyboardInterrupt  # what Ctrl-C raises in the main process

    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, out, workers=workers, fn=counted_run_point, on_row=ctrl_c_after_some)
    finished = set(seen)
    assert len(finished) == stop_after
    first_runs = counter.read_text(encoding="utf-8").split()
    counter.unlink()
    done = run_sweep(spec, out, workers=workers, fn=counted_run_point)
    assert (done.skipped, done.ran) == (stop_after, len(spec.points()) - stop_after)
    second_runs = counter.read_text(encoding="utf-8").split()
    assert not finished & set(second_runs)  # nothing journaled before the interrupt reran
    assert sorted(second_runs) == sorted({p.point_id for p in spec.points()} - finished)
    if workers == 1:  # serial: exactly the journaled points ran before the interrupt
        assert sorted(first_runs) == sorted(finished)
    assert _tables(out) == _tables(reference)


def test_a_torn_journal_line_is_ignored(spec: SweepSpec, reference: Path, tmp_path: Path) -> None:
    lines = (reference / JOURNAL).read_text(encoding="utf-8").splitlines(keepends=True)
    (tmp_path / JOURNAL).write_text("".join(lines[:4]) + lines[4][:30], encoding="utf-8")
    done = run_sweep(spec, tmp_path, workers=1)
    assert done.skipped == 4
    assert _tables(tmp_path) == _tables(reference)


def test_failing_points_are_rows_and_the_sweep_goes_on(spec: SweepSpec, tmp_path: Path) -> None:
    done = run_sweep(spec, tmp_path, workers=2, fn=fail_large_blocks)
    assert done.failed == len(spec.points()) // 2
    with (tmp_path / "results.csv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(spec.points())
    for row in rows:
        broken = row["block_size"] == "16"
        assert (row["error"] == "RuntimeError: block size 16 is broken here") == broken
        assert (row["ttft_p99"] == "") == broken
    again = run_sweep(spec, tmp_path, workers=1, retry_failed=True)
    assert (again.ran, again.failed) == (len(spec.points()) // 2, 0)


def test_cli_sweep_then_resume(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(
        "workload: alpaca-like\nnum_requests: 6\ngrid:\n  block_size: [8, 16]\nseeds: 2\n",
        encoding="utf-8",
    )
    args = ["sweep", str(path), "--out", str(tmp_path / "out"), "--workers", "1", "--quiet"]
    assert main(args) == 0
    assert "4 run, 0 already done, 0 failed" in capsys.readouterr().out
    assert main(args) == 0
    assert "0 run, 4 already done" in capsys.readouterr().out
    assert (tmp_path / "out" / "results.parquet").exists()


def _tables(out: Path) -> tuple[str, list[dict[str, Any]]]:
    csv_text = (out / "results.csv").read_text(encoding="utf-8")
    return csv_text, pq.read_table(out / "results.parquet").to_pylist()


def test_a_journal_that_cannot_be_written_is_one_line_exit_5(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import os

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("pagedkv.sweep.journal.os.fsync", full)
    spec = tmp_path / "spec.yaml"
    spec.write_text("workload: lesson\ncost_model: unit\ngrid:\n  block_size: [16]\n")
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out), "--workers", "1", "--quiet"]) == 5
    err = capsys.readouterr().err
    assert err == f"pagedkv: error: cannot write {out / JOURNAL}: {os.strerror(errno.ENOSPC)}\n"


@pytest.mark.parametrize(
    "damage",
    [
        lambda line: line[:10] + b"\xff\xfe" + line[12:],  # a bad byte
        lambda line: b"not json at all\n",
        lambda line: b'{"point_id": 7}\n',  # JSON, not an entry
        lambda line: b'{"point_id": "x", "metrics": [1]}\n',
        lambda line: b'{"point_id": "x", "n": 1' + b"0" * 5000 + b"}\n",  # int too long
    ],
)
def test_a_damaged_journal_line_is_skipped_with_a_warning_and_the_rest_kept(
    spec: SweepSpec,
    reference: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    damage: Any,
) -> None:
    lines = (reference / JOURNAL).read_bytes().splitlines(keepends=True)
    lines[2] = damage(lines[2])
    (tmp_path / JOURNAL).write_bytes(b"".join(lines))
    done = run_sweep(spec, tmp_path, workers=1)
    assert (done.skipped, done.ran) == (len(lines) - 1, 1)  # only the damaged point reruns
    assert _tables(tmp_path) == _tables(reference)
    warnings = capsys.readouterr().err.strip().splitlines()
    assert warnings == [
        f"pagedkv: warning: {tmp_path / JOURNAL}:3: skipped a line that is not a journal entry "
        "(a crash cut it short, or it was damaged); its point runs again"
    ]


def test_cli_sweep_on_a_builtin_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--profile prices every point with that profile; a bad one is refused, nothing run."""
    path = tmp_path / "spec.yaml"
    path.write_text(
        "model: OPT-13B\ngpu: A100-80GB\nworkload: alpaca-like\nnum_requests: 6\n"
        "grid:\n  block_size: [1, 16]\n",
        encoding="utf-8",
    )
    out = tmp_path / "out"
    args = ["sweep", str(path), "--out", str(out), "--workers", "1", "--quiet"]
    assert main([*args, "--profile", "a100-80gb/opt-13b"]) == 0
    assert "2 run, 0 already done, 0 failed" in capsys.readouterr().out
    assert main([*args[:3], str(tmp_path / "bad"), *args[4:], "--profile", "nowhere"]) == 2
    assert "profile: got 'nowhere'" in capsys.readouterr().err

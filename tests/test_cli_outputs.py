"""Every command's outputs: checked before any work (exit 2, nothing written, nothing run),
written all or nothing, special files written in place, ``-`` for standard output, a failed
write after the work (exit 5), Ctrl-C (exit 130) and a closed pipe (exit 141)."""

from __future__ import annotations

import argparse
import errno
import importlib
import io
import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from pagedkv import exits
from pagedkv.cli import build_parser, main
from pagedkv.io import path_arg

ROOT = Path(__file__).resolve().parents[1]
LESSON = ["simulate", "--workload", "lesson", "--cost-model", "unit"]


def _never(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the work started although an output destination is bad")


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def spots(tmp_path: Path) -> dict[str, Path]:
    """A file, a directory, the sweep spec and a results directory the commands need."""
    a_file = tmp_path / "a-file"
    a_file.write_text("keep me")
    a_dir = tmp_path / "a-dir"
    a_dir.mkdir()
    spec = tmp_path / "spec.yaml"
    spec.write_text("workload: lesson\ncost_model: unit\ngrid:\n  block_size: [16]\n")
    mapped = tmp_path / "mapped"  # a results directory whose block-map is a file
    mapped.mkdir()
    (mapped / "block-map").write_text("not a directory")
    return {"file": a_file, "dir": a_dir, "spec": spec, "mapped": mapped}


SIM = "pagedkv.simulation.simulate"
BENCH = "pagedkv.experiments.bench.side_by_side"
EXPERIMENT = "pagedkv.experiments.framework.run_experiment"
PLAN = "plan --gpu A100-80GB=1 --slo-ttft-p99 1"
BAD_DESTINATIONS = {  # id: (argv, {file}/{dir}/{spec} filled in; the function that is the work)
    "simulate-json-dir": ("simulate --workload lesson --json {dir}", SIM),
    "simulate-json-under-file": ("simulate --workload lesson --json {file}/r.json", SIM),
    "bench-out-file": ("bench --out {file}", BENCH),
    "bench-json-dir": ("bench --out {dir} --json {dir}", BENCH),
    "experiment-out-file": ("experiment lesson --out {file}", EXPERIMENT),
    "experiment-out-under-file": ("experiment lesson --out {file}/x", EXPERIMENT),
    "claims-out-file": ("claims --out {file}", "pagedkv.experiments.claims.run_claims"),
    "reproduce-out-file": ("reproduce --out {file}", "pagedkv.experiments.reproduce.reproduce"),
    "report-out-dir": ("report {dir} --out {dir}", "pagedkv.report.html.build_report"),
    "report-block-map-file": (
        "report {mapped} --block-map",
        "pagedkv.report.block_map.run_block_map",
    ),
    "sweep-out-file": ("sweep {spec} --out {file}", "pagedkv.sweep.sweep.run_sweep"),
    "plan-out-file": (PLAN + " --out {file}", "pagedkv.sweep.plan.run_plan"),
    "generate-json-dir": ("generate --json {dir}", "pagedkv.tensors.generate.generate"),
    "profile-out-dir": (
        "profile --model tiny-llama --out {dir}",
        "pagedkv.tensors.profiler.profile",
    ),
    "fidelity-json-dir": ("fidelity --json {dir}", "pagedkv.tensors.fidelity.fidelity"),
}


def _output_flags() -> list[tuple[str, argparse.Action]]:
    """(command, action) of every flag that names an output, in every subcommand."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [
        (name, action)
        for name, parser in sub.choices.items()
        for action in parser._actions
        if {"--json", "--out", "--save-result"} & set(action.option_strings)
    ]


def test_every_output_flag_refuses_an_empty_path_as_flags_are_read() -> None:
    flags = _output_flags()
    assert {name for name, _ in flags} >= {"simulate", "bench", "sweep", "profile", "fidelity"}
    for name, action in flags:
        assert action.type is path_arg, (name, action.option_strings)


@pytest.mark.parametrize(
    "argv",
    [
        "simulate --workload lesson --json=",
        "simulate --workload lesson --save-result=",
        "bench --out=",
        "experiment lesson --out=",
        "profile --out=",
        "fidelity --json=",
    ],
)
def test_an_empty_output_path_is_one_usage_error(
    argv: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(Path(__file__).parent)  # (an empty path would have meant here)
    before = _tree(Path.cwd())
    with pytest.raises(SystemExit) as stop:
        main(argv.split())
    assert stop.value.code == exits.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].endswith("an empty path names no file or directory")
    assert "Traceback" not in err
    assert _tree(Path.cwd()) == before


@pytest.mark.parametrize("case", list(BAD_DESTINATIONS))
def test_a_bad_destination_exits_2_before_any_work(
    case: str,
    spots: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    template, work = BAD_DESTINATIONS[case]
    if work.startswith("pagedkv.tensors"):
        pytest.importorskip("torch")
    for _, other in BAD_DESTINATIONS.values():  # imported first: none may bind the stand-in
        if not other.startswith("pagedkv.tensors") or work == other:
            importlib.import_module(other.rsplit(".", 1)[0])
    importlib.import_module("pagedkv.experiments.registry")
    module, name = work.rsplit(".", 1)
    monkeypatch.setattr(importlib.import_module(module), name, _never)
    before = _tree(tmp_path)
    argv = [arg.format(**{k: str(v) for k, v in spots.items()}) for arg in template.split()]
    assert main(argv) == exits.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("pagedkv: error: --"), err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    assert _tree(tmp_path) == before
    assert spots["file"].read_text() == "keep me"


def test_json_to_stdout_keeps_the_table_apart(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*LESSON, "--json", "-"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["summary"]["finished"] == 20
    assert "token utilization" in captured.err  # the table went to stderr
    assert not Path("-").exists()


def test_json_into_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    assert main([*LESSON, "--quiet", "--json", str(fifo)]) == 0
    reader.join(timeout=60)
    assert json.loads(got[0])["summary"]["finished"] == 20
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert _tree(tmp_path) == ["pipe"]


def test_json_into_dev_null_keeps_the_device() -> None:
    assert main([*LESSON, "--quiet", "--json", "/dev/null"]) == 0
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_full_disk_after_the_run_exits_5_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*LESSON, "--json", "/dev/full"]) == exits.EXIT_WRITE_FAILED
    captured = capsys.readouterr()
    assert "20 of 20" in captured.out  # the table came first: the result is not all lost
    assert captured.err == "pagedkv: error: cannot write /dev/full: No space left on device\n"
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_a_failed_rename_exits_5_and_leaves_the_old_file_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "r.json"
    target.write_text("old")

    def full(src: str, dst: str) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("pagedkv.io.os.replace", full)
    assert main([*LESSON, "--quiet", "--json", str(target)]) == exits.EXIT_WRITE_FAILED
    err = capsys.readouterr().err
    assert err == f"pagedkv: error: cannot write {target}: {os.strerror(errno.ENOSPC)}\n"
    assert _tree(tmp_path) == ["r.json"]
    assert target.read_text() == "old"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_bench_writes_its_files_all_or_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """bench.json and bench.csv are held back until --json is written; it fails, so none."""
    out = tmp_path / "out"
    assert main(["bench", "--out", str(out), "--json", "/dev/full"]) == exits.EXIT_WRITE_FAILED
    assert "/dev/full" in capsys.readouterr().err
    assert not out.exists() or _tree(out) == []


def test_an_experiment_writes_plots_and_results_together(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupted after its plots were drawn and before its results: nothing appears."""
    from pagedkv.experiments import framework

    def interrupted(result: Any, out: Path) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(framework, "write_results", interrupted)
    out = tmp_path / "lesson"
    argv = ["experiment", "lesson", "--quick", "--workers", "1", "--out", str(out)]
    assert main(argv) == exits.EXIT_INTERRUPTED
    assert capsys.readouterr().err == "pagedkv: interrupted\n"
    assert not out.exists() or _tree(out) == []
    monkeypatch.undo()
    assert main(argv) == 0  # the same run, uninterrupted, writes plots and results
    assert {"results.json", "results.csv", "lesson.png"} <= set(_tree(out))


def test_ctrl_c_exits_130_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr("pagedkv.simulation.simulate", interrupted)
    assert main([*LESSON, "--json", str(tmp_path / "r.json")]) == exits.EXIT_INTERRUPTED
    assert capsys.readouterr().err == "pagedkv: interrupted\n"
    assert _tree(tmp_path) == []


def test_ctrl_c_while_writing_leaves_no_temporary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "r.json"
    target.write_text("old")

    def interrupted(src: str, dst: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("pagedkv.io.os.replace", interrupted)
    assert main([*LESSON, "--quiet", "--json", str(target)]) == exits.EXIT_INTERRUPTED
    assert capsys.readouterr().err == "pagedkv: interrupted\n"
    assert _tree(tmp_path) == ["r.json"]
    assert target.read_text() == "old"


def test_a_closed_pipe_ends_quietly() -> None:
    """`pagedkv simulate --json - | head -c 100`: exit 141, nothing on stderr."""
    argv = ["simulate", "--workload", "sharegpt-like", "--num-requests", "2000"]
    argv += ["--cost-model", "unit", "--quiet", "--json", "-"]  # > 64 KiB, a pipe's buffer
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pagedkv.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    assert proc.stdout.read(100)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == exits.EXIT_BROKEN_PIPE
    assert err == b""


class _ClosedPipe(io.StringIO):
    def write(self, s: str) -> int:
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def test_a_table_into_a_closed_pipe_ends_quietly(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """rich would exit 1 on its own; the table's closed pipe is exit 141 like any other."""
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert main(LESSON) == exits.EXIT_BROKEN_PIPE
    assert capsys.readouterr().err == ""


def test_json_to_dev_stdout_redirected_to_a_file(tmp_path: Path) -> None:
    """The descriptor the shell opened is written, at its offset; the file is not replaced
    by a new one, and the table goes to stderr."""
    out = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with out.open("w") as f:
        f.write("")
        inode = os.fstat(f.fileno()).st_ino
        proc = subprocess.run(
            [sys.executable, "-m", "pagedkv.cli", *LESSON, "--json", "/dev/stdout"],
            stdout=f,
            stderr=subprocess.PIPE,
            env=env,
            check=False,
        )
    assert proc.returncode == 0
    assert b"token utilization" in proc.stderr
    assert json.loads(out.read_text())["summary"]["finished"] == 20
    assert out.stat().st_ino == inode
    assert _tree(tmp_path) == ["out.json"]


def test_a_read_only_destination_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """(Root may write anywhere, so the directory's permission is what os.access says.)"""
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr("pagedkv.io.os.access", lambda p, mode: Path(p) != locked and real(p, mode))
    assert main([*LESSON, "--json", str(locked / "r.json")]) == exits.EXIT_BAD_INPUT
    assert "not writable" in capsys.readouterr().err
    assert list(locked.iterdir()) == []

"""The command line: `pagedkv bench` prints the lesson's capacity table and every scheduler side
by side, and writes results/bench.json and results/bench.csv (the capacity table alone with
--json)."""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from pagedkv.cli import build_parser, main
from pagedkv.experiments.bench import LESSON_ONLY, SCHEDULERS
from pagedkv.experiments.lesson_capacity import lesson_capacity


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """One `pagedkv bench` run (a few seconds), shared by the tests below."""
    out_dir = tmp_path_factory.mktemp("results")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["bench", "--out", str(out_dir), "--json", str(out_dir / "capacity.json")])
    assert code == 0
    return stdout.getvalue(), out_dir


def rows(out_dir: Path) -> list[dict[str, Any]]:
    data = json.loads((out_dir / "bench.json").read_text())
    result: list[dict[str, Any]] = data["side_by_side"]["rows"]
    return result


def test_bench_prints_the_lesson_table(bench: tuple[str, Path]) -> None:
    out, out_dir = bench
    expected = lesson_capacity()
    assert f"all prompts: {expected.paged_blocks_prompts} " in out
    assert f"final length): {expected.paged_blocks_completion} " in out
    for row in expected.rows:
        assert row.allocator.split()[0] in out
    capacity = json.loads((out_dir / "capacity.json").read_text())
    assert capacity == json.loads(json.dumps(expected.to_dict()))
    bench_json = json.loads((out_dir / "bench.json").read_text())
    assert bench_json["lesson_capacity"] == capacity


def test_bench_prints_and_writes_every_scheduler(bench: tuple[str, Path]) -> None:
    out, out_dir = bench
    found = {(r["workload"], r["scheduler"]) for r in rows(out_dir)}
    assert found == {("lesson", s) for s in (*SCHEDULERS, *LESSON_ONLY)} | {
        ("sharegpt-like", s) for s in SCHEDULERS
    }
    for scheduler in (*SCHEDULERS, *LESSON_ONLY):
        assert f" {scheduler} " in out
    assert "deadlocked" in out
    with (out_dir / "bench.csv").open(newline="") as f:
        table = list(csv.DictReader(f))
    assert [(r["workload"], r["scheduler"]) for r in table] == [
        (r["workload"], r["scheduler"]) for r in rows(out_dir)
    ]
    assert {"p99_normalized_latency", "fragmentation", "pool_occupancy"} <= set(table[0])


def test_bench_facts(bench: tuple[str, Path]) -> None:
    _, out_dir = bench
    by = {(r["workload"], r["scheduler"]): r for r in rows(out_dir)}
    vllm, slots = by["lesson", "vllm"], by["lesson", "contiguous-slots"]
    assert vllm["finished"] == vllm["num_requests"] == 20
    assert vllm["iterations"] < slots["iterations"]
    assert by["lesson", "greedy-nopreempt"]["deadlocked"] is True
    for row in by.values():
        if not row["deadlocked"]:
            assert row["finished"] == row["num_requests"], row
        assert 0.0 <= row["token_utilization"] <= 1.0 + 1e-12, row
        assert row["fragmentation"] == pytest.approx(
            row["internal_fragmentation"] + row["external_fragmentation"]
        )


def test_unknown_command_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parser and every subparser below it."""
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                out.extend(_parsers(child))
    return out


def test_no_parser_takes_abbreviations() -> None:
    parsers = _parsers(build_parser())
    assert len(parsers) > 1 + 8  # the top parser and every subcommand
    assert [p.prog for p in parsers if p.allow_abbrev] == []


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--num-gpu", "5"],  # a prefix of --num-gpu-blocks
        ["simulate", "--random-input", "5"],  # a prefix of --random-input-len
        ["plan", "--tol", "0.1"],  # a prefix of --tolerance
        ["sweep", "spec.yaml", "--retry"],  # a prefix of --retry-failed
    ],
)
def test_a_prefix_of_a_flag_is_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    flag = next(a for a in argv if a.startswith("--"))
    assert "unrecognized arguments" in err
    assert flag in err.splitlines()[-1]
    assert "Traceback" not in err

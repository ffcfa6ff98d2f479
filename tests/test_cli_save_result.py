"""`pagedkv simulate --save-result`: vllm bench serve's result file from the command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pagedkv import exits
from pagedkv.cli import main
from pagedkv.report.vllm_result import VllmResultConfig, simulation_vllm_result
from pagedkv.simulation import SimulationConfig, simulate

LESSON = ["simulate", "--quiet", "--workload", "lesson", "--cost-model", "unit"]


def test_the_file_is_vllm_result_of_the_run_and_deterministic(tmp_path: Path) -> None:
    flags = ["--percentile-metrics", "ttft,e2el", "--metric-percentiles", "50,99.9"]
    flags += ["--goodput", "ttft:3000", "e2el:90000"]
    outs = [tmp_path / "a.json", tmp_path / "b.json"]
    for out in outs:
        assert main([*LESSON, "--save-result", str(out), *flags]) == exits.EXIT_OK
    assert outs[0].read_bytes() == outs[1].read_bytes()  # byte-identical across runs
    text = outs[0].read_text()
    got = json.loads(text)
    assert list(got) == sorted(got)  # sorted keys
    config = SimulationConfig.from_flat({"workload": "lesson", "cost_model": "unit"})
    result = simulate(config, token_times=True)
    want = simulation_vllm_result(
        result, VllmResultConfig.from_flags("ttft,e2el", "50,99.9", ["ttft:3000", "e2el:90000"])
    )
    assert got == json.loads(json.dumps(want))
    assert got["completed"] == result.summary["finished"]
    assert got["duration"] == result.summary["sim_time"]
    assert "p99.9_e2el_ms" in got
    assert "mean_tpot_ms" not in got


def test_save_result_leaves_the_json_as_it_was(tmp_path: Path) -> None:
    plain, with_result = tmp_path / "plain.json", tmp_path / "with.json"
    assert main([*LESSON, "--json", str(plain)]) == exits.EXIT_OK
    argv = [*LESSON, "--json", str(with_result), "--save-result", str(tmp_path / "r.json")]
    assert main(argv) == exits.EXIT_OK
    assert plain.read_bytes() == with_result.read_bytes()


def _no_work(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the run started")


@pytest.mark.parametrize(
    "flags",
    [
        ["--percentile-metrics", "ttft,latency"],
        ["--metric-percentiles", "101"],
        ["--metric-percentiles", "p99"],
        ["--goodput", "ttft"],
        ["--goodput", "itl:20"],
        ["--goodput", "tpot:-5"],
    ],
)
def test_a_bad_flag_is_one_line_before_any_work(
    flags: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("pagedkv.simulation.simulate", _no_work)
    out = tmp_path / "r.json"
    assert main([*LESSON, "--save-result", str(out), *flags]) == exits.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("pagedkv: error: "), err
    assert err.count("\n") == 1, err
    assert not out.exists()


def test_a_shaping_flag_needs_save_result(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("pagedkv.simulation.simulate", _no_work)
    assert main([*LESSON, "--goodput", "ttft:100"]) == exits.EXIT_BAD_INPUT
    assert "--save-result" in capsys.readouterr().err


def test_an_unwritable_destination_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("pagedkv.simulation.simulate", _no_work)
    target = tmp_path / "a-directory"
    target.mkdir()
    assert main([*LESSON, "--save-result", str(target)]) == exits.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("pagedkv: error: --save-result"), err
    assert err.count("\n") == 1, err
    assert list(target.iterdir()) == []


def test_save_result_on_stdout_moves_nothing_else_there(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*LESSON[:1], *LESSON[2:], "--save-result", "-"]) == exits.EXIT_OK  # not quiet
    captured = capsys.readouterr()
    assert json.loads(captured.out)["completed"] == 20  # the table went to stderr
    assert "token utilization" in captured.err

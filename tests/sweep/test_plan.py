"""The capacity planner on small real cases: its answer confirmed by direct simulations,
the cost ranking, candidates that cannot serve, bad plans and the CLI's files."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest

from pagedkv.cli import main
from pagedkv.errors import ConfigError
from pagedkv.simulation import SimulationConfig, simulate
from pagedkv.sweep.plan import CandidateResult, probe_passes, run_plan
from pagedkv.sweep.plan_spec import PlanSpec
from pagedkv.sweep.table import flatten_summary

SMALL_PLAN: dict[str, Any] = {
    "workload": "sharegpt-like",
    "num_requests": 40,
    "gpus": {"A100-40GB": 1.0},
    "slo": {"tpot_p99": 0.03},
    "seeds": 2,
    "rate_low": 0.5,
    "rate_high": 64.0,
    "tolerance": 0.1,
}


@pytest.fixture(scope="module")
def small() -> tuple[PlanSpec, CandidateResult]:
    spec = PlanSpec.from_dict(SMALL_PLAN)
    (result,) = run_plan(spec, workers=1)
    return spec, result


def _direct(spec: PlanSpec, result: CandidateResult, rate: float) -> list[dict[str, Any]]:
    return [
        flatten_summary(
            simulate(
                SimulationConfig.from_flat(result.candidate.options(spec.options, rate, seed))
            ).summary
        )
        for seed in spec.seeds
    ]


def test_answer_is_confirmed_by_direct_simulation(small: tuple[PlanSpec, CandidateResult]) -> None:
    spec, result = small
    assert result.error is None
    assert result.max_rate is not None
    assert not result.capped
    at_answer = _direct(spec, result, result.max_rate)
    assert probe_passes(at_answer, spec.slo)  # every seed meets the SLO at the answer
    assert result.slo_values["tpot_p99"] == max(m["tpot_p99"] for m in at_answer)
    # the lowest rate the search saw fail, within the tolerance above the answer, fails directly
    failed = min(rate for rate, ok in result.probes if not ok)
    assert failed / result.max_rate <= 1 + spec.tolerance
    assert not probe_passes(_direct(spec, result, failed), spec.slo)


def test_cost_per_million_requests(small: tuple[PlanSpec, CandidateResult]) -> None:
    _, result = small
    assert result.max_rate is not None
    expected = 1.0 * 1 / (result.max_rate * 3600) * 1e6  # price x GPUs / (req/s x 3600) x 1e6
    assert result.cost_per_million == pytest.approx(expected)


def test_ranked_by_cost_and_a_model_that_does_not_fit_is_reported(tmp_path: Path) -> None:
    plan = {
        **SMALL_PLAN,
        "gpus": {"A100-40GB": 1.0, "A100-80GB": 1.5, "L4": 0.1},  # OPT-13B's weights > 24 GB
        "slo": {"normalized_latency_p99": 0.05},
        "seeds": 1,
        "tolerance": 0.5,
    }
    spec = PlanSpec.from_dict(plan)
    results = run_plan(spec, workers=2)
    costs = [r.cost_per_million for r in results if r.cost_per_million is not None]
    assert costs == sorted(costs)
    assert len(costs) == 2
    last = results[-1]
    assert last.candidate.gpu == "L4"
    assert last.max_rate is None
    assert last.error is not None
    assert last.status.startswith("error: ")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"gpus": {"B300": 1.0}}, "gpu"),
        ({"gpus": {"A100-40GB": -1}}, "gpus.A100-40GB"),
        ({"slo": {"ttft_p50": 1.0}}, "slo.ttft_p50"),
        ({"slo": {}}, "slo"),
        ({"block_sizes": [16, "x"]}, "block_sizes"),
        ({"rate_high": 0.1}, "rate_high"),
        ({"request_rate": 2.0}, "request_rate"),
        ({"max_num_seqz": 2}, "max_num_seqz"),
        ({"schedulers": ["fifo"]}, "scheduler"),
    ],
)
def test_bad_plan_is_one_clear_error(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        PlanSpec.from_dict({**SMALL_PLAN, **change})
    assert err.value.field == field


def test_cli_writes_table_csv_json_and_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # piped tables honour COLUMNS: keep each row on a line
    path = tmp_path / "plan.yaml"
    path.write_text(
        "workload: alpaca-like\nnum_requests: 20\ngpus: {A100-40GB: 1.0}\n"
        "slo: {normalized_latency_p99: 0.05}\nseeds: 1\ntolerance: 0.5\n",
        encoding="utf-8",
    )
    out = tmp_path / "out"
    args = ["plan", str(path), "--gpu", "A100-80GB=2", "--out", str(out), "--workers", "1"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "A100-80GB x1 bs16 vllm" in printed
    assert "A100-40GB" not in printed
    with (out / "plan.csv").open(encoding="utf-8") as f:
        (row,) = list(csv.DictReader(f))
    assert row["gpu"] == "A100-80GB"
    assert float(row["cost_per_million_requests"]) > 0
    assert json.loads((out / "plan.json").read_text(encoding="utf-8"))["spec"]["seeds"] == [0]
    assert (out / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["plan", "--gpu", "A100-80GB", "--out", str(out)]) == 2
    assert "NAME=PRICE" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"tolerance": 1e-17}, "tolerance"),  # below float64's spacing: it used to hang
        ({"tolerance": 0}, "tolerance"),
        ({"tolerance": math.nan}, "tolerance"),
        ({"rate_low": math.inf}, "rate_low"),
        ({"rate_high": 1e300}, "rate_high"),
        ({"gpus": {"A100-40GB": math.inf}}, "gpus.A100-40GB"),
        ({"slo": {"ttft_p99": math.nan}}, "slo.ttft_p99"),
        ({"seeds": 10**7}, "seeds"),
    ],
)
def test_plan_numbers_are_bounded(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        PlanSpec.from_dict({**SMALL_PLAN, **change})
    assert err.value.field == field


def test_cli_plan_refuses_a_tolerance_below_the_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", "--gpu", "A100-40GB=1", "--slo-ttft-p99", "1", "--tolerance", "1e-17"]
    assert main([*argv, "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "pagedkv: error: tolerance: got 1e-17; must be a finite number in [1e-09, 10]"
    ]
    assert not (tmp_path / "out").exists()


def test_a_plan_file_that_is_not_utf8_is_one_error(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_bytes(b"gpus: {A100-40GB: 1}\n# \xe9\n")
    with pytest.raises(ConfigError, match=r"UTF-8 text \(line 2") as err:
        PlanSpec.from_yaml(path)
    assert err.value.field == "plan"


@pytest.mark.parametrize("item", ["block_size=[1", "swap_space=1" + "0" * 5000])
def test_cli_plan_set_with_bad_yaml_is_one_line(
    item: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", "--gpu", "A100-40GB=1", "--slo-ttft-p99", "1", "--set", item]
    assert main([*argv, "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pagedkv: error: --set: got ")
    assert err.count("\n") == 1

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
from pagedkv.sweep.plan import CandidateResult, TargetResult, probe_passes, run_plan
from pagedkv.sweep.plan_output import write_plan
from pagedkv.sweep.plan_spec import PlanSpec
from pagedkv.sweep.replicas import MAX_EXTRA_REPLICAS
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


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--gpu", "A100-40GB=1", "--slo-ttft-p99", "1"],
        ["sweep", "spec.yaml"],
        ["sweep", "spec.yaml", "--backend", "local"],
    ],
)
def test_cli_address_without_ray_is_one_line_before_any_work(
    argv: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A local run would ignore the cluster's address: refused, nothing run or written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.yaml").write_text("workload: lesson\ncost_model: unit\n")
    argv = [*argv, "--address", "auto", "--out", str(tmp_path / "out"), "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == "pagedkv: error: --address: got 'auto'; is read only with --backend ray\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]


TARGET_PLAN: dict[str, Any] = {**SMALL_PLAN, "seeds": 1, "tolerance": 0.3}


@pytest.fixture(scope="module")
def at_target() -> tuple[PlanSpec, CandidateResult, CandidateResult]:
    """The same one-candidate plan without and with a target rate well above what one replica
    sustains."""
    spec = PlanSpec.from_dict(TARGET_PLAN)
    (alone,) = run_plan(spec, workers=1)
    assert alone.max_rate is not None
    target = PlanSpec.from_dict({**TARGET_PLAN, "target_rate": 3.7 * alone.max_rate})
    (served,) = run_plan(target, workers=1)
    return target, alone, served


def test_replicas_are_the_fewest_that_meet_the_slos(
    at_target: tuple[PlanSpec, CandidateResult, CandidateResult],
) -> None:
    spec, _, result = at_target
    assert spec.target_rate is not None
    assert result.target is not None
    assert result.target.error is None
    k = result.replicas
    assert k is not None
    assert k >= 2
    # one replica at R / k meets the SLOs for every seed; at R / (k - 1) it does not
    assert probe_passes(_direct(spec, result, spec.target_rate / k), spec.slo)
    assert not probe_passes(_direct(spec, result, spec.target_rate / (k - 1)), spec.slo)
    worst = max(m["tpot_p99"] for m in _direct(spec, result, spec.target_rate / k))
    assert result.target.slo_values == {"tpot_p99": worst}


def test_cost_at_the_target_rate(
    at_target: tuple[PlanSpec, CandidateResult, CandidateResult],
) -> None:
    spec, _, result = at_target
    assert result.replicas is not None
    assert spec.target_rate is not None
    hourly = result.replicas * result.candidate.tensor_parallel_size * 1.0  # x price per GPU-h
    assert result.cost_per_hour == pytest.approx(hourly)
    assert result.cost_per_million_at_target == pytest.approx(
        hourly / (spec.target_rate * 3600) * 1e6
    )


def test_a_target_leaves_the_rate_search_alone(
    at_target: tuple[PlanSpec, CandidateResult, CandidateResult],
) -> None:
    _, alone, served = at_target
    assert (served.max_rate, served.probes, served.slo_values) == (
        alone.max_rate,
        alone.probes,
        alone.slo_values,
    )
    assert alone.target is None
    assert alone.replicas is None
    assert alone.cost_per_hour is None
    # the row without a target is the row with one, less the target's columns
    target_columns = {"target_rate", "replicas", "total_gpus", "cost_per_hour"}
    target_columns |= {"cost_per_million_at_target", "tpot_p99_at_target", "replica_probes"}
    assert {k: v for k, v in served.row().items() if k not in target_columns} == alone.row()
    assert target_columns <= set(served.row())


def test_candidates_without_a_replica_count_say_so_and_rank_last() -> None:
    plan = {
        **TARGET_PLAN,
        "gpus": {"L4": 0.1, "A100-40GB": 1.0},  # OPT-13B's weights > 24 GB: L4 is an error
        "target_rate": 10.0,
    }
    first, last = run_plan(PlanSpec.from_dict(plan), workers=2)
    assert first.candidate.gpu == "A100-40GB"
    assert first.replicas is not None
    assert last.candidate.gpu == "L4"
    assert last.status.startswith("error: ")
    assert last.replicas is None
    assert last.cost_per_hour is None
    assert {"replicas", "cost_per_hour", "cost_per_million_at_target"} <= last.row().keys()
    # nothing meets this SLO, not even rate_low: no replica count, and the status says why
    (missed,) = run_plan(
        PlanSpec.from_dict({**plan, "gpus": {"A100-40GB": 1.0}, "slo": {"tpot_p99": 1e-4}}),
        workers=1,
    )
    assert missed.status == "misses the SLOs at rate_low"
    assert missed.replicas is None
    assert missed.row()["replicas"] is None


def test_no_replica_count_under_the_cap_is_a_status() -> None:
    spec = PlanSpec.from_dict({**TARGET_PLAN, "target_rate": 10.0})
    (candidate,) = spec.candidates()
    target = TargetResult(10.0, None, 3, [(k, False) for k in range(3, 12)], {}, None)
    result = CandidateResult(candidate, 4.0, False, [(4.0, True)], {}, None, target)
    assert result.status == f"no replica count up to {3 + MAX_EXTRA_REPLICAS} meets the SLOs"
    assert result.row()["replicas"] is None
    assert result.cost_per_hour is None


@pytest.mark.parametrize("value", [0, -1.0, math.nan, math.inf, 1e10, "fast", True, [5]])
def test_bad_target_rate_is_one_clear_error(value: object) -> None:
    with pytest.raises(ConfigError) as err:
        PlanSpec.from_dict({**SMALL_PLAN, "target_rate": value})
    assert err.value.field == "target_rate"


@pytest.mark.parametrize("value", ["0", "-3", "nan", "inf"])
def test_cli_bad_target_rate_is_one_line(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", "--gpu", "A100-40GB=1", "--slo-ttft-p99", "1", "--target-rate", value]
    assert main([*argv, "--out", str(tmp_path / "out"), "--quiet"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("pagedkv: error: target_rate: got ")
    assert line.endswith("; must be a finite number in [1e-09, 1000000000]")
    assert not (tmp_path / "out").exists()


TINY_PLAN = (
    "workload: alpaca-like\nnum_requests: 20\ngpus: {A100-40GB: 1.0, A100-80GB: 2.5}\n"
    "slo: {normalized_latency_p99: 0.05}\nseeds: 1\ntolerance: 0.5\n"
)
TODAYS_COLUMNS = (
    "candidate,gpu,tensor_parallel_size,block_size,scheduler,num_gpus,price_per_gpu_hour,"
    "max_rate,cost_per_million_requests,normalized_latency_p99_at_max_rate,probes,status"
)


def test_cli_target_rate_end_to_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    path = tmp_path / "plan.yaml"
    path.write_text(TINY_PLAN, encoding="utf-8")
    plain, target = tmp_path / "plain", tmp_path / "target"
    argv = ["plan", str(path), "--workers", "1"]
    assert main([*argv, "--out", str(plain)]) == 0
    plain_table = capsys.readouterr().out
    assert main([*argv, "--out", str(target), "--target-rate", "90"]) == 0
    table = capsys.readouterr().out
    assert "serving 90 req/s" in table
    assert "replicas" in table
    assert "$/hour" in table
    assert "replicas" not in plain_table
    assert "$/hour" not in plain_table
    with (target / "plan.csv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    costs = [float(r["cost_per_hour"]) for r in rows]
    assert len(rows) == 2
    assert costs == sorted(costs)
    for r in rows:
        k, price = int(r["replicas"]), float(r["price_per_gpu_hour"])
        assert float(r["cost_per_hour"]) == pytest.approx(k * int(r["num_gpus"]) * price)
        assert r["candidate"] in table
    payload = json.loads((target / "plan.json").read_text(encoding="utf-8"))
    assert payload["spec"]["target_rate"] == 90.0
    for c in payload["candidates"]:
        assert [c["replicas"], True] in c["replica_counts_probed"]
    assert (target / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_a_target_the_outputs_are_unchanged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    path = tmp_path / "plan.yaml"
    path.write_text(TINY_PLAN, encoding="utf-8")
    spec = PlanSpec.from_yaml(path)
    assert "target_rate" not in spec.to_dict()
    assert main(["plan", str(path), "--workers", "1", "--out", str(tmp_path / "a")]) == 0
    printed = capsys.readouterr().out
    header = next(line for line in printed.splitlines() if "rank" in line)
    cells = [c.strip() for c in header.strip("┃ ").split("┃")]
    assert cells == ["rank", "candidate", "GPUs", "$/GPU-h", "max req/s", "$/M requests", "status"]
    csv_text = (tmp_path / "a" / "plan.csv").read_text(encoding="utf-8")
    assert csv_text.splitlines()[0] == TODAYS_COLUMNS
    payload = json.loads((tmp_path / "a" / "plan.json").read_text(encoding="utf-8"))
    assert "target_rate" not in payload["spec"]
    assert all(set(c) == {*TODAYS_COLUMNS.split(","), "probe_rates"} for c in payload["candidates"])
    # the files written through run_plan and write_plan directly are the CLI's, byte for byte
    write_plan(run_plan(spec, workers=1), spec, tmp_path / "b")
    for name in ("plan.csv", "plan.json", "plan.png"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_cli_plan_on_profiles_refuses_a_gpu_without_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--cost-model profiled takes each candidate GPU's built-in profile; L4 has none."""
    argv = ["plan", "--model", "OPT-13B", "--gpu", "L4=1", "--slo-ttft-p99", "1"]
    out = tmp_path / "out"
    assert main([*argv, "--cost-model", "profiled", "--out", str(out), "--quiet"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("pagedkv: error: profile: ")
    assert "none built in" in line
    assert not out.exists()

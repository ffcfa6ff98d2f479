"""`pagedkv claims` on quick results: the schema, and each verdict following from its numbers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pagedkv.cli import main
from pagedkv.experiments import claims as claims_mod
from pagedkv.experiments import framework
from pagedkv.experiments.verdict import VERDICTS, Measurement, Target, verdict_each

FIELDS = {
    "id",
    "source",
    "citation",
    "statement",
    "metric",
    "unit",
    "claimed",
    "favour",
    "condition",
    "time_model",
    "measured",
    "ci_low",
    "ci_high",
    "verdict",
    "judged",
    "evidence",
    "measurements",
}
TIMED = {"rate-latency", "block-size", "memory-pressure", "prefix-sharing", "preemption"}
"""Evidence whose figures are rates, latencies or throughput: they need the cost model."""


@pytest.fixture(scope="module")
def quick_claims(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[claims_mod.Claim]]:
    out = tmp_path_factory.mktemp("results")
    return out, claims_mod.run_claims(out, quick=True, workers=1)


def test_claims_json_schema(quick_claims: tuple[Path, list[claims_mod.Claim]]) -> None:
    out, _ = quick_claims
    data = json.loads((out / "claims" / "claims.json").read_text())
    assert data["claims"]
    ids = [c["id"] for c in data["claims"]]
    assert len(ids) == len(set(ids))
    for c in data["claims"]:
        assert set(c) == FIELDS
        assert c["source"] in ("seed-simulator", "vllm-paper")
        assert c["verdict"] in VERDICTS
        assert c["citation"]
        assert c["condition"]
        assert c["claimed"].endswith(f"favour: {c['favour']}")
        assert c["measurements"]
        assert (out / c["evidence"] / "results.json").exists()
        if c["evidence"] in TIMED:
            assert c["time_model"]
            assert "cost model" in c["time_model"]
    assert (out / "claims" / "claims.csv").read_text().startswith("id,")
    sources = {c["source"] for c in data["claims"]}
    assert sources == {"seed-simulator", "vllm-paper"}


def test_verdicts_follow_from_the_numbers(
    quick_claims: tuple[Path, list[claims_mod.Claim]],
) -> None:
    """Each claim's verdict is the rule applied to the measurements it records, each against
    the range recorded with it; and 'measured' is the first of them."""
    _, claims = quick_claims
    for c in claims:
        targets = [
            Target(
                Measurement(r["condition"], r["mean"], r["ci_low"], r["ci_high"], r["n"]),
                r["low"],
                r["high"],
            )
            for r in c.measurements
        ]
        overall, each = verdict_each(targets, c.favour)  # type: ignore[arg-type]
        assert overall == c.verdict, c.id
        assert [j.verdict for j in each] == [r["verdict"] for r in c.measurements]
        assert c.measured == c.measurements[0]["mean"]


def test_paper_ranges_are_per_figure(quick_claims: tuple[Path, list[claims_mod.Claim]]) -> None:
    """The throughput claims carry Fig. 12's own ranges, not the abstract's 2-4x for all."""
    _, claims = quick_claims
    by = {c.id: c for c in claims}
    oracle = by["throughput-over-orca-oracle-sharegpt"].measurements[0]
    assert (oracle["low"], oracle["high"]) == (1.7, 2.7)
    orca_max = by["throughput-over-orca-max-sharegpt"].measurements[0]
    assert (orca_max["low"], orca_max["high"]) == (2.7, 8.0)
    assert "Fig. 12" in by["throughput-over-orca-oracle-sharegpt"].citation
    assert "no range stated" in by["throughput-over-orca-max-alpaca"].citation


def test_existing_results_are_read_not_rerun(
    quick_claims: tuple[Path, list[claims_mod.Claim]], monkeypatch: pytest.MonkeyPatch
) -> None:
    out, claims = quick_claims

    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("an experiment ran although its results.json exists")

    monkeypatch.setattr(framework, "run_experiment", fail)
    again = claims_mod.run_claims(out, quick=True, workers=1)
    assert again == claims


def _range(statement: str) -> tuple[float | None, float | None]:
    """The claimed range, read back from the statement's '(claimed: ... in [a, b])' tail."""
    tail = statement.rsplit("(claimed:", 1)[1]
    if " in [" in tail:
        a, b = tail.split(" in [", 1)[1].rstrip("])").split(", ")
        return float(a), float(b)
    if ">=" in tail:
        return float(tail.split(">=")[1].rstrip(")")), None
    return None, float(tail.split("<=")[1].rstrip(")"))


def _damage(results: Path, how: str) -> None:
    path = results / "fragmentation" / "results.json"
    data = json.loads(path.read_text())
    if how == "cut":
        path.write_text(path.read_text()[:100])
    elif how == "bad byte":
        path.write_bytes(b"\xff" + path.read_bytes())
    elif how == "no columns":
        del data["columns"]
        path.write_text(json.dumps(data))
    elif how == "rows not a list":
        path.write_text(json.dumps({**data, "rows": {"a": 1}}))
    elif how == "no seed column":
        path.write_text(json.dumps({**data, "columns": ["x", "y"]}))
    elif how == "a list":
        path.write_text("[1, 2]")


@pytest.mark.parametrize(
    ("how", "named"),
    [
        ("cut", "must be JSON (line "),
        ("bad byte", "must be UTF-8 text (line 1: byte 0xff"),
        ("no columns", "results.json: columns: got None; is missing"),
        ("rows not a list", "results.json: rows: got {'a': 1}; must be a list of objects"),
        ("no seed column", "must name a 'seed' column"),
        ("a list", "must be a JSON object"),
    ],
)
def test_a_damaged_results_json_is_one_line_naming_the_file(
    quick_claims: tuple[Path, list[claims_mod.Claim]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    how: str,
    named: str,
) -> None:
    out, _ = quick_claims
    results = tmp_path / "results"
    shutil.copytree(out, results)
    _damage(results, how)
    monkeypatch.setattr(framework, "run_experiment", lambda *a, **k: pytest.fail("ran"))
    assert main(["claims", "--out", str(results), "--quick"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert str(results / "fragmentation" / "results.json") in err
    assert named in err

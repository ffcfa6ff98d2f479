"""`pagedkv claims` on quick results: the schema, and each verdict following from its numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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

"""`pagedkv claims` on quick results: the schema, and each verdict following from its numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pagedkv.experiments import claims as claims_mod
from pagedkv.experiments import framework
from pagedkv.experiments.verdict import (
    CONTRADICTED,
    NOT_MEASURED,
    SUPPORTED,
    VERDICTS,
    Measurement,
    holds,
)

FIELDS = {
    "id",
    "source",
    "statement",
    "metric",
    "measured",
    "ci_low",
    "ci_high",
    "unit",
    "verdict",
    "condition",
    "evidence",
}


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
        assert (out / c["evidence"] / "results.json").exists()
    assert (out / "claims" / "claims.csv").read_text().startswith("id,")
    sources = {c["source"] for c in data["claims"]}
    assert sources == {"seed-simulator", "vllm-paper"}


def test_verdicts_follow_from_the_numbers(
    quick_claims: tuple[Path, list[claims_mod.Claim]],
) -> None:
    """The first measurement (the row's own numbers) holds iff the verdict says it can."""
    _, claims = quick_claims
    for c in claims:
        if c.verdict == NOT_MEASURED:
            continue
        low, high = _range(c.statement)
        first = holds(Measurement("", c.measured, c.ci_low, c.ci_high), low, high)
        if c.verdict == SUPPORTED:
            assert first, c
        if c.verdict == CONTRADICTED:
            assert not first, c


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

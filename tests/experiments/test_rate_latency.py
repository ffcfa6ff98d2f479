"""rate-latency's sustained rate: a bisection on the rate, checked against fresh runs."""

from __future__ import annotations

import pytest

from pagedkv.experiments import framework, rate_latency
from pagedkv.experiments.framework import ExperimentResult, measure


@pytest.fixture(scope="module")
def result() -> ExperimentResult:
    return framework.run_experiment(rate_latency, quick=True, workers=1)


def _passes_at(workload: str, scheduler: str, rate: float, seed: int) -> bool:
    point = rate_latency._point(workload, scheduler, rate, seed, rate_latency.QUICK_REQUESTS)
    row, _ = measure(point)
    return rate_latency._passes(row)


def test_every_search_ends_bracketed_to_the_tolerance(result: ExperimentResult) -> None:
    """The reported rate passes and the lowest failing probe above it fails when simulated
    afresh, and they are within the relative tolerance of each other (or the search hit one
    of its bounds)."""
    tol = result.derived["relative_tolerance"]
    assert tol == rate_latency.QUICK_TOLERANCE
    searches = result.derived["sustained"]
    keys = {(s["workload"], s["scheduler"], s["seed"]) for s in searches}
    assert len(keys) == len(searches) == 2 * len(rate_latency.SCHEDULERS) * framework.QUICK_SEEDS
    checked = 0
    for s in searches:
        low, high = rate_latency.SEARCH[s["workload"]]
        rate, failed = s["rate"], s["failed"]
        if rate is None:  # fails at the search's low
            assert failed == low
            continue
        if s["capped"]:
            assert rate == high
            continue
        assert failed is not None
        assert rate < failed <= rate * (1 + tol) * (1 + 1e-12)
        if checked < 4:  # a few fresh runs: the same verdicts again
            assert _passes_at(s["workload"], s["scheduler"], rate, s["seed"])
            assert not _passes_at(s["workload"], s["scheduler"], failed, s["seed"])
            checked += 1
    assert checked


def test_sustained_ratio_pairs_seeds(result: ExperimentResult) -> None:
    wl = "sharegpt-like"
    a = rate_latency.sustained(result, wl, "orca-pow2")
    b = rate_latency.sustained(result, wl, "orca-max")
    ratio = rate_latency.sustained_ratio(result, wl, "orca-pow2", "orca-max")
    expected = [x / y for s, x in a.items() if x and (y := b.get(s))]
    if not any(x["capped"] for x in result.derived["sustained"] if x["scheduler"] == "orca-max"):
        assert ratio.n == len(expected)
        assert ratio.mean == pytest.approx(sum(expected) / len(expected))


def test_batch_sizes_are_read_at_the_papers_rates(result: ExperimentResult) -> None:
    assert rate_latency.BATCH_RATE == {"sharegpt-like": 2.0, "alpaca-like": 30.0}
    for wl, rate in rate_latency.BATCH_RATE.items():
        assert rate in rate_latency.QUICK_RATES[wl]
        assert rate in rate_latency.RATES[wl]
        assert rate_latency.batch_ratio(result, wl, "vllm", "orca-max").n == framework.QUICK_SEEDS

"""The percentile-bootstrap interval (pagedkv.report.stats.bootstrap_ci) and the metrics' bounds.

The t interval is tested in tests/experiments/test_stats.py; here: the bootstrap agrees with the
exact bootstrap distribution of a small sample (every resample enumerated), stays inside the
sample's range and the metric's bounds, and gives no interval below ``MIN_N`` values.
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.experiments import sharing_metrics  # noqa: F401  (registers its metrics)
from pagedkv.experiments.metrics import METRICS, SHARE_UNITS, bounds, read_metrics, unit
from pagedkv.report.stats import MIN_N, bootstrap_ci, mean_ci, summarize
from pagedkv.simulation import SimulationConfig, simulate

shares = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@settings(max_examples=50, deadline=None)
@given(st.lists(shares, min_size=MIN_N, max_size=12))
def test_a_share_interval_stays_in_zero_one_and_in_the_sample_range(xs: list[float]) -> None:
    ci = bootstrap_ci(xs, (0.0, 1.0))
    assert ci.mean is not None
    assert ci.low is not None
    assert ci.high is not None
    assert ci.n == len(xs)
    assert 0.0 <= ci.low <= ci.mean <= ci.high <= 1.0
    assert min(xs) - 1e-12 <= ci.low
    assert ci.high <= max(xs) + 1e-12


@settings(max_examples=30, deadline=None)
@given(st.lists(finite, min_size=MIN_N, max_size=8))
def test_the_same_values_give_the_same_interval(xs: list[float]) -> None:
    assert bootstrap_ci(xs) == bootstrap_ci(list(xs))


def test_near_zero_shares_where_the_t_interval_goes_negative() -> None:
    """The case the bootstrap is for: t's symmetric interval leaves [0, 1], it cannot."""
    xs = [0.0, 0.0, 0.0, 0.02]
    t = mean_ci(xs)
    assert t.low is not None
    assert t.low < 0
    boot = bootstrap_ci(xs, bounds("token_states"))
    assert boot.low is not None
    assert boot.high is not None
    assert boot.low == 0.0
    assert 0 < boot.high <= 0.02


def test_bounds_clip_the_interval() -> None:
    ci = bootstrap_ci([1.0, 2.0, 3.0, 4.0], (2.0, 3.0))
    assert ci.low == 2.0
    assert ci.high == 3.0
    assert ci.mean == 2.5


@pytest.mark.parametrize("n", range(MIN_N))
def test_below_min_n_the_mean_has_no_interval(n: int) -> None:
    ci = bootstrap_ci([0.25 * (i + 1) for i in range(n)], (0.0, 1.0))
    assert ci.n == n
    assert (ci.low, ci.high) == (None, None)
    assert ci.mean == (None if n == 0 else pytest.approx(0.25 * (n + 1) / 2))


def test_none_values_are_skipped() -> None:
    assert bootstrap_ci([1.0, None, 2.0, 4.0]) == bootstrap_ci([1.0, 2.0, 4.0])


@pytest.mark.parametrize("xs", [[0.0, 1.0, 5.0], [3.0, 1.0, 4.0, 1.5], [0.1, 0.2, 0.4, 0.8]])
def test_agrees_with_the_exact_bootstrap_distribution(xs: list[float]) -> None:
    """A differential test: every one of the n^n resamples enumerated (equally likely) gives
    the bootstrap distribution of the mean exactly; the sampled percentiles must sit at its
    2.5% and 97.5% points, up to the resampling's own error."""
    n = len(xs)
    means = sorted(math.fsum(c) / n for c in itertools.product(xs, repeat=n))
    ci = bootstrap_ci(xs)
    assert ci.low is not None
    assert ci.high is not None

    def below(x: float) -> float:
        return sum(m < x - 1e-12 for m in means) / len(means)

    def at_most(x: float) -> float:
        return sum(m <= x + 1e-12 for m in means) / len(means)

    tol = 0.012  # a few binomial standard errors of a 2.5% quantile at 4000 resamples
    assert below(ci.low) <= 0.025 + tol
    assert at_most(ci.low) >= 0.025 - tol
    assert below(ci.high) <= 0.975 + tol
    assert at_most(ci.high) >= 0.975 - tol


def test_summarize_uses_each_metrics_bounds() -> None:
    rows = [{"k": 1, "seed": s, "share": v, "free": v} for s, v in enumerate([0.0, 0.0, 0.03])]
    out = summarize(rows, ["k"], ["share", "free"], {"share": (0.0, 1.0)})[0]
    assert out["share_ci_low"] == 0.0
    assert out["share_ci_high"] <= 0.03
    assert out["n"] == 3


def test_every_metric_has_bounds_from_its_unit() -> None:
    for name in METRICS:
        low, high = bounds(name)
        assert low == 0.0, name
        assert (high == 1.0) == (unit(name) in SHARE_UNITS), name
    assert bounds("not a metric") == (None, None)
    assert bounds("token_utilization") == bounds("saved_fraction") == (0.0, 1.0)
    assert bounds("request_throughput") == (0.0, None)


@pytest.mark.parametrize("scheduler", ["vllm", "orca-max"])
def test_a_runs_metrics_lie_within_their_bounds(scheduler: str) -> None:
    flat = {
        "workload": "lesson",
        "cost_model": "unit",
        "max_model_len": 256,
        "block_size": 16,
        "num_gpu_blocks": 100,
        "scheduler": scheduler,
    }
    summary = simulate(SimulationConfig.from_flat(flat)).summary
    values = read_metrics(summary, list(METRICS))
    for name, value in values.items():
        if value is None:
            continue
        low, high = bounds(name)
        assert low is None or value >= low - 1e-12, (name, value)
        assert high is None or value <= high + 1e-12, (name, value)

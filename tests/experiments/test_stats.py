"""The mean and its 95% t interval (pagedkv.report.stats; the bootstrap: tests/report)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats as sps

from pagedkv.report.stats import mean_ci, summarize, summary_columns

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@given(st.lists(finite, min_size=2, max_size=20))
def test_interval_contains_the_mean(xs: list[float]) -> None:
    ci = mean_ci(xs)
    assert ci.n == len(xs)
    assert ci.low is not None
    assert ci.high is not None
    assert ci.mean is not None
    assert ci.low <= ci.mean <= ci.high


@given(st.lists(st.integers(-1000, 1000).map(float), min_size=2, max_size=20, unique=True))
def test_agrees_with_scipy_t_interval(xs: list[float]) -> None:
    """A differential test: the same interval as scipy's own t.interval on the sample."""
    ci = mean_ci(xs)
    mean = sum(xs) / len(xs)
    sem = sps.sem(xs)
    lo, hi = sps.t.interval(0.95, len(xs) - 1, loc=mean, scale=sem)
    assert ci.low == pytest.approx(lo, rel=1e-6, abs=1e-6)
    assert ci.high == pytest.approx(hi, rel=1e-6, abs=1e-6)


def test_constant_sample_has_zero_width() -> None:
    ci = mean_ci([3.0, 3.0, 3.0])
    assert (ci.mean, ci.low, ci.high) == (3.0, 3.0, 3.0)


def test_one_value_has_no_interval_and_none_are_skipped() -> None:
    assert mean_ci([2.0, None]) == mean_ci([2.0])
    one = mean_ci([2.0])
    assert (one.mean, one.low, one.high, one.n) == (2.0, None, None, 1)
    assert mean_ci([None]).mean is None


def test_two_seeds_use_the_t_quantile_of_one_degree_of_freedom() -> None:
    ci = mean_ci([0.0, 2.0])  # s = sqrt(2), sem = 1, t_{0.975, 1} = 12.706...
    assert ci.high is not None
    assert ci.high - 1.0 == pytest.approx(12.7062047, rel=1e-6)


def test_summarize_groups_by_configuration_in_first_seen_order() -> None:
    rows = [
        {"a": 2, "seed": 0, "m": 1.0},
        {"a": 1, "seed": 0, "m": 5.0},
        {"a": 2, "seed": 1, "m": 3.0},
        {"a": 1, "seed": 1, "m": 5.0},
    ]
    rows += [{"a": 2, "seed": 2, "m": 2.0}, {"a": 1, "seed": 2, "m": 5.0}]
    out = summarize(rows, ["a"], ["m"])
    assert [s["a"] for s in out] == [2, 1]
    assert out[0]["m_mean"] == 2.0
    assert out[0]["n"] == 3
    assert out[1]["m_ci_low"] == out[1]["m_ci_high"] == 5.0
    assert list(out[0]) == summary_columns(["a"], ["m"])
    assert math.isfinite(out[0]["m_ci_high"])

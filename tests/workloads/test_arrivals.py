"""Arrival processes: t = 0 first, the rate and the burstiness asked for, determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pagedkv.errors import ConfigError
from pagedkv.workloads.arrivals import (
    Arrival,
    all_at_once,
    arrival_times,
    gamma_arrivals,
    poisson_arrivals,
)

N = 200_001  # 200,000 gaps


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _gaps(times: list[float]) -> np.ndarray:
    return np.diff(np.asarray(times))


def test_all_at_once_is_all_zero() -> None:
    assert all_at_once(4) == [0.0] * 4
    assert arrival_times(3, "all-at-once", rng=_rng()) == [0.0] * 3


@pytest.mark.parametrize("process", list(Arrival))
def test_first_request_at_zero_and_times_non_decreasing(process: Arrival) -> None:
    times = arrival_times(1000, process, rng=_rng(1), rate=3.0, burstiness=0.25)
    assert len(times) == 1000
    assert times[0] == 0.0
    assert times == sorted(times)
    assert all(isinstance(t, float) for t in times)


@pytest.mark.parametrize("process", list(Arrival))
def test_no_requests_and_one_request(process: Arrival) -> None:
    assert arrival_times(0, process, rng=_rng(), rate=1.0) == []
    assert arrival_times(1, process, rng=_rng(), rate=1.0) == [0.0]


@pytest.mark.parametrize("rate", [0.5, 4.0, 30.0])
def test_poisson_rate_and_cv(rate: float) -> None:
    gaps = _gaps(poisson_arrivals(N, rate, _rng(2)))
    # Rate: (N - 1) gaps over the last time. The mean of n exponential gaps has a relative
    # standard error of 1/sqrt(n) = 0.22%; 1% is about 4.5 of them.
    assert (N - 1) / gaps.sum() == pytest.approx(rate, rel=0.01)
    # CV 1: the sample standard deviation's relative standard error is about
    # sqrt((kurtosis - 1) / 4n) = sqrt(8 / 4n) = 0.32% for the exponential; 2% is about 6.
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.02)


@pytest.mark.parametrize(("rate", "cv"), [(2.0, 0.5), (2.0, 1.0), (10.0, 2.0), (1.0, 3.0)])
def test_gamma_rate_and_cv(rate: float, cv: float) -> None:
    gaps = _gaps(gamma_arrivals(N, rate, 1 / cv**2, _rng(3)))
    # The mean gap's relative standard error is cv / sqrt(n) (0.67% at cv 3): 3% is 4.5 of them.
    assert (N - 1) / gaps.sum() == pytest.approx(rate, rel=0.01 * max(cv, 1.0))
    # The sample CV's relative error: sqrt((kurtosis - 1) / 4n) with kurtosis 3 + 6 cv^2
    # (gamma with shape 1/cv^2): 0.84% at cv 3. Tolerance: 5 of them, at least 2%.
    kurtosis = 3 + 6 * cv**2
    tolerance = max(0.02, 5 * math.sqrt((kurtosis - 1) / (4 * (N - 1))))
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=tolerance)


def test_gamma_with_cv_one_is_poisson_in_law() -> None:
    gamma = _gaps(gamma_arrivals(N, 5.0, 1.0, _rng(4)))
    poisson = _gaps(poisson_arrivals(N, 5.0, _rng(5)))
    # Same law: quantiles of the two samples agree (exponential quantile -ln(1 - q) / rate).
    for q in (0.1, 0.5, 0.9, 0.99):
        expected = -math.log(1 - q) / 5.0
        assert np.quantile(gamma, q) == pytest.approx(expected, rel=0.03)
        assert np.quantile(poisson, q) == pytest.approx(expected, rel=0.03)


def test_burstier_means_more_clumped() -> None:
    # Same rate, higher cv: more gaps far below the mean (requests in bursts).
    regular = _gaps(gamma_arrivals(10_001, 1.0, 4.0, _rng(6)))
    bursty = _gaps(gamma_arrivals(10_001, 1.0, 0.25, _rng(6)))
    assert np.mean(bursty < 0.1) > 3 * np.mean(regular < 0.1)


@pytest.mark.parametrize("process", [Arrival.POISSON, Arrival.GAMMA])
def test_same_seed_same_times_different_seed_different(process: Arrival) -> None:
    a = arrival_times(100, process, rng=_rng(7), rate=2.0, burstiness=0.5)
    assert a == arrival_times(100, process, rng=_rng(7), rate=2.0, burstiness=0.5)
    assert a != arrival_times(100, process, rng=_rng(8), rate=2.0, burstiness=0.5)


def test_poisson_process_is_accepted_by_name() -> None:
    assert arrival_times(5, "poisson", rng=_rng(9), rate=1.0) == poisson_arrivals(5, 1.0, _rng(9))


@pytest.mark.parametrize(
    ("n", "process", "rate", "cv", "field"),
    [
        (10, "poisson", None, 1.0, "request_rate"),
        (10, "gamma", None, 1.0, "request_rate"),
        (10, "poisson", 0.0, 1.0, "request_rate"),
        (10, "poisson", -1.0, 1.0, "request_rate"),
        (10, "poisson", math.inf, 1.0, "request_rate"),
        (10, "gamma", 1.0, 0.0, "burstiness"),
        (10, "gamma", 1.0, math.nan, "burstiness"),
        (10, "uniform", 1.0, 1.0, "arrival"),
        (-1, "poisson", 1.0, 1.0, "num_requests"),
    ],
)
def test_bad_arguments_name_the_field(
    n: int, process: str, rate: float | None, cv: float, field: str
) -> None:
    with pytest.raises(ConfigError) as info:
        arrival_times(n, process, rng=_rng(), rate=rate, burstiness=cv)
    assert info.value.field == field

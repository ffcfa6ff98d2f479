"""When requests arrive: all at once, a Poisson process, or a gamma renewal process.

Times are in seconds from the start of the run. The first request arrives at t = 0 and request
i at the sum of the first i gaps, as in vLLM's serving benchmark, which sends a request and then
sleeps for the next gap (``get_request`` in ``benchmarks/benchmark_serving.py``). So n requests
use n - 1 gaps, the run starts with work, and "all at once" is the limit of an infinite rate.

Poisson at rate r: gaps are exponential with mean 1/r (coefficient of variation 1); the vLLM
paper's serving experiments use Poisson arrivals (arXiv 2309.06180, §6.1).

Gamma with burstiness k at rate r, as vLLM's serving benchmark defines ``--burstiness`` (the
gamma shape; ``get_request`` in ``vllm/benchmarks/serve.py``): gaps ~ Gamma(shape k, scale
θ = 1/(r k)), so the mean gap is k θ = 1/r and the coefficient of variation is 1/sqrt(k).
k = 1 is the exponential (Poisson); k < 1 is burstier, k > 1 more regular.

Where vLLM differs: its first request also waits one gap, and without a ramp-up it rescales the
n gaps so that they sum to exactly n / r; here the first request arrives at t = 0 and the gaps
are the draws themselves (so "all at once" is the limit of an infinite rate).
"""

from __future__ import annotations

import enum
import math

import numpy as np
import numpy.typing as npt

from pagedkv.errors import ConfigError
from pagedkv.validation import check_choice, check_int


class Arrival(enum.Enum):
    """An arrival process."""

    ALL_AT_ONCE = "all-at-once"
    """Every request at t = 0: an offline batch (the course lesson, vLLM's throughput runs)."""
    POISSON = "poisson"
    """Exponential gaps at ``request_rate``: the vLLM paper's serving workload."""
    GAMMA = "gamma"
    """Gamma gaps at ``request_rate`` with shape ``burstiness`` (vLLM's)."""


def check_rate(field: str, value: object) -> float:
    """A finite real number > 0 (requests per second, or a gamma shape)."""
    allowed = "must be a finite number > 0"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, value, allowed)
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(field, value, allowed)
    return float(value)


def all_at_once(n: int) -> list[float]:
    """n arrival times, all 0."""
    check_int("num_requests", n, 0)
    return [0.0] * n


def gamma_arrivals(n: int, rate: float, burstiness: float, rng: np.random.Generator) -> list[float]:
    """n arrival times: 0, then cumulative sums of n - 1 Gamma(k, 1/(rate k)) gaps, k the
    burstiness."""
    check_int("num_requests", n, 0)
    rate = check_rate("request_rate", rate)
    shape = check_rate("burstiness", burstiness)
    gaps = rng.gamma(shape, 1.0 / (rate * shape), size=max(n - 1, 0))
    return _cumulative(gaps, n)


def poisson_arrivals(n: int, rate: float, rng: np.random.Generator) -> list[float]:
    """n arrival times: 0, then cumulative sums of n - 1 exponential gaps of mean 1/rate."""
    check_int("num_requests", n, 0)
    rate = check_rate("request_rate", rate)
    gaps = rng.exponential(1.0 / rate, size=max(n - 1, 0))
    return _cumulative(gaps, n)


def arrival_times(
    n: int,
    process: Arrival | str,
    *,
    rng: np.random.Generator,
    rate: float | None = None,
    burstiness: float = 1.0,
) -> list[float]:
    """n non-decreasing arrival times from ``process`` (see the module docstring).

    ``rate`` is needed by 'poisson' and 'gamma'; ``burstiness`` is used by 'gamma' only. ``rng`` is
    drawn from only by the random processes; pass a stream of its own so the lengths of a
    workload do not depend on its arrival process.
    """
    kind = check_choice("arrival", process, Arrival)
    if kind is Arrival.ALL_AT_ONCE:
        return all_at_once(n)
    if rate is None:
        raise ConfigError("request_rate", rate, f"arrival {kind.value!r} needs a request rate")
    if kind is Arrival.POISSON:
        return poisson_arrivals(n, rate, rng)
    return gamma_arrivals(n, rate, burstiness, rng)


def _cumulative(gaps: npt.NDArray[np.float64], n: int) -> list[float]:
    if n == 0:
        return []
    return [0.0, *(float(t) for t in np.cumsum(gaps))]

"""Mean and 95% confidence interval, the one statistic every reported figure carries.

Two intervals of the mean over independent seeds:

* ``bootstrap_ci`` (the summary tables and plots, via ``summarize``): the percentile bootstrap,
  the 2.5th and 97.5th percentiles of the means of ``RESAMPLES`` resamples (with replacement,
  seeded: the same values give the same interval). Every resampled mean lies between the
  sample's least and greatest value, so the interval respects a metric's physical bounds by
  construction (a share stays in [0, 1], a throughput >= 0); it is also clipped to the bounds
  given. Below ``MIN_N`` values there is no interval: two seeds cannot say how wide it is.
* ``mean_ci``: Student's t interval, ``mean +- t_{0.975, n-1} * s / sqrt(n)`` (s: the sample
  standard deviation), which the claims' paired ratios use. The t quantile comes from
  ``scipy.stats.t`` (imported when first needed, so importing this module stays light).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

CONFIDENCE = 0.95
MIN_N = 3
"""The fewest values a bootstrap interval is computed from (fewer: "n too small")."""
RESAMPLES = 4000
"""Bootstrap resamples: the percentiles' own sampling error is then well under 1% of the width."""
BOOTSTRAP_SEED = 0
"""The resampling's seed (any fixed value: the interval must not change between runs)."""
Bounds = tuple[float | None, float | None]
"""A metric's (lowest, highest) possible value, None where it has no bound
(``pagedkv.experiments.metrics.bounds``)."""
UNBOUNDED: Bounds = (None, None)


def _require_scipy() -> Any:
    try:
        from scipy import stats
    except ImportError as exc:  # pragma: no cover - depends on the environment
        from pagedkv.errors import PagedKVError

        raise PagedKVError("confidence intervals need scipy: pip install 'pagedkv[plot]'") from exc
    return stats


@dataclass(frozen=True)
class MeanCI:
    """A sample's mean and its confidence interval; ``low``/``high`` are None below two values
    (one value says nothing about spread), all three None for no value at all."""

    mean: float | None
    low: float | None
    high: float | None
    n: int

    def contains(self, x: float) -> bool:
        return self.low is not None and self.high is not None and self.low <= x <= self.high


def mean_ci(values: Iterable[float | None], confidence: float = CONFIDENCE) -> MeanCI:
    """Mean and t interval of the values that are not None."""
    xs = [float(v) for v in values if v is not None]
    n = len(xs)
    if n == 0:
        return MeanCI(None, None, None, 0)
    mean = math.fsum(xs) / n
    if n == 1:
        return MeanCI(mean, None, None, 1)
    var = math.fsum((x - mean) ** 2 for x in xs) / (n - 1)
    half = float(_require_scipy().t.ppf(0.5 + confidence / 2, n - 1)) * math.sqrt(var / n)
    # Clamp so the interval always contains the mean despite rounding in mean +- 0.
    return MeanCI(mean, min(mean, mean - half), max(mean, mean + half), n)


def bootstrap_ci(
    values: Iterable[float | None],
    bounds: Bounds = UNBOUNDED,
    *,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> MeanCI:
    """Mean and percentile-bootstrap interval of the values that are not None, inside
    ``bounds``; ``low``/``high`` None below ``MIN_N`` values."""
    xs = [float(v) for v in values if v is not None]
    n = len(xs)
    if n == 0:
        return MeanCI(None, None, None, 0)
    mean = math.fsum(xs) / n
    if n < MIN_N:
        return MeanCI(mean, None, None, n)
    sample = np.asarray(xs)
    rng = np.random.default_rng(seed)
    means = sample[rng.integers(0, n, size=(resamples, n))].mean(axis=1)
    alpha = 1.0 - confidence
    low, high = (float(q) for q in np.quantile(means, [alpha / 2, 1 - alpha / 2]))
    lowest, highest = bounds
    if lowest is not None:
        low = max(low, lowest)
    if highest is not None:
        high = min(high, highest)
    # The interval always holds the mean (a resampled mean can differ from it in the last bit).
    return MeanCI(mean, min(low, mean), max(high, mean), n)


def summarize(
    rows: Sequence[Mapping[str, Any]],
    keys: Sequence[str],
    metrics: Sequence[str],
    bounds: Mapping[str, Bounds] | None = None,
) -> list[dict[str, Any]]:
    """One row per distinct ``keys`` value (first-seen order): each metric's mean, ci_low,
    ci_high over the rows (the seeds; ``bootstrap_ci`` within the metric's ``bounds``, none
    given: unbounded), and ``n`` the number of rows."""
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in keys), []).append(row)
    out: list[dict[str, Any]] = []
    for key, members in groups.items():
        entry: dict[str, Any] = dict(zip(keys, key, strict=True))
        for m in metrics:
            limits = (bounds or {}).get(m, UNBOUNDED)
            ci = bootstrap_ci((_number(r.get(m)) for r in members), limits)
            entry[f"{m}_mean"], entry[f"{m}_ci_low"], entry[f"{m}_ci_high"] = (
                ci.mean,
                ci.low,
                ci.high,
            )
        entry["n"] = len(members)
        out.append(entry)
    return out


def summary_columns(keys: Sequence[str], metrics: Sequence[str]) -> list[str]:
    """The columns of ``summarize``'s rows, in order."""
    cols = list(keys)
    for m in metrics:
        cols += [f"{m}_mean", f"{m}_ci_low", f"{m}_ci_high"]
    return [*cols, "n"]


def _number(value: Any) -> float | None:
    if value is None:
        return None
    return float(value)  # bools count as 0/1: their mean is a share

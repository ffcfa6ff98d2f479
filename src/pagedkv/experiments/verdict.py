"""The rule that turns measured intervals into a claim's verdict (no verdict is typed by hand).

A claim states a range for a metric (``low <= metric <= high``, either end open; the bounds
belong to the range) and which way is *the claim's favour*: ``higher`` (more is better for the
claim: a speed-up, a saving), ``lower`` (less is better: a waste) or ``neither`` (a claim of
likeness, "comparable": out of the range either way is against it). One measurement, its mean
and 95% interval ``[lo, hi]`` over ``n`` seeds, gets one of five verdicts:

* **supported**: the whole interval lies inside the range;
* **exceeds**: the whole interval lies beyond the range's bound on the favourable side (only a
  range bounded on that side can be exceeded: "below 4%" cannot);
* **contradicted**: the whole interval lies beyond the other bound, against the claim;
* **inconclusive**: the interval straddles a bound. The half-width ``h`` of a t interval shrinks
  as ``1/sqrt(n)``, so it clears the bound nearest the mean, at distance ``d``, once
  ``h * sqrt(n / n') < d``: ``n' = floor(n * (h / d)**2) + 1`` seeds in all (an upper estimate:
  the t quantile shrinks too). A mean on the bound (``d`` under 1e-4 of ``h``: over 1e8 times
  the seeds) is decided by no practical number of seeds;
* **not measured**: no interval (no data, or a single seed): never a verdict about the claim.

A claim measured under several conditions (workloads, widths), each with its own range where
its source states one per condition, takes the least favourable of its measurements'
verdicts, in the order contradicted, not measured, inconclusive, supported, exceeds; the
condition text lists each measurement's own verdict.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

SUPPORTED, EXCEEDS, INCONCLUSIVE, CONTRADICTED, NOT_MEASURED = (
    "supported",
    "exceeds",
    "inconclusive",
    "contradicted",
    "not measured",
)
VERDICTS = (SUPPORTED, EXCEEDS, INCONCLUSIVE, CONTRADICTED, NOT_MEASURED)
_WORST_FIRST = (CONTRADICTED, NOT_MEASURED, INCONCLUSIVE, SUPPORTED, EXCEEDS)
Favour = Literal["higher", "lower", "neither"]
FAVOURS = ("higher", "lower", "neither")


@dataclass(frozen=True)
class Measurement:
    """One condition's measured mean and 95% interval over ``n`` seeds (None: not measured)."""

    condition: str
    mean: float | None
    ci_low: float | None
    ci_high: float | None
    n: int = 0


@dataclass(frozen=True)
class Judgement:
    """One measurement's verdict; ``seeds_to_decide`` (inconclusive only) is the estimated
    total number of seeds whose interval would clear the bound (None: no number would)."""

    verdict: str
    seeds_to_decide: int | None = None

    def describe(self, n: int) -> str:
        if self.verdict != INCONCLUSIVE:
            return self.verdict
        if self.seeds_to_decide is None:
            return "inconclusive: the mean sits on a bound, no practical number of seeds decides it"
        more = self.seeds_to_decide - n
        return f"inconclusive: ~{more} more seed{'s' if more != 1 else ''} would decide it"


def holds(m: Measurement, low: float | None, high: float | None) -> bool:
    """The whole interval lies in [low, high] (a missing interval never holds)."""
    if m.ci_low is None or m.ci_high is None:
        return False
    return (low is None or m.ci_low >= low) and (high is None or m.ci_high <= high)


def judge(m: Measurement, low: float | None, high: float | None, favour: Favour) -> Judgement:
    """The verdict of one measurement against ``[low, high]`` (see the module docstring)."""
    if favour not in FAVOURS:
        raise ValueError(f"favour must be one of {FAVOURS}, not {favour!r}")
    if low is not None and high is not None and low > high:
        raise ValueError(f"empty range [{low}, {high}]")
    if m.mean is None or m.ci_low is None or m.ci_high is None:
        return Judgement(NOT_MEASURED)
    lo, hi = m.ci_low, m.ci_high
    if holds(m, low, high):
        return Judgement(SUPPORTED)
    above = high is not None and lo > high
    below = low is not None and hi < low
    if above:
        return Judgement(EXCEEDS if favour == "higher" else CONTRADICTED)
    if below:
        return Judgement(EXCEEDS if favour == "lower" else CONTRADICTED)  # "neither": against
    return Judgement(INCONCLUSIVE, seeds_to_decide(m, low, high))


def seeds_to_decide(m: Measurement, low: float | None, high: float | None) -> int | None:
    """Seeds in all after which the interval, shrinking as 1/sqrt(n), clears the bound nearest
    the mean; None when the mean is on it (or the interval has no width or no count)."""
    if m.mean is None or m.ci_low is None or m.ci_high is None:
        return None
    half = (m.ci_high - m.ci_low) / 2
    d = min(abs(m.mean - b) for b in (low, high) if b is not None)
    if half <= 0 or m.n < 1 or d <= half * 1e-4:
        return None  # on the bound, or so near it that 1e8 x n seeds would not do
    return max(m.n + 1, math.floor(m.n * (half / d) ** 2) + 1)


@dataclass(frozen=True)
class Target:
    """One measurement and the range its source states for that condition."""

    measurement: Measurement
    low: float | None
    high: float | None


def verdict_each(targets: Sequence[Target], favour: Favour) -> tuple[str, list[Judgement]]:
    """The claim's verdict (the least favourable) and each target's judgement."""
    if not targets:
        raise ValueError("a claim needs at least one measurement")
    judged = [judge(t.measurement, t.low, t.high, favour) for t in targets]
    found = {j.verdict for j in judged}
    return next(v for v in _WORST_FIRST if v in found), judged


def verdict(
    measurements: Sequence[Measurement],
    low: float | None,
    high: float | None,
    favour: Favour,
) -> tuple[str, str]:
    """(verdict, condition) of a claim over its measurements, one range for all: the least
    favourable verdict, and each measurement's own."""
    overall, judged = verdict_each([Target(m, low, high) for m in measurements], favour)
    parts = [f"{m.condition}: {j.describe(m.n)}" for m, j in zip(measurements, judged, strict=True)]
    return overall, "; ".join(parts)


def describe_range(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"in [{low:.4g}, {high:.4g}]"
    if low is not None:
        return f">= {low:.4g}"
    if high is not None:
        return f"<= {high:.4g}"
    return "any value"

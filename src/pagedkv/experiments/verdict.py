"""The rule that turns measured intervals into a claim's verdict (no verdict is typed by hand).

A claim states a range for a metric (``low <= metric <= high``, either end open). One
measurement *holds* when its whole 95% interval lies inside the range: the data then exclude
every value the claim rules out. A claim measured under several conditions (workloads,
baselines) is ``supported`` when every measurement holds, ``not supported`` when none does,
and ``depends`` otherwise, with the condition naming where it holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SUPPORTED, NOT_SUPPORTED, DEPENDS, NEEDS_SHARING = (
    "supported",
    "not supported",
    "depends",
    "needs: sharing",
)


@dataclass(frozen=True)
class Measurement:
    """One condition's measured mean and 95% interval (None: not measurable there)."""

    condition: str
    mean: float | None
    ci_low: float | None
    ci_high: float | None


def holds(m: Measurement, low: float | None, high: float | None) -> bool:
    """The whole interval lies in [low, high] (a missing interval never holds)."""
    if m.ci_low is None or m.ci_high is None:
        return False
    return (low is None or m.ci_low >= low) and (high is None or m.ci_high <= high)


def verdict(
    measurements: Sequence[Measurement], low: float | None, high: float | None
) -> tuple[str, str]:
    """(verdict, condition) of a claim over its measurements."""
    if not measurements:
        raise ValueError("a claim needs at least one measurement")
    good = [m.condition for m in measurements if holds(m, low, high)]
    bad = [m.condition for m in measurements if not holds(m, low, high)]
    if not bad:
        return SUPPORTED, "holds for " + ", ".join(good)
    if not good:
        return NOT_SUPPORTED, "holds for none of " + ", ".join(bad)
    return DEPENDS, "holds for " + ", ".join(good) + "; not for " + ", ".join(bad)


def describe_range(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"in [{low:g}, {high:g}]"
    if low is not None:
        return f">= {low:g}"
    if high is not None:
        return f"<= {high:g}"
    return "any value"

"""Which of several configurations is best on a metric, said only as far as the intervals allow.

A finding names a winner only when the best mean's 95% interval lies clear of every other
candidate's interval (no overlap). Otherwise it says which candidates overlap the best and that
there is no winner at the number of seeds run; where a candidate has no interval (fewer than
``stats.MIN_N`` seeds), no winner can be named at all. Overlap of two 95% intervals is the
conservative test (non-overlap implies a significant difference; overlap does not prove there is
none), which is what a finding that names a winner needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pagedkv.report.stats import MIN_N, MeanCI

LISTED = 3
"""Overlapping candidates up to this many are each shown with their interval; more, the best."""


@dataclass(frozen=True)
class Candidate:
    """One configuration's name (as the finding prints it) and its mean with interval."""

    name: str
    ci: MeanCI


def overlap(a: MeanCI, b: MeanCI) -> bool:
    """Do the two intervals share a point? (Both must have one: ``ValueError`` otherwise.)"""
    if a.low is None or a.high is None or b.low is None or b.high is None:
        raise ValueError("overlap needs two intervals")
    return a.low <= b.high and b.low <= a.high


def describe(ci: MeanCI, digits: int = 3) -> str:
    """'1.23 [1.1, 1.4]', the mean alone without an interval, 'n/a' without a mean."""
    if ci.mean is None:
        return "n/a"
    if ci.low is None or ci.high is None:
        return f"{ci.mean:.{digits}g}"
    return f"{ci.mean:.{digits}g} [{ci.low:.{digits}g}, {ci.high:.{digits}g}]"


def seeds(cands: Sequence[Candidate]) -> str:
    """'n=5', or 'n=3-5' where the candidates' counts differ."""
    ns = sorted({c.ci.n for c in cands})
    return f"n={ns[0]}" if len(ns) == 1 else f"n={ns[0]}-{ns[-1]}"


def _join(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def best(candidates: Sequence[Candidate], *, higher: bool, what: str, unit: str = "") -> str:
    """One sentence on the best of ``candidates`` by ``what`` (higher or lower is better):
    the winner and its interval when it is clear of all others; else the candidates whose
    intervals overlap the best mean's, and 'no winner at n=...'."""
    measured = [c for c in candidates if c.ci.mean is not None]
    if not measured:
        return f"{what}: not measured."
    if len(measured) == 1:
        only = measured[0]
        return f"{what}: only {only.name} measured ({describe(only.ci)}{_u(unit)})."

    def key(c: Candidate) -> float:
        assert c.ci.mean is not None
        return -c.ci.mean if higher else c.ci.mean

    ranked = sorted(measured, key=key)
    top = ranked[0]
    if any(c.ci.low is None or c.ci.high is None for c in ranked):
        listed = ", ".join(f"{c.name} {describe(c.ci)}" for c in ranked)
        return (
            f"{what}: {listed}{_u(unit)}; {seeds(ranked)} too small for an interval (needs "
            f"{MIN_N}): no winner."
        )
    tied = [c for c in ranked if c is top or overlap(c.ci, top.ci)]
    if len(tied) == 1:
        word = "highest" if higher else "lowest"
        return (
            f"{what}: {word} at {top.name} ({describe(top.ci)}{_u(unit)}), its interval clear "
            f"of every other's at {seeds(ranked)}."
        )
    listed = (
        ", ".join(f"{c.name} {describe(c.ci)}" for c in tied)
        if len(tied) <= LISTED
        else f"the best mean: {top.name} {describe(top.ci)}"
    )
    return (
        f"{what}: {_join([c.name for c in tied])} overlap: no winner at {seeds(ranked)} "
        f"({listed}{_u(unit)})."
    )


def _u(unit: str) -> str:
    return f" {unit}" if unit else ""

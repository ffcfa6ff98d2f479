"""The claims' verdict rule on constructed numbers: one case per verdict at each bound."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedkv.experiments.verdict import (
    CONTRADICTED,
    EXCEEDS,
    INCONCLUSIVE,
    NOT_MEASURED,
    SUPPORTED,
    VERDICTS,
    Favour,
    Measurement,
    Target,
    holds,
    judge,
    seeds_to_decide,
    verdict,
    verdict_each,
)


def m(low: float | None, high: float | None, n: int = 5, cond: str = "w") -> Measurement:
    mean = None if low is None or high is None else (low + high) / 2
    return Measurement(cond, mean, low, high, n)


# (interval, claimed range, favour, expected verdict): each bound of each kind of range, met
# exactly, straddled and cleared on either side.
TABLE: list[tuple[tuple[float | None, float | None], float | None, float | None, Favour, str]] = [
    # two-sided, more is better ("2-4x"): the low bound
    ((2.0, 3.0), 2.0, 4.0, "higher", SUPPORTED),  # touches the bound from inside
    ((1.9, 2.5), 2.0, 4.0, "higher", INCONCLUSIVE),
    ((1.0, 2.0), 2.0, 4.0, "higher", INCONCLUSIVE),  # touches it from outside
    ((1.0, 1.9), 2.0, 4.0, "higher", CONTRADICTED),
    # ... and the high bound
    ((3.0, 4.0), 2.0, 4.0, "higher", SUPPORTED),
    ((3.5, 4.5), 2.0, 4.0, "higher", INCONCLUSIVE),
    ((4.0, 5.0), 2.0, 4.0, "higher", INCONCLUSIVE),
    ((4.1, 5.0), 2.0, 4.0, "higher", EXCEEDS),
    # wider than the whole range
    ((1.0, 5.0), 2.0, 4.0, "higher", INCONCLUSIVE),
    # two-sided, less is better: beyond the low bound is in the claim's favour
    ((0.05, 0.09), 0.1, 0.2, "lower", EXCEEDS),
    ((0.1, 0.15), 0.1, 0.2, "lower", SUPPORTED),
    ((0.09, 0.15), 0.1, 0.2, "lower", INCONCLUSIVE),
    ((0.15, 0.2), 0.1, 0.2, "lower", SUPPORTED),
    ((0.15, 0.25), 0.1, 0.2, "lower", INCONCLUSIVE),
    ((0.21, 0.25), 0.1, 0.2, "lower", CONTRADICTED),
    # one-sided, "below 4%": nothing to exceed
    ((0.0, 0.04), None, 0.04, "lower", SUPPORTED),
    ((0.03, 0.05), None, 0.04, "lower", INCONCLUSIVE),
    ((0.041, 0.05), None, 0.04, "lower", CONTRADICTED),
    ((-5.0, -4.0), None, 0.04, "lower", SUPPORTED),
    # one-sided, "at least 1"
    ((1.0, 1.5), 1.0, None, "higher", SUPPORTED),
    ((0.9, 1.1), 1.0, None, "higher", INCONCLUSIVE),
    ((0.5, 0.99), 1.0, None, "higher", CONTRADICTED),
    ((100.0, 200.0), 1.0, None, "higher", SUPPORTED),
    # a claim of likeness ("comparable"): out of the range either way is against it
    ((0.7, 0.79), 0.8, 1.25, "neither", CONTRADICTED),
    ((0.8, 1.0), 0.8, 1.25, "neither", SUPPORTED),
    ((0.75, 0.85), 0.8, 1.25, "neither", INCONCLUSIVE),
    ((1.0, 1.25), 0.8, 1.25, "neither", SUPPORTED),
    ((1.2, 1.3), 0.8, 1.25, "neither", INCONCLUSIVE),
    ((1.26, 1.3), 0.8, 1.25, "neither", CONTRADICTED),
    # nothing measured, whatever the range
    ((None, None), 2.0, 4.0, "higher", NOT_MEASURED),
    ((None, None), None, 0.04, "lower", NOT_MEASURED),
]


@pytest.mark.parametrize(("interval", "low", "high", "favour", "expected"), TABLE)
def test_verdict_table(
    interval: tuple[float | None, float | None],
    low: float | None,
    high: float | None,
    favour: Favour,
    expected: str,
) -> None:
    got = judge(m(*interval), low, high, favour)
    assert got.verdict == expected
    if expected != INCONCLUSIVE:
        assert got.seeds_to_decide is None
    assert verdict([m(*interval)], low, high, favour)[0] == expected


def test_every_verdict_has_a_case_in_the_table() -> None:
    assert {row[-1] for row in TABLE} == set(VERDICTS)


def test_a_single_seed_is_not_measured() -> None:
    assert judge(Measurement("w", 3.0, None, None, 1), 2.0, 4.0, "higher").verdict == NOT_MEASURED


def test_seeds_to_decide_follows_the_square_root_law() -> None:
    # half-width 0.5 over 5 seeds, mean 0.25 from the bound: (0.5/0.25)^2 * 5 = 20 -> 21 seeds
    x = Measurement("w", 2.25, 1.75, 2.75, 5)
    assert seeds_to_decide(x, 2.0, 4.0) == 21
    assert judge(x, 2.0, 4.0, "higher").describe(5) == (
        "inconclusive: ~16 more seeds would decide it"
    )
    on_bound = Measurement("w", 2.0, 1.5, 2.5, 5)
    assert seeds_to_decide(on_bound, 2.0, 4.0) is None
    assert "no practical number of seeds" in judge(on_bound, 2.0, 4.0, "higher").describe(5)


@given(
    st.floats(-10, 10),
    st.floats(0.01, 5),
    st.integers(2, 50),
    st.floats(-10, 10),
    st.floats(0.0, 10),
)
def test_the_estimated_seeds_clear_the_bound(
    mean: float, half: float, n: int, low: float, width: float
) -> None:
    """With the estimated count, the interval (half-width scaled by sqrt(n / n')) no longer
    straddles any bound, and one seed fewer would not have been enough for the nearest."""
    high = low + width
    x = Measurement("w", mean, mean - half, mean + half, n)
    j = judge(x, low, high, "higher")
    if j.verdict != INCONCLUSIVE or j.seeds_to_decide is None:
        return
    k = j.seeds_to_decide
    assert k > n
    shrunk = half * math.sqrt(n / k)
    d = min(abs(mean - low), abs(mean - high))
    if d - shrunk < 1e-9 * (1 + abs(mean)):
        return  # clears the bound by less than float rounding
    y = Measurement("w", mean, mean - shrunk, mean + shrunk, k)
    assert judge(y, low, high, "higher").verdict != INCONCLUSIVE
    if k > n + 1:
        wider = half * math.sqrt(n / (k - 1))
        assert wider >= d * (1 - 1e-9)


def test_combination_takes_the_least_favourable() -> None:
    ok, exceeds = m(2.5, 3.0, cond="a"), m(5.0, 6.0, cond="b")
    assert verdict([ok, exceeds], 2.0, 4.0, "higher")[0] == SUPPORTED
    assert verdict([exceeds, exceeds], 2.0, 4.0, "higher")[0] == EXCEEDS
    v, cond = verdict([ok, m(1.0, 1.5, cond="c")], 2.0, 4.0, "higher")
    assert v == CONTRADICTED
    assert cond == "a: supported; c: contradicted"
    assert verdict([ok, m(None, None)], 2.0, 4.0, "higher")[0] == NOT_MEASURED
    assert verdict([ok, m(1.9, 2.1)], 2.0, 4.0, "higher")[0] == INCONCLUSIVE


def test_each_target_is_judged_against_its_own_range() -> None:
    a, b = m(0.05, 0.07, cond="n=2"), m(0.5, 0.6, cond="n=6")
    overall, judged = verdict_each([Target(a, 0.05, 0.07), Target(b, 0.4, 0.7)], "higher")
    assert overall == SUPPORTED
    assert [j.verdict for j in judged] == [SUPPORTED, SUPPORTED]
    # against n=2's range, n=6 is far beyond it
    assert verdict_each([Target(b, 0.05, 0.07)], "higher")[0] == EXCEEDS
    assert verdict([a, b], 0.05, 0.07, "higher")[0] == SUPPORTED  # supported + exceeds


def test_bad_rule_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="favour"):
        judge(m(1.0, 2.0), 1.0, 2.0, "sideways")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty range"):
        judge(m(1.0, 2.0), 3.0, 2.0, "higher")
    with pytest.raises(ValueError, match="at least one"):
        verdict([], 1.0, 2.0, "higher")


def test_holds_is_the_supported_case() -> None:
    for interval, low, high, _, expected in TABLE:
        assert holds(m(*interval), low, high) == (expected == SUPPORTED)

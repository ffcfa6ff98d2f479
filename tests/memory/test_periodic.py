"""Periodic block-taking weights: O(1) window sums against round-by-round sums."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from pagedkv.memory.periodic import PeriodicCounts


def brute_total(counts: list[int], a: int, b: int) -> int:
    return sum(counts[i % len(counts)] for i in range(a + 1, b + 1))


@st.composite
def weights(draw: st.DrawFn) -> PeriodicCounts:
    period = draw(st.sampled_from([1, 2, 5, 16]))
    pc = PeriodicCounts(period)
    for _ in range(draw(st.integers(0, 12))):
        pc.add(draw(st.integers(0, period - 1)), draw(st.integers(1, 3)))
    return pc


@settings(max_examples=200, deadline=None)
@given(pc=weights(), a=st.integers(0, 300), length=st.integers(0, 90))
def test_window_sums_equal_round_by_round_sums(pc: PeriodicCounts, a: int, length: int) -> None:
    b = a + length
    assert pc.total(a, b) == brute_total(pc.count, a, b)
    xs = [(i - 1 - a, pc.count[i % pc.period]) for i in range(a + 1, b + 1)]
    assert pc.window(a, b) == (
        sum(w for _, w in xs),
        sum(w * x for x, w in xs),
        sum(w * x * x for x, w in xs),
    )
    assert pc.rounds(a, b) == sorted(
        i for i in range(a + 1, b + 1) for _ in range(pc.count[i % pc.period])
    )


@settings(max_examples=200, deadline=None)
@given(pc=weights(), a=st.integers(0, 300), limit=st.integers(0, 60))
def test_first_over_is_the_first_round_past_the_limit(
    pc: PeriodicCounts, a: int, limit: int
) -> None:
    if sum(pc.count) == 0:
        with pytest.raises(ValueError, match="no weight"):
            pc.first_over(a, limit)
        return
    i = pc.first_over(a, limit)
    assert pc.total(a, i) > limit >= pc.total(a, i - 1)


def test_counts_follow_adds_and_removes() -> None:
    pc = PeriodicCounts(4)
    pc.add(1, 2)
    assert pc.total(0, 8) == 4  # rounds 1 and 5, twice each
    pc.add(1, -1)
    assert pc.total(0, 8) == 2  # the prefix sums were rebuilt
    with pytest.raises(ValueError, match="below zero"):
        pc.add(2, -1)
    with pytest.raises(ValueError, match="period"):
        PeriodicCounts(0)

"""The rate bisection against synthetic monotone SLO checks with a known threshold."""

from __future__ import annotations

import math
import sys

from hypothesis import given
from hypothesis import strategies as st

from pagedkv.sweep.bisect import MIN_TOLERANCE, bisect_rate
from pagedkv.workloads.config import MAX_RATE, MIN_RATE


@given(
    threshold=st.floats(min_value=0.26, max_value=63.0),
    tolerance=st.sampled_from([0.01, 0.05, 0.2]),
)
def test_finds_the_threshold_to_the_tolerance(threshold: float, tolerance: float) -> None:
    search = bisect_rate(lambda rate: rate <= threshold, 0.25, 64.0, tolerance)
    assert search.passed is not None
    assert search.failed is not None
    # the answer passes, and the next rate it rules out fails, within the tolerance
    assert search.passed <= threshold < search.failed
    assert search.failed / search.passed <= 1 + tolerance
    assert threshold / search.passed <= 1 + tolerance
    assert not search.capped
    # geometric bisection: about log2(log(high / low) / log(1 + tolerance)) midpoints
    bound = math.ceil(math.log2(math.log(64 / 0.25) / math.log(1 + tolerance))) + 2
    assert len(search.probes) <= bound


def test_probes_are_monotone_consistent() -> None:
    search = bisect_rate(lambda rate: rate <= 10.0, 0.25, 64.0, 0.05)
    for rate, ok in search.probes:
        assert ok == (rate <= 10.0)


def test_infeasible_stops_after_the_low_rate() -> None:
    search = bisect_rate(lambda rate: False, 0.25, 64.0, 0.05)
    assert search.passed is None
    assert search.probes == [(0.25, False)]


def test_passing_everywhere_is_capped_at_high() -> None:
    search = bisect_rate(lambda rate: True, 0.25, 64.0, 0.05)
    assert search.passed == 64.0
    assert search.capped
    assert search.probes == [(0.25, True), (64.0, True)]


@given(
    tolerance=st.floats(min_value=MIN_TOLERANCE, max_value=10.0),
    low=st.floats(min_value=MIN_RATE, max_value=MAX_RATE / 2),
    span=st.floats(min_value=1.0 + 1e-12, max_value=1e18),
    where=st.floats(min_value=0.0, max_value=1.0),
)
def test_the_search_ends_for_every_tolerance_a_plan_allows(
    tolerance: float, low: float, span: float, where: float
) -> None:
    high = min(low * span, MAX_RATE)
    if not high > low:
        high = MAX_RATE
    threshold = low * (high / low) ** where
    search = bisect_rate(lambda rate: rate <= threshold, low, high, tolerance)
    # at most the probes of bisecting log(high / low) down to log(1 + tolerance), plus the
    # two ends and the last rounding step
    bound = math.ceil(math.log2(max(math.log(high / low) / math.log1p(tolerance), 1))) + 3
    assert len(search.probes) <= bound
    rates = [r for r, _ in search.probes]
    assert len(set(rates)) == len(rates)  # never the same rate twice


@given(tolerance=st.floats(min_value=0.0, max_value=1e-12), threshold=st.floats(1.0, 2.0))
def test_a_search_stops_where_the_midpoint_no_longer_moves(
    tolerance: float, threshold: float
) -> None:
    search = bisect_rate(lambda rate: rate <= threshold, 1.0, 4.0, tolerance)
    rates = [r for r, _ in search.probes]
    assert len(set(rates)) == len(rates) <= 70  # float64 has about 2^52 rates in [1, 4]
    assert search.passed is not None
    assert search.failed is not None
    # ended where no float lies between (a rounded midpoint can leave a few ulps)
    ratio = search.failed / search.passed
    assert ratio <= 1 + max(tolerance, 8 * sys.float_info.epsilon)

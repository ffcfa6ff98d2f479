"""The rate bisection against synthetic monotone SLO checks with a known threshold."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from pagedkv.sweep.bisect import bisect_rate


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

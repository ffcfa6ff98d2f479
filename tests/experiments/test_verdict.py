"""The claims' verdict rule on constructed numbers."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pagedkv.experiments.verdict import (
    DEPENDS,
    NOT_SUPPORTED,
    SUPPORTED,
    Measurement,
    holds,
    verdict,
)


def m(low: float | None, high: float | None, cond: str = "w") -> Measurement:
    mean = None if low is None or high is None else (low + high) / 2
    return Measurement(cond, mean, low, high)


def test_inside_the_range_holds() -> None:
    assert holds(m(2.1, 3.9), 2.0, 4.0)
    assert holds(m(2.0, 4.0), 2.0, 4.0)  # the bounds belong to the range


def test_straddling_or_outside_does_not_hold() -> None:
    assert not holds(m(1.9, 3.0), 2.0, 4.0)  # the data allow a value below the claim
    assert not holds(m(4.5, 6.0), 2.0, 4.0)  # better than claimed is still not the claim
    assert not holds(m(None, None), 2.0, 4.0)  # nothing measured


def test_open_ends() -> None:
    assert holds(m(0.001, 0.03), None, 0.04)
    assert not holds(m(0.03, 0.05), None, 0.04)
    assert holds(m(1.2, 9.0), 1.0, None)


def test_combination_over_conditions() -> None:
    assert verdict([m(2.5, 3.0, "a"), m(2.2, 3.9, "b")], 2.0, 4.0)[0] == SUPPORTED
    assert verdict([m(0.5, 1.0, "a"), m(5.0, 6.0, "b")], 2.0, 4.0)[0] == NOT_SUPPORTED
    v, cond = verdict([m(2.5, 3.0, "sharegpt"), m(5.0, 6.0, "alpaca")], 2.0, 4.0)
    assert v == DEPENDS
    assert cond == "holds for sharegpt; not for alpaca"


@given(
    st.lists(
        st.tuples(st.floats(-10, 10), st.floats(0, 5)).map(lambda t: m(t[0], t[0] + t[1])),
        min_size=1,
        max_size=4,
    ),
    st.floats(-10, 10),
    st.floats(0, 10),
)
def test_verdict_is_the_count_of_holding_measurements(
    ms: list[Measurement], low: float, width: float
) -> None:
    high = low + width
    n = sum(holds(x, low, high) for x in ms)
    expected = SUPPORTED if n == len(ms) else NOT_SUPPORTED if n == 0 else DEPENDS
    assert verdict(ms, low, high)[0] == expected

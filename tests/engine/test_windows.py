"""Window math on integer lines: every closed form is exactly the steps summed one by one."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given

from pagedkv.engine.windows import WindowCurve, linear_window
from pagedkv.errors import ConfigError

# Lines in ticks: a step of up to 10 s (10^19 ticks), growing or shrinking by up to 1 ms a step.
starts = st.integers(0, 10**19)
slopes = st.integers(-(10**15), 10**15)
lines = st.tuples(starts, slopes)


def step(f: tuple[int, int], g: tuple[int, int], e: tuple[int, int], j: int) -> int:
    return max(f[0] + f[1] * j, g[0] + g[1] * j) + e[0] + e[1] * j


@given(starts, slopes, st.integers(0, 400), st.integers(0, 400))
def test_linear_window_is_the_series(a: int, b: int, lo: int, n: int) -> None:
    hi = lo + n
    d = [a + b * i for i in range(lo, hi)]
    assert linear_window(a, b, lo, hi) == (
        sum(d),
        sum(i * x for i, x in zip(range(lo, hi), d, strict=True)),
    )


@given(lines, lines, st.tuples(starts, st.integers(0, 10**15)), st.integers(0, 400))
def test_window_curve_sums_are_the_loop(
    f: tuple[int, int], g: tuple[int, int], e: tuple[int, int], k: int
) -> None:
    curve = WindowCurve(*f, *g, *e)
    d = [step(f, g, e, j) for j in range(k)]
    assert curve.sums(k) == (sum(d), sum(j * x for j, x in enumerate(d)))
    assert curve.totals(list(range(k + 1))) == [sum(d[:i]) for i in range(k + 1)]


@given(
    st.tuples(st.integers(1, 10**18), st.integers(0, 10**15)),
    st.tuples(st.integers(0, 10**18), st.integers(0, 10**15)),
    st.integers(0, 10**21),
)
def test_reach_is_the_first_step_count_that_covers_a_duration(
    f: tuple[int, int], g: tuple[int, int], duration: int
) -> None:
    """Ties included: a duration that a prefix sum equals exactly is reached at that prefix."""
    curve = WindowCurve(*f, *g, 0, 0)
    k, sums = curve.reach(duration)
    assert sums == curve.sums(k)
    assert sums[0] >= duration  # the totals never decrease: the first k past the duration
    assert k == 0 or curve.sums(k - 1)[0] < duration
    exact = curve.sums(k)[0]
    assert curve.reach(exact)[0] == k  # a tie with a step's end: that step


def test_steps_that_cost_nothing_never_reach_a_duration() -> None:
    assert WindowCurve(0, 0, 0, 0, 0, 0).reach(0) == (0, (0, 0))
    with pytest.raises(ConfigError, match="never reached"):
        WindowCurve(0, 0, 0, 0, 0, 0).reach(1)

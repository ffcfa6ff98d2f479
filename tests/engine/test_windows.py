"""Window math on integer lines: every closed form is exactly the steps summed one by one."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given

from pagedkv.engine.windows import WindowCurve, linear_window, max_linear_window, search_steps

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


@given(lines, lines, st.integers(0, 400))
def test_max_linear_window_is_the_loop(f: tuple[int, int], g: tuple[int, int], k: int) -> None:
    d = [max(f[0] + f[1] * i, g[0] + g[1] * i) for i in range(k)]
    assert max_linear_window(f, g, k) == (sum(d), sum(i * x for i, x in enumerate(d)))


@given(lines, lines, st.tuples(starts, st.integers(0, 10**15)), st.integers(0, 400))
def test_window_curve_sums_are_the_loop(
    f: tuple[int, int], g: tuple[int, int], e: tuple[int, int], k: int
) -> None:
    curve = WindowCurve(f, g, e)
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
    curve = WindowCurve(f, g, (0, 0))
    k, sums = curve.reach(duration)
    assert k == search_steps(lambda n: curve.sums(n)[0], duration)
    assert sums == curve.sums(k)
    exact = curve.sums(k)[0]
    assert curve.reach(exact)[0] == k  # a tie with a step's end: that step

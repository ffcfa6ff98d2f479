"""Fitting measured times: curves come out valid for the cost model, coefficients >= 0."""

from __future__ import annotations

import itertools

import hypothesis.strategies as st
import numpy as np
from hypothesis import example, given, settings

from pagedkv.engine.profile import Curve, read_residual
from pagedkv.tensors.profile_fit import (
    curve,
    isotonic,
    line_curve,
    nonnegative_lstsq,
    residual_curve,
)


@settings(max_examples=100, deadline=None)
@given(
    points=st.lists(
        st.tuples(st.integers(0, 10**5), st.floats(-1e-3, 1.0, allow_nan=False)),
        min_size=1,
        max_size=12,
    )
)
def test_a_fitted_curve_is_valid_and_the_isotonic_fit_of_the_means(
    points: list[tuple[int, float]],
) -> None:
    """Valid for the cost model (from 0, increasing x, nondecreasing y >= 0); at the measured
    x the isotonic fit of the mean measured at each (exactly the means where they are in
    order)."""
    xs, ys = zip(*points, strict=True)
    fitted = curve(list(xs), list(ys))
    c = Curve(tuple(fitted["x"]), tuple(fitted["y"])).check("c")  # raises if invalid
    means = {x: float(np.mean([max(y, 0.0) for x2, y in points if x2 == x])) for x in xs}
    order = sorted(means)
    expected = isotonic([means[x] for x in order])
    assert np.allclose([c.at(x) for x in order], expected, rtol=1e-9, atol=1e-15)
    if all(means[a] <= means[b] for a, b in itertools.pairwise(order)):
        assert np.allclose([c.at(x) for x in order], [means[x] for x in order], atol=1e-15)


@settings(max_examples=200, deadline=None)
@given(ys=st.lists(st.floats(0, 1.0), min_size=1, max_size=15))
def test_isotonic_is_the_nearest_nondecreasing_sequence(ys: list[float]) -> None:
    """Nondecreasing, the same total, and no farther (least squares) from ys than other
    nondecreasing sequences: the running maximum, the sorted values, the constant mean, and
    ys with one order-breaking pair pooled."""
    z = isotonic(ys)
    assert len(z) == len(ys)
    assert all(a <= b for a, b in itertools.pairwise(z))
    assert np.isclose(sum(z), sum(ys), rtol=1e-9, atol=1e-12)

    def cost(v: list[float]) -> float:
        return float(sum((a - b) ** 2 for a, b in zip(v, ys, strict=True)))

    others = [
        list(np.maximum.accumulate(ys)),
        sorted(ys),
        [float(np.mean(ys))] * len(ys),
    ]
    for v in others:
        assert cost(z) <= cost(v) + 1e-12
    if ys == sorted(ys):
        assert z == ys


@settings(max_examples=100, deadline=None)
@given(
    coef=st.lists(st.floats(0, 10), min_size=1, max_size=4),
    rows=st.integers(6, 30),
    seed=st.integers(0, 1000),
)
def test_nonnegative_lstsq_recovers_nonnegative_coefficients(
    coef: list[float], rows: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.1, 1.0, (rows, len(coef)))
    y = a @ np.array(coef)
    got = nonnegative_lstsq(a.tolist(), y.tolist())
    assert all(c >= 0 for c in got)
    assert np.allclose(a @ np.array(got), y, atol=1e-6 * (1 + np.abs(y).max()))


def test_nonnegative_lstsq_drops_a_negative_coefficient() -> None:
    a = [[1.0, float(x)] for x in range(10)]
    y = [5.0 - 0.1 * x for x in range(10)]  # the best slope is negative
    intercept, slope = nonnegative_lstsq(a, y)
    assert slope == 0.0
    assert intercept > 0


@settings(max_examples=100, deadline=None)
@given(
    a=st.floats(0, 1e-2),
    b=st.floats(0, 1e-4),
    xs=st.lists(st.integers(1, 4096), min_size=2, max_size=12, unique=True),
)
def test_a_line_curve_is_valid_and_recovers_a_line(a: float, b: float, xs: list[int]) -> None:
    """Exact points of a + b x (a, b >= 0) come back as that line, a valid curve."""
    fitted = line_curve(xs, [a + b * x for x in xs])
    c = Curve(tuple(fitted["x"]), tuple(fitted["y"])).check("c")
    for x in [0, *xs, 2 * max(xs)]:
        assert np.isclose(c.at(x), a + b * x, rtol=1e-6, atol=1e-12)


@settings(max_examples=100, deadline=None)
@given(
    points=st.lists(st.tuples(st.integers(0, 10**4), st.floats(0, 1.0)), min_size=1, max_size=12)
)
def test_a_line_curve_of_noisy_points_is_valid(points: list[tuple[int, float]]) -> None:
    xs, ys = zip(*points, strict=True)
    fitted = line_curve(list(xs), list(ys))
    Curve(tuple(fitted["x"]), tuple(fitted["y"])).check("c")  # raises if invalid


@settings(max_examples=100, deadline=None)
@given(
    points=st.lists(
        st.tuples(st.integers(0, 10**5), st.floats(-1e-3, 1.0, allow_nan=False)),
        min_size=1,
        max_size=12,
    )
)
@example(points=[(99604, 6e-06), (99605, 1.0)])  # a steep last segment far out
def test_a_curve_that_may_fall_keeps_the_means(points: list[tuple[int, float]]) -> None:
    """``monotone=False``: valid for ``Curve(monotone=False)``, the mean measured at each x
    kept, but the last raised to its predecessor's if below it."""
    xs, ys = zip(*points, strict=True)
    fitted = curve(list(xs), list(ys), monotone=False)
    c = Curve(tuple(fitted["x"]), tuple(fitted["y"]), monotone=False).check("c")
    means = {x: float(np.mean([max(y, 0.0) for x2, y in points if x2 == x])) for x in xs}
    order = sorted(means)

    def tol(x: int) -> float:
        # ``at`` evaluates a segment's line a + b x (the form the closed-form sums use): at a
        # knot far out, a and b x cancel, so the knot holds to 1e-9 of the terms, not the value.
        a, b = c.line(c.segment(x))
        return 1e-12 + 1e-9 * (abs(a) + abs(b * x))

    for x in order[:-1]:
        assert abs(c.at(x) - means[x]) <= tol(x)
    last = [means[x] for x in order[-2:]]
    assert abs(c.at(order[-1]) - max(last)) <= tol(order[-1])


@settings(max_examples=150, deadline=None)
@given(
    linear_points=st.lists(
        st.tuples(st.integers(1, 4096), st.floats(0.0, 1e-2)), min_size=1, max_size=10
    ),
    measured=st.lists(
        st.tuples(st.integers(1, 4096), st.floats(-2e-2, 2e-2)), min_size=1, max_size=10
    ),
)
def test_a_residual_curve_is_valid_and_the_measured_means_where_they_may_be(
    linear_points: list[tuple[int, float]], measured: list[tuple[int, float]]
) -> None:
    """Valid beside the linear curve (the profile's check: linear + residual >= 0 everywhere,
    its last line not falling); at each measured x the mean measured there, unless that would
    take a layer below 0 s (then -linear) or it is the last point (raised to the one before)."""
    xs, ys = zip(*linear_points, strict=True)
    linear_dict = curve(list(xs), list(ys), monotone=False)
    linear = Curve(tuple(linear_dict["x"]), tuple(linear_dict["y"]), monotone=False)
    mx, my = zip(*measured, strict=True)
    fitted = residual_curve(list(mx), list(my), linear_dict)
    residual = read_residual(linear, fitted)  # raises if invalid
    means = {x: float(np.mean([y for x2, y in measured if x2 == x])) for x in mx}
    for x, mean in means.items():
        if x in fitted["x"][:-1]:
            assert np.isclose(residual.at(x), max(mean, -linear.at(x)), rtol=1e-9, atol=1e-15)

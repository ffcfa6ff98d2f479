"""Fitting measured operator times into what ``ProfiledCost`` reads (numpy, no torch).

* ``curve``: measured (x, seconds) points -> a ``Curve`` dict: sorted, made nondecreasing (the
  fast-forward's sums rely on step times that never shrink as counts grow) by isotonic
  regression (``isotonic``: the nondecreasing sequence nearest the measured one, a run of
  points that break the order replaced by its mean; a GEMM over 3 rows can take longer than
  over 4, and a running maximum would charge 4..8 rows what 3 cost), with a point at x = 0
  extrapolated from the first two (clamped to [0, first]).
  ``monotone=False`` (the token and row curves, ``Curve.monotone``) keeps the measured means,
  only the last point raised to its predecessor if below it.
* ``isotonic``: pool adjacent violators (least squares under y nondecreasing).
* ``line_curve``: measured points -> the ``Curve`` dict of one nonnegative least-squares line
  a + b x (a term known to be linear, measured as the difference of two noisy timings);
* ``residual_curve``: the signed ``layer_residual`` from (tokens, seconds) points: their means,
  read at every point of the linear curve (interpolated; flat before the first and after the
  last), each raised to at least -linear there (so a layer never costs less than 0);
* ``nonnegative_lstsq``: least squares with every coefficient >= 0 (drop the most negative one
  and refit until none is left; a handful of features, so this simple active set is enough).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pagedkv.engine.profile import Curve


def curve(xs: Sequence[int], ys: Sequence[float], monotone: bool = True) -> dict[str, list[Any]]:
    pts = sorted(zip((int(x) for x in xs), (float(max(y, 0.0)) for y in ys), strict=True))
    sums: dict[int, list[float]] = {}
    for x, y in pts:  # repeated x: their mean
        sums.setdefault(x, []).append(y)
    x_out = sorted(sums)
    y_out = [float(np.mean(sums[x])) for x in x_out]
    if monotone:
        y_out = isotonic(y_out)
    elif len(y_out) >= 2 and y_out[-1] < y_out[-2]:  # the last line, extended, must not fall
        y_out[-1] = y_out[-2]
    if x_out[0] != 0:
        if len(x_out) >= 2:
            slope = (y_out[1] - y_out[0]) / (x_out[1] - x_out[0])
            y0 = min(max(y_out[0] - slope * x_out[0], 0.0), y_out[0])
        else:
            y0 = y_out[0]
        x_out, y_out = [0, *x_out], [y0, *y_out]
    if len(x_out) == 1:
        x_out, y_out = [0, 1], [y_out[0], y_out[0]]
    return {"x": x_out, "y": [float(y) for y in y_out]}


def isotonic(ys: Sequence[float]) -> list[float]:
    """The nondecreasing z minimising sum (z_i - y_i)^2: adjacent blocks that break the order
    merged into their mean until none does."""
    blocks: list[list[float]] = []  # [mean, count]
    for y in ys:
        blocks.append([float(y), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, n2 = blocks.pop()
            m1, n1 = blocks[-1]
            blocks[-1] = [(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2]
    out: list[float] = []
    for mean, count in blocks:
        out += [mean] * int(count)
    # a mean may round below its predecessor's last value by an ulp: keep the order exact
    return [float(v) for v in np.maximum.accumulate(np.array(out))] if out else []


def line_curve(xs: Sequence[int], ys: Sequence[float]) -> dict[str, list[Any]]:
    top = max(max(int(x) for x in xs), 1)
    a, b = nonnegative_lstsq([[1.0, float(x)] for x in xs], ys)
    return {"x": [0, top], "y": [a, a + b * top]}


def residual_curve(
    xs: Sequence[int], ys: Sequence[float], linear: dict[str, list[Any]]
) -> dict[str, list[Any]]:
    sums: dict[int, list[float]] = {}
    for x, y in zip(xs, ys, strict=True):
        sums.setdefault(int(x), []).append(float(y))
    px = sorted(sums)
    py = [float(np.mean(sums[x])) for x in px]
    line = Curve(tuple(linear["x"]), tuple(float(y) for y in linear["y"]), monotone=False)
    knots = sorted({*line.x, *px})
    values = np.interp(knots, px, py)  # flat outside the measured points
    floor = np.array([-line.at(x) for x in knots])  # the linear curve's last line goes on
    out = [float(v) for v in np.maximum(values, floor)]
    if len(knots) == 1:
        knots, out = [0, 1], [out[0], out[0]]
    out[-1] = max(out[-1], out[-2])  # its last line, extended, must not fall
    return {"x": knots, "y": out}


def nonnegative_lstsq(features: Sequence[Sequence[float]], target: Sequence[float]) -> list[float]:
    """Coefficients c >= 0 minimising |A c - y| (A: one row of features per measurement)."""
    a = np.asarray(features, dtype=float)
    y = np.asarray(target, dtype=float)
    active = list(range(a.shape[1]))
    coef = np.zeros(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active], y, rcond=None)
        if (sol >= 0).all():
            coef[:] = 0.0
            coef[active] = sol
            break
        del active[int(np.argmin(sol))]
    return [float(c) for c in coef]

"""Window math: closed-form sums of step times that grow linearly over a window of steps.

A decode-only batch grows by one token per sequence each step, so each roofline term is linear
in the step index j; the step time is the max of two such lines plus a third. ``WindowCurve``
keeps one window's lines so that the fast-forward's many prefix sums (``sums``, ``totals``) and
the step where a duration is used up (``reach``) cost a few integer operations each. Pure
arithmetic, kept apart from the cost models (``cost_model.py``) that build the lines.

Step times are integer ticks (``clock.py``) and every line has integer coefficients, so every
sum here is an exact integer series: the same integers as adding the steps one by one.
"""

from __future__ import annotations

import math
from typing import Protocol

from pagedkv.errors import ConfigError


class StepCurve(Protocol):
    """What the fast-forward reads of a window's step times d_j (``WindowCurve``, or the
    profiled model's ``SegmentCurve``): ``head`` is the line d_j = head[0] + head[1] j that
    holds for j < ``split`` (None: for every j)."""

    head: tuple[int, int]
    split: int | None

    def sums(self, k: int) -> tuple[int, int]: ...
    def totals(self, ks: list[int]) -> list[int]: ...
    def steps_to_reach(self, duration: int) -> int: ...
    def reach(self, duration: int) -> tuple[int, tuple[int, int]]: ...


def check_duration(duration: int) -> int:
    """``duration`` (ticks); ConfigError unless it is an integer."""
    if type(duration) is int:  # the usual case, at once
        return duration
    raise ConfigError("duration", duration, "must be an integer number of ticks")


def linear_window(a: int, b: int, lo: int, hi: int) -> tuple[int, int]:
    """(sum of a + b*i, sum of i * (a + b*i)) over i in [lo, hi), exactly."""
    s1 = (hi * (hi - 1) - lo * (lo - 1)) // 2
    s2 = ((hi - 1) * hi * (2 * hi - 1) - (lo - 1) * lo * (2 * lo - 1)) // 6
    return (hi - lo) * a + b * s1, a * s1 + b * s2


class WindowCurve:
    """Step times d_j = max(f0 + f1*j, g0 + g1*j) + e0 + e1*j of one window (j = 0, 1, ...),
    with the lines worked out once so that many prefix sums cost a few integer operations each.

    The two lines of the max cross at most once: up to ``split`` the first winner plus e is one
    line ``head``, from ``split`` on the other plus e is ``tail``.
    """

    __slots__ = ("head", "split", "tail")
    head: tuple[int, int]
    tail: tuple[int, int]
    split: int | None

    def __init__(self, f0: int, f1: int, g0: int, g1: int, e0: int, e1: int) -> None:
        d0, d1 = f0 - g0, f1 - g1
        first = d0 >= 0  # f wins at j = 0 (ties go to f)
        split: int | None = None  # the first j where the other line wins; None: never
        if d1 != 0 and (d1 < 0) == first:  # the gap closes: one switch, at the root
            # f wins at j iff d0 + d1 j >= 0: estimate the switch, then settle the rounding.
            root = -d0 / d1
            s = max(math.floor(root) + 1 if first else math.ceil(root), 1)
            while s > 1 and (d0 + d1 * (s - 1) >= 0) != first:
                s -= 1
            while (d0 + d1 * s >= 0) == first:
                s += 1
            split = s
        if first:
            self.head, self.tail = (f0 + e0, f1 + e1), (g0 + e0, g1 + e1)
        else:
            self.head, self.tail = (g0 + e0, g1 + e1), (f0 + e0, f1 + e1)
        self.split = split

    def sums(self, k: int) -> tuple[int, int]:
        """(sum of d_j, sum of j * d_j) over j in [0, k)."""
        if k <= 0:
            return 0, 0
        split = self.split
        if split is None or k <= split:  # linear_window(a, b, 0, k), inlined: the hot case
            a, b = self.head
            s1 = k * (k - 1) // 2
            s2 = (k - 1) * k * (2 * k - 1) // 6
            return k * a + b * s1, a * s1 + b * s2
        head = linear_window(self.head[0], self.head[1], 0, split)
        tail = linear_window(self.tail[0], self.tail[1], split, k)
        return head[0] + tail[0], head[1] + tail[1]

    def totals(self, ks: list[int]) -> list[int]:
        """sum_{j<k} d_j for each k of ``ks``: ``sums(k)[0]`` (the same integers), without a
        call per k (the fast-forward asks for one per block-allocation round of a window)."""
        a, b = self.head
        split = self.split
        out = []
        for k in ks:
            if k <= 0:
                out.append(0)
            elif split is None or k <= split:
                out.append(k * a + b * (k * (k - 1) // 2))
            else:
                out.append(self.sums(k)[0])
        return out

    def steps_to_reach(self, duration: int) -> int:
        """Smallest k >= 0 with sum_{j<k} d_j >= duration."""
        return self.reach(duration)[0]

    def reach(self, duration: int) -> tuple[int, tuple[int, int]]:
        """``steps_to_reach(duration)`` and its ``sums`` (the fast-forward needs both).

        The sum is a quadratic in k on each of the (at most two) pieces: solve it, then settle
        the rounding with exact sums, so the answer is the smallest k, as a search would give.
        """
        if type(duration) is not int:
            check_duration(duration)
        if duration <= 0:
            return 0, (0, 0)
        a, b = self.head
        k = _solve(a, b, duration)
        split = self.split
        if split is None:  # one line (the usual window): settle with its totals, inlined
            while k > 0 and (k - 1) * a + b * ((k - 1) * (k - 2) // 2) >= duration:
                k -= 1
            s1 = k * (k - 1) // 2
            while k * a + b * s1 < duration:
                k += 1
                s1 = k * (k - 1) // 2
            return k, (k * a + b * s1, a * s1 + b * ((k - 1) * k * (2 * k - 1) // 6))
        if k > split:  # past the switch: continue on the tail line
            done = self.sums(split)[0]
            a2, b2 = self.tail
            k = split + _solve(a2 + b2 * split, b2, duration - done)
        sums = self.sums
        while k > 0 and sums(k - 1)[0] >= duration:
            k -= 1
        got = sums(k)
        while got[0] < duration:
            k += 1
            got = sums(k)
        return k, got


def _solve(a: int, b: int, duration: int) -> int:
    """An estimate of the smallest k with sum_{j<k} (a + b j) = a k + b k (k-1) / 2 >= duration
    for a step time a > 0 growing by b >= 0 a step; the caller settles it with exact sums.

    The root of b/2 k^2 + p k - duration (p = a - b/2), written 2 duration / (p + sqrt(...))
    so that nothing cancels when b is tiny (b = 0 gives duration / a). Floating point: only
    an estimate."""
    if duration <= 0:
        return 0
    fa, fb, fd = float(a), float(b), float(duration)  # (float arithmetic on big ints is slow)
    p = fa - fb / 2
    denom = p + math.sqrt(max(p * p + 2 * fb * fd, 0.0))
    if denom <= 0:
        raise ConfigError("duration", duration, "is never reached: the steps cost nothing")
    return max(1, math.ceil(2 * fd / denom))

"""SegmentCurve: step times that are piecewise linear in the step index, summed in closed form.

A profiled cost is a sum of piecewise-linear functions of the batch's counts. Over a window of
decode rounds every count grows linearly in the round j, so each function stays on one line
until its argument crosses a measured point: the step time is ``a_s + b_s j`` on segment s,
``j`` in ``[start_s, start_{s+1})``. The sums over j < k are one arithmetic series per segment;
the prefix sums at the segment starts are kept, so ``sums`` costs one bisection and one series.

It answers what the fast-forward asks of ``WindowCurve`` (``head``, ``split``, ``sums``,
``totals``, ``reach``, ``steps_to_reach``): ``head`` is the first segment's line and ``split`` the
start of the second (None: one line), so callers that sum the head line alone up to ``split``
stay exact. Lines have integer coefficients (ticks, ``clock.py``): every sum is exact.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable

from pagedkv.engine.windows import _solve, check_duration, linear_window
from pagedkv.errors import ConfigError


class SegmentCurve:
    """d_j = a_s + b_s j on segment s (j >= 0); segments start at 0 and increase.

    Most windows end before their first breakpoint, so a curve may be built from its head line
    and ``split`` alone, with ``rest`` giving every segment (starts, lines) when a sum first
    reaches past ``split``.
    """

    __slots__ = ("_rest", "head", "lines", "moments_at", "split", "starts", "totals_at")
    head: tuple[int, int]
    split: int | None

    def __init__(
        self,
        head: tuple[int, int],
        split: int | None,
        rest: Callable[[], tuple[list[int], list[tuple[int, int]]]] | None = None,
    ) -> None:
        if split is not None and (split < 1 or rest is None):
            raise ConfigError("split", split, "must be >= 1, with the rest of the segments")
        self.head, self.split, self._rest = head, split, rest
        self.starts: list[int] = []  # filled by ``_segments``, when first needed

    @classmethod
    def of(cls, starts: list[int], lines: list[tuple[int, int]]) -> SegmentCurve:
        """From every segment at once."""
        if not starts or starts[0] != 0 or len(starts) != len(lines):
            raise ConfigError("starts", starts, "must start at 0, one line per segment")
        if len(starts) == 1:
            return cls(lines[0], None)
        return cls(lines[0], starts[1], lambda: (starts, lines))

    def _segments(self) -> None:
        """Build the prefix sums at every segment's start (once, when first needed)."""
        if self.starts or self._rest is None:
            return
        starts, lines = self._rest()
        if starts[0] != 0 or len(starts) != len(lines) or lines[0] != self.head:
            raise ConfigError("starts", starts, "must start at 0 on the head line")
        totals, moments = [0], [0]  # sums of d_j and of j d_j for j < starts[s]
        for s in range(1, len(starts)):
            if starts[s] <= starts[s - 1]:
                raise ConfigError("starts", starts, "must increase")
            a, b = lines[s - 1]
            t, m = linear_window(a, b, starts[s - 1], starts[s])
            totals.append(totals[-1] + t)
            moments.append(moments[-1] + m)
        self.starts, self.lines, self.totals_at, self.moments_at = starts, lines, totals, moments

    def sums(self, k: int) -> tuple[int, int]:
        """(sum of d_j, sum of j * d_j) over j in [0, k)."""
        if k <= 0:
            return 0, 0
        split = self.split
        if split is None or k <= split:
            a, b = self.head
            s1 = k * (k - 1) // 2
            s2 = (k - 1) * k * (2 * k - 1) // 6
            return k * a + b * s1, a * s1 + b * s2
        self._segments()
        s = bisect_left(self.starts, k) - 1  # the segment of j = k - 1
        a, b = self.lines[s]
        t, m = linear_window(a, b, self.starts[s], k)
        return self.totals_at[s] + t, self.moments_at[s] + m

    def total(self, k: int) -> int:
        """sum of d_j over j in [0, k): the prefix sum at its segment's start plus one series."""
        if k <= 0:
            return 0
        split = self.split
        if split is None or k <= split:
            a, b = self.head
            return k * a + b * (k * (k - 1) // 2)
        self._segments()
        s = bisect_left(self.starts, k) - 1
        a, b = self.lines[s]
        return self.totals_at[s] + linear_window(a, b, self.starts[s], k)[0]

    def totals(self, ks: list[int]) -> list[int]:
        """``total(k)`` for each k of ``ks`` (the same integers; the cohort asks for one per
        block-allocation round of a window that crosses a breakpoint)."""
        split = self.split
        a, b = self.head
        if split is None:
            return [k * a + b * (k * (k - 1) // 2) if k > 0 else 0 for k in ks]
        self._segments()
        starts, lines, before = self.starts, self.lines, self.totals_at
        out = []
        for k in ks:
            if k <= 0:
                out.append(0)
            elif k <= split:
                out.append(k * a + b * (k * (k - 1) // 2))
            else:
                i = bisect_left(starts, k) - 1
                lo = starts[i]
                a2, b2 = lines[i]
                n, s1 = k - lo, (k * (k - 1) - lo * (lo - 1)) // 2  # linear_window's first sum
                out.append(before[i] + (n * a2 + b2 * s1))
        return out

    def steps_to_reach(self, duration: int) -> int:
        """Smallest k >= 0 with sum_{j<k} d_j >= duration."""
        return self.reach(duration)[0]

    def reach(self, duration: int) -> tuple[int, tuple[int, int]]:
        """``steps_to_reach(duration)`` and its ``sums``."""
        if check_duration(duration) <= 0:
            return 0, (0, 0)
        split = self.split
        a, b = self.head
        if split is None or split * a + b * (split * (split - 1) // 2) >= duration:
            k = _solve(a, b, duration)  # on the head line: settled as WindowCurve does
            while k > 0 and (k - 1) * a + b * ((k - 1) * (k - 2) // 2) >= duration:
                k -= 1
            while k * a + b * (k * (k - 1) // 2) < duration:
                k += 1
            if split is None or k <= split:
                return k, self.sums(k)
            start, before = 0, 0  # rounding put it past the split: settle below
        else:
            self._segments()
            s = bisect_right(self.totals_at, duration) - 1  # last segment starting below it
            while s > 0 and self.totals_at[s] >= duration:
                s -= 1
            start, (a, b), before = self.starts[s], self.lines[s], self.totals_at[s]
        k = start + _solve(a + b * start, b, duration - before)
        total = self.total
        while k > 0 and total(k - 1) >= duration:
            k -= 1
        while total(k) < duration:
            k += 1
        return k, self.sums(k)


def segment_starts(x0: int, dx: int, points: tuple[int, ...], first: int) -> list[tuple[int, int]]:
    """Where an argument ``x0 + dx j`` (dx >= 0) moves onto the next lines of a curve whose
    measured points are ``points``, starting on line ``first``: [(j, line index), ...] for the
    lines after ``first`` (none when dx = 0). Line i holds from ``points[i]`` on."""
    if dx == 0:
        return []
    out = []
    for i in range(first + 1, len(points) - 1):
        out.append((-((x0 - points[i]) // dx), i))  # ceil((points[i] - x0) / dx)
    return out

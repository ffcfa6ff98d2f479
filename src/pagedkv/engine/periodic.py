"""Periodic weights: how many sequences take a new block in each decode round, summed in O(1).

A decoding sequence gains one token a round, so it takes a block every ``bs`` rounds: at the
rounds i = first, first + bs, first + 2 bs, ... , all congruent to ``first`` modulo bs. With
``count[r]`` sequences whose rounds are congruent to r, round i takes w(i) = count[i mod bs]
blocks. The decode cohort (``cohort.py``) needs, for a window of rounds (a, b], the blocks
taken and the times at which they are taken, which are sums of w(i) i^p (p = 0, 1, 2)::

    residue:   0 1 2 ... bs-1 | 0 1 2 ... bs-1 | ... | 0 1 ... R
    round i:   period 0       | period 1       |     | period Q (partial)

    G_p(y) = sum_{i=1..y} w(i) i^p
           = sum over the Q whole periods + the partial one, with i = P bs + r:
             whole periods from the sums S_p = sum_r count[r] r^p and sums of P, P^2;
             the partial one from the prefix sums of count[r] r^p up to R

so each window costs O(1) Python steps, however many rounds or blocks it spans (a prefix sum
is a slice sum, done in C). Exact integer arithmetic throughout.
"""

from __future__ import annotations


class PeriodicCounts:
    """``count[r]`` for r in [0, period): the weight w(i) = count[i mod period] of round i."""

    def __init__(self, period: int) -> None:
        if period < 1:
            raise ValueError(f"period must be >= 1, got {period}")
        self.period = period
        self.count = [0] * period
        # count[r] r and count[r] r^2, and the sums S_0, S_1, S_2 over a whole period: kept
        # up to date by ``add`` (O(1)); a prefix sum is then one slice sum, in C.
        self._w1 = [0] * period
        self._w2 = [0] * period
        self._s = [0, 0, 0]

    def add(self, residue: int, delta: int) -> None:
        """count[residue] += delta (it must stay >= 0)."""
        count = self.count[residue] + delta
        if count < 0:
            raise ValueError(f"count of residue {residue} below zero")
        self.count[residue] = count
        d1 = delta * residue
        d2 = d1 * residue
        self._w1[residue] += d1
        self._w2[residue] += d2
        s = self._s
        s[0] += delta
        s[1] += d1
        s[2] += d2

    def _g0(self, y: int) -> int:
        """G_0(y) = sum_{i=1..y} w(i), y >= 0."""
        q, r = divmod(y, self.period)
        return self._s[0] * q + sum(self.count[1 : r + 1])  # round 0 is not in 1..y

    def _g(self, y: int) -> tuple[int, int, int]:
        """(G_0, G_1, G_2)(y), y >= 0."""
        bs = self.period
        q, r = divmod(y, bs)
        s0, s1, s2 = self._s
        p0 = sum(self.count[: r + 1])  # prefix sums of the partial period
        p1 = sum(self._w1[: r + 1])
        p2 = sum(self._w2[: r + 1])
        sum_p = q * (q - 1) // 2  # sum of P over whole periods P = 0..q-1
        sum_p2 = (q - 1) * q * (2 * q - 1) // 6
        base = q * bs  # the partial period's first round
        g0 = s0 * q + p0 - self.count[0]  # round 0 is not in 1..y
        g1 = bs * s0 * sum_p + s1 * q + base * p0 + p1
        g2 = bs * bs * s0 * sum_p2 + 2 * bs * s1 * sum_p + s2 * q + base * (base * p0 + 2 * p1) + p2
        return g0, g1, g2

    def total(self, a: int, b: int) -> int:
        """sum of w(i) over rounds a < i <= b (0 <= a <= b)."""
        return self._g0(b) - self._g0(a)

    def moments(self, a: int, b: int) -> tuple[int, int, int]:
        """sums of w(i), w(i) i and w(i) i^2 over rounds a < i <= b (0 <= a <= b)."""
        hi, lo = self._g(b), self._g(a)
        return hi[0] - lo[0], hi[1] - lo[1], hi[2] - lo[2]

    def window(self, a: int, b: int) -> tuple[int, int, int]:
        """sums of w(i), w(i) x and w(i) x^2 over rounds a < i <= b, x = i - 1 - a the round's
        place in the window (0 for the first).

        A window shorter than a period meets each residue at most once: one or two slices of
        the counts (when it wraps past residue bs - 1), x = r - r0 within each::

            residues:  r0 ...... bs-1 | 0 ...... r1        x = r - r0  |  x = r + bs - r0
        """
        k = b - a
        bs = self.period
        if k > bs:
            w0, m1, m2 = self.moments(a, b)
            o = a + 1
            return w0, m1 - o * w0, m2 - 2 * o * m1 + o * o * w0
        r0 = (a + 1) % bs
        end = r0 + k
        c, w1, w2 = self.count, self._w1, self._w2
        if end <= bs:
            w0, s1, s2 = sum(c[r0:end]), sum(w1[r0:end]), sum(w2[r0:end])
            return w0, s1 - r0 * w0, s2 - 2 * r0 * s1 + r0 * r0 * w0
        end -= bs
        head = sum(c[r0:]), sum(w1[r0:]), sum(w2[r0:])
        tail = sum(c[:end]), sum(w1[:end]), sum(w2[:end])
        o = bs - r0  # the tail's shift: x = r + o
        return (
            head[0] + tail[0],
            head[1] - r0 * head[0] + tail[1] + o * tail[0],
            head[2]
            - 2 * r0 * head[1]
            + r0 * r0 * head[0]
            + tail[2]
            + 2 * o * tail[1]
            + o * o * tail[0],
        )

    def first_over(self, a: int, limit: int) -> int:
        """The first round i > a with ``total(a, i) > limit`` (limit >= 0; some count > 0)."""
        per_period = self._s[0]
        if per_period <= 0:
            raise ValueError("no weight: the total never grows")
        lo, hi = a, a + self.period * (limit // per_period + 1)  # total(a, hi) > limit
        while hi - lo > 1:  # invariant: total(a, lo) <= limit < total(a, hi)
            mid = (lo + hi) // 2
            if self.total(a, mid) > limit:
                hi = mid
            else:
                lo = mid
        return hi

    def rounds(self, a: int, b: int) -> list[int]:
        """Each round a < i <= b repeated w(i) times, ascending (for the rare window that needs
        the rounds one by one)."""
        out = []
        for r, w in enumerate(self.count):
            if w:
                first = a + 1 + (r - a - 1) % self.period
                for i in range(first, b + 1, self.period):
                    out += [i] * w
        return sorted(out)

"""Periodic weights: how many sequences take a new block in each decode round, summed in O(1).

A decoding sequence gains one token a round, so it takes a block every ``bs`` rounds: at the
rounds i = first, first + bs, first + 2 bs, ... , all congruent to ``first`` modulo bs. With
``count[r]`` sequences whose rounds are congruent to r, round i takes w(i) = count[i mod bs]
blocks. The decode cohort (``cohort.py``) needs, for a window of rounds (a, b], the blocks
taken and the times at which they are taken, which are sums of w(i) x^p (p = 0, 1, 2) over
the window's rounds, x = i - 1 - a the round's place in it::

    x:         0 1 ... bs-1 | bs ... 2bs-1 | ... | q bs ... k-1
    residue:   r0 ...  (all bs residues once per period, starting at r0 = (a + 1) mod bs)
               period 0      | period 1     |     | the partial one (k mod bs rounds)

A period meets each residue once, and period P is period 0 shifted by x -> x + P bs: the q
whole periods follow from period 0's sums and sums of P and P^2. A run of at most bs rounds
(period 0, or the partial one) is one slice of the counts laid out twice over, positions
0 .. 2 bs - 1 (so a run that wraps past residue bs - 1 needs no second slice)::

    position p:  0 ........ bs-1 | bs ....... 2bs-1
    count:       count[0 .. bs-1] | count[0 .. bs-1] again
    a run:             r0 ................ r0 + k - 1          x = p - r0

So each window costs O(1) Python steps, however many rounds or blocks it spans (a slice sum is
done in C). Exact integer arithmetic throughout.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate


class PeriodicCounts:
    """``count[r]`` for r in [0, period): the weight w(i) = count[i mod period] of round i."""

    def __init__(self, period: int) -> None:
        if period < 1:
            raise ValueError(f"period must be >= 1, got {period}")
        self.period = period
        # At positions p = 0 .. 2 bs - 1 (residue p mod bs): the count, count p and count p^2,
        # kept up to date by ``add`` (O(1)); a run's sums are then three slice sums, in C.
        self._w0 = [0] * (2 * period)
        self._w1 = [0] * (2 * period)
        self._w2 = [0] * (2 * period)
        self.weight = 0  # sum of count[r]: the weight of one whole period

    def add(self, residue: int, delta: int) -> None:
        """count[residue] += delta (it must stay >= 0)."""
        w0, w1, w2 = self._w0, self._w1, self._w2
        count = w0[residue] + delta
        if count < 0:
            raise ValueError(f"count of residue {residue} below zero")
        self.weight += delta
        p = residue + self.period  # its second position
        w0[residue] = w0[p] = count
        w1[residue] += delta * residue
        w2[residue] += delta * residue * residue
        w1[p] += delta * p
        w2[p] += delta * p * p

    @property
    def count(self) -> list[int]:
        """count[r] for r in [0, period)."""
        return self._w0[: self.period]

    def total(self, a: int, b: int) -> int:
        """sum of w(i) over rounds a < i <= b (0 <= a <= b)."""
        q, r = divmod(b - a, self.period)
        r0 = (a + 1) % self.period
        return q * self.weight + sum(self._w0[r0 : r0 + r])

    def window(self, a: int, b: int) -> tuple[int, int, int]:
        """sums of w(i), w(i) x and w(i) x^2 over rounds a < i <= b (0 <= a <= b), x = i - 1 - a
        the round's place in the window (0 for the first)."""
        k = b - a
        bs = self.period
        r0 = (a + 1) % bs
        if k == 1:  # a round of its own (a preemption's, a resumption's): x = 0
            return self._w0[r0], 0, 0
        if k <= bs:  # the usual window: one run (``_run``, inlined)
            end = r0 + k
            w0 = sum(self._w0[r0:end])
            s1 = sum(self._w1[r0:end])
            s2 = sum(self._w2[r0:end])
            return w0, s1 - r0 * w0, s2 - 2 * r0 * s1 + r0 * r0 * w0
        q, r = divmod(k, bs)
        # period 0 (``_run(r0, bs)``: every residue once, so its count is the weight); period
        # P adds P bs to x
        end = r0 + bs
        c0 = self.weight
        c1 = sum(self._w1[r0:end])
        c2 = sum(self._w2[r0:end]) - 2 * r0 * c1 + r0 * r0 * c0
        c1 -= r0 * c0
        p1 = q * (q - 1) // 2  # sum of P over P = 0..q-1
        p2 = (q - 1) * q * (2 * q - 1) // 6  # sum of P^2
        w0 = q * c0
        w1 = q * c1 + bs * c0 * p1
        w2 = q * c2 + 2 * bs * c1 * p1 + bs * bs * c0 * p2
        if r:  # the partial period, at x = q bs on
            t0, t1, t2 = self._run(r0, r)
            o = q * bs
            w0 += t0
            w1 += t1 + o * t0
            w2 += t2 + 2 * o * t1 + o * o * t0
        return w0, w1, w2

    def _run(self, r0: int, k: int) -> tuple[int, int, int]:
        """``window`` of k <= period rounds whose first has residue r0: positions r0 .. r0 + k - 1,
        x = p - r0."""
        end = r0 + k
        w0 = sum(self._w0[r0:end])
        s1 = sum(self._w1[r0:end])
        s2 = sum(self._w2[r0:end])
        return w0, s1 - r0 * w0, s2 - 2 * r0 * s1 + r0 * r0 * w0

    def first_over(self, a: int, limit: int) -> int:
        """The first round i > a with ``total(a, i) > limit`` (limit >= 0; some count > 0).

        Whole periods each add ``weight``: q = limit // weight of them stay within the limit,
        and the round is in the next one, where the running sum of its counts (positions
        r0 .. r0 + bs - 1) first passes what is left of the limit."""
        per_period = self.weight
        if per_period <= 0:
            raise ValueError("no weight: the total never grows")
        q, left = divmod(limit, per_period)
        r0 = (a + 1) % self.period
        running = accumulate(self._w0[r0 : r0 + self.period])
        return a + q * self.period + bisect_right(list(running), left) + 1

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

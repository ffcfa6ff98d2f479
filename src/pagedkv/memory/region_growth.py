"""Growth in closed form inside contiguous regions: sequences that gain one token per round.

A region is reserved up front, so a decoding sequence grows inside it: no slot is taken or
freed, and the only event is the round its region is full. From the round r0 it starts
growing, a sequence of t0 tokens whose region holds up to ``cap`` of them (its held slots,
its final length and max_model_len, the least of the three) has at round d::

    tokens(d)   = t0 + (d - r0)                 while d <= end = r0 + (cap - t0)
    reservation = min(held, final) - tokens(d)  (one slot of it filled a round)
    internal    = held - min(held, final)       (unchanged: the final length is not passed)

``RegionGrowth`` keeps the growers of one ``ContiguousAllocator`` as (r0, end) plus two sums,
so the books at round d are the regions' (as of each one's r0) plus::

    lag tokens  = n d - sum r0                  (token states gained, reservation lost)

and the first round a region is full is the least ``end`` (a heap). The allocator adds the lag
to its books and, when something reads a grower's region, moves its tokens there (``remove``
says how many it gained).
"""

from __future__ import annotations

import heapq

from pagedkv.errors import IntegrityError, PagedKVError
from pagedkv.memory.interface import SeqId


class RegionGrowth:
    """The growing sequences of one contiguous allocator, and their lag at the current round."""

    def __init__(self) -> None:
        self.round = 0  # decode rounds advanced
        self.seqs: dict[SeqId, tuple[int, int, int]] = {}  # seq id -> (r0, end, serial)
        self.sum_join = 0
        self._ends: list[tuple[int, int]] = []  # (end, serial): a heap
        self._dead: set[int] = set()  # serials of growers gone (their heap entries are stale)
        self._serial = 0

    @property
    def lag_tokens(self) -> int:
        """Tokens the growers gained since they joined (not in their regions' counters)."""
        return len(self.seqs) * self.round - self.sum_join

    def add(self, seq_id: SeqId, room: int) -> None:
        """``seq_id`` grows from the next round on, by at most ``room`` tokens (>= 0)."""
        if room < 0:
            raise PagedKVError(f"sequence {seq_id!r} cannot grow: its region is past full")
        d = self.round
        self._serial = serial = self._serial + 1
        self.seqs[seq_id] = (d, d + room, serial)
        heapq.heappush(self._ends, (d + room, serial))
        self.sum_join += d

    def remove(self, seq_id: SeqId) -> int:
        """Stop ``seq_id`` growing; returns the tokens it gained since it joined."""
        join, _, serial = self.seqs.pop(seq_id)
        self.sum_join -= join
        self._dead.add(serial)
        if len(self._dead) > 64 and 2 * len(self._dead) > len(self._ends):
            # mostly stale entries (growers settled before their end): rebuild from the live
            self._ends = [(end, s) for _, end, s in self.seqs.values()]
            heapq.heapify(self._ends)
            self._dead.clear()
        return self.round - join

    def rounds_that_fit(self) -> int | None:
        """Rounds from now before some region is full (None: nothing grows)."""
        if not self.seqs:
            return None
        ends, dead = self._ends, self._dead
        while ends[0][1] in dead:
            dead.remove(heapq.heappop(ends)[1])
        return ends[0][0] - self.round

    def advance(self, k: int, upto: bool = False) -> int:
        """k rounds of growth (with ``upto``: as many of them as every region holds); returns
        the rounds run. ``PagedKVError``, changing nothing, if (without ``upto``) a region
        would pass full."""
        if k < 0:
            raise PagedKVError(f"growth of {k} rounds: must be >= 0")
        fit = self.rounds_that_fit()
        if fit is not None and k > fit:
            if not upto:
                raise PagedKVError(f"growth of {k} rounds: a region is full after {fit}")
            k = fit
        self.round += k
        return k

    def check(self) -> None:
        """Recompute the sum from the growers; none has passed its end; the heap holds them."""
        if sum(join for join, _, _ in self.seqs.values()) != self.sum_join:
            raise IntegrityError(f"region growth: sum of joins {self.sum_join} is stale")
        live = {serial for _, _, serial in self.seqs.values()}
        if not live <= {serial for _, serial in self._ends} or live & self._dead:
            raise IntegrityError("region growth: a grower's end is not in the heap")
        for seq_id, (_, end, _) in self.seqs.items():
            if self.round > end:
                raise IntegrityError(f"growing sequence {seq_id!r} passed its region's end")

"""Bisection on request rate: the highest rate that still meets the SLOs.

The search assumes the SLO check is monotone in rate (more load never lowers p99 latency),
which holds for queueing systems below and above saturation and is what capacity planning
means. Rates span decades, so the midpoint is geometric (``sqrt(lo * hi)``): the answer is
found to a relative ``tolerance`` in ``log2(log(high / low) / log(1 + tolerance))`` probes.
Order of probes: ``low`` first (a candidate that fails there is infeasible), then ``high``
(one that passes there is reported at ``high``, capped), then midpoints until
``fail / pass <= 1 + tolerance``; the answer is the highest rate that passed. The search also
stops when the midpoint no longer lies strictly between the two (floating point has run out of
rates between them), so it ends for any tolerance, 0 included; a plan's tolerance is bounded
below by ``MIN_TOLERANCE`` all the same, so its answer means what the tolerance says.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

MIN_TOLERANCE = 1e-9
"""The finest relative tolerance a plan may ask for: about 2^30 times float64's spacing (2.2e-16),
so the midpoints still move, and at most about 40 probes over any allowed rate range."""


@dataclass
class RateSearch:
    low: float
    high: float
    tolerance: float
    passed: float | None = None
    failed: float | None = None
    probes: list[tuple[float, bool]] = field(default_factory=list)

    def next_rate(self) -> float | None:
        """The rate to probe next, or None when the search is over."""
        if not self.probes:
            return self.low
        if self.passed is None:
            return None  # failed at low: infeasible
        if self.failed is None:
            return None if self.passed >= self.high else self.high
        if self.failed / self.passed <= 1 + self.tolerance:
            return None
        mid = math.sqrt(self.passed) * math.sqrt(self.failed)  # no overflow of the product
        return mid if self.passed < mid < self.failed else None  # no rate left between them

    def record(self, rate: float, ok: bool) -> None:
        self.probes.append((rate, ok))
        if ok:
            self.passed = rate if self.passed is None else max(self.passed, rate)
        else:
            self.failed = rate if self.failed is None else min(self.failed, rate)

    @property
    def capped(self) -> bool:
        """True when the highest rate probed still passed (the real limit is higher)."""
        return self.passed is not None and self.passed >= self.high


def bisect_rate(
    meets: Callable[[float], bool], low: float, high: float, tolerance: float
) -> RateSearch:
    """Run a search serially against ``meets(rate)`` (the planner runs many in parallel)."""
    search = RateSearch(low, high, tolerance)
    while (rate := search.next_rate()) is not None:
        search.record(rate, meets(rate))
    return search

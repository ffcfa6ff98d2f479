"""How many replicas of a candidate serve a target rate R inside the SLOs.

A Poisson stream of rate R split evenly over k replicas, each request sent to one of them
chosen uniformly at random, gives each replica a Poisson stream of rate R / k, independent of
the others (the colouring theorem: Kingman, *Poisson Processes*, 1993). So k replicas meet the
SLOs at R exactly when one replica meets them at R / k, and the answer is the smallest such k.
(Round-robin dispatch gives each replica smoother, Erlang-k gaps, so the answer is then on the
safe side.)

The candidate's sustained rate r* (the rate search's answer) gives the first guess,
``k = ceil(R / r*)``, but only to within the search's tolerance: the real limit lies between
r* and the lowest failing rate f, so fewer replicas may do, and a run at R / k with other
arrival times than the search's may still fail. The guess is therefore checked by simulation,
and the search goes on over integers until it holds a k that passed and k - 1 that failed (or
k = 1; zero replicas serve nothing):

- the guess fails: try k + 1, k + 2, ... up to ``MAX_EXTRA_REPLICAS`` above the guess; if none
  passes, the candidate has no answer;
- the guess passes: try k - 1; if that passes too, try ``floor(R / f)`` (the most replicas
  whose share R / k is at or above the failing rate f), then bisect between the highest
  failure and the lowest pass. Every bracket end is simulated, so "k - 1 fails" is a fact of
  a run, not a guess.

Like the rate search, this assumes more load per replica never lowers p99 latency (fewer
replicas never pass where more fail).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pagedkv.workloads.config import MIN_RATE

MAX_EXTRA_REPLICAS = 8
"""How far above ``ceil(R / r*)`` the search climbs when the guess fails its check: the guess
already gives each replica no more than r*, a rate that passed, so a failure there is noise of
the arrival pattern, which a few more replicas absorb or nothing does."""


@dataclass
class ReplicaSearch:
    target_rate: float
    guess: int
    failed_rate: float | None
    """The lowest rate the rate search saw fail (None: it was capped at rate_high)."""
    probes: list[tuple[int, bool]] = field(default_factory=list)

    @classmethod
    def start(cls, target_rate: float, sustained: float, failed: float | None) -> ReplicaSearch:
        return cls(target_rate, max(1, math.ceil(target_rate / sustained)), failed)

    @property
    def passed(self) -> int | None:
        """The fewest replicas that passed so far."""
        return min((k for k, ok in self.probes if ok), default=None)

    @property
    def failed_below(self) -> int:
        """The most replicas, below ``passed``, that failed (0 when none did: zero serve
        nothing)."""
        hi = self.passed
        return max((k for k, ok in self.probes if not ok and (hi is None or k < hi)), default=0)

    def rate(self, k: int) -> float:
        """The rate each of k replicas gets."""
        return self.target_rate / k

    def next_replicas(self) -> int | None:
        """The replica count to simulate next, or None when the search is over."""
        if not self.probes:
            return self.guess
        hi, lo = self.passed, self.failed_below
        if hi is None:
            k = lo + 1
            in_range = k <= self.guess + MAX_EXTRA_REPLICAS and self.rate(k) >= MIN_RATE
            return k if in_range else None
        if hi - lo <= 1:
            return None
        if len(self.probes) == 1:
            return hi - 1  # the guess passed: one fewer is the likely answer
        # The most replicas whose share, R / k >= f, the rate search already saw fail.
        bound = math.floor(self.target_rate / self.failed_rate) if self.failed_rate else 0
        if lo < bound < hi and all(k != bound for k, _ in self.probes):
            return bound
        return (lo + hi) // 2

    def record(self, k: int, ok: bool) -> None:
        self.probes.append((k, ok))

    @property
    def replicas(self) -> int | None:
        """The answer once the search is over: the fewest replicas that met the SLOs, k - 1
        having failed (or k = 1); None when no count up to the cap did."""
        hi = self.passed
        return hi if hi is not None and hi - self.failed_below <= 1 else None

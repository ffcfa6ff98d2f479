"""``run_plan``: for each candidate, the highest request rate that meets the SLOs, and its cost.

The rule a probe (one candidate at one rate) must meet, for EVERY seed of the plan: the run
raised nothing, did not deadlock, finished every request (none rejected) and each SLO metric
(a p99 over the run's requests) is at or under its limit. One seed over the limit fails the
probe: the plan is for the unlucky arrival pattern too.

The searches of all candidates advance in rounds: each round, every unfinished candidate names
its next rate and all (candidate, seed) simulations of the round go to ``run_points`` together,
so different candidates' probes run in parallel, on local processes or on Ray.

Cost per million requests = price per GPU-hour x GPUs / (sustained req/s x 3600) x 1e6, where
the sustained rate is the highest rate that passed (an offered Poisson rate the deployment keeps
up with inside its SLOs).

With a target rate R (``PlanSpec.target_rate``), each candidate that meets the SLOs at some
rate also gets the fewest replicas that serve R (``pagedkv.sweep.replicas``: the guess
``ceil(R / sustained)``, checked by simulating one replica at R / k for every seed), their cost
per hour = replicas x GPUs per replica x price per GPU-hour, and the cost per million requests
at R = cost per hour / (R x 3600) x 1e6; candidates are then ranked by cost per hour.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagedkv.sweep.bisect import RateSearch
from pagedkv.sweep.plan_spec import Candidate, PlanSpec
from pagedkv.sweep.pool import check_backend, run_points
from pagedkv.sweep.replicas import MAX_EXTRA_REPLICAS, ReplicaSearch
from pagedkv.sweep.sweep import run_point


@dataclass(frozen=True)
class TargetResult:
    """One candidate at the plan's target rate."""

    rate: float
    replicas: int | None
    """The fewest replicas that met the SLOs at rate / replicas, one fewer having failed (or
    1); None when no count up to the search's cap did."""
    guess: int | None
    """``ceil(rate / sustained rate)``, where the replica search started (None: no search, the
    candidate sustained no rate)."""
    probes: list[tuple[int, bool]]
    slo_values: dict[str, float]
    """Each SLO metric at rate / replicas, the worst over seeds."""
    error: str | None


@dataclass(frozen=True)
class CandidateResult:
    candidate: Candidate
    max_rate: float | None
    """The highest rate that met the SLOs (None: not even rate_low did, or an error)."""
    capped: bool
    """The search's top rate still passed: the real limit is higher than max_rate."""
    probes: list[tuple[float, bool]]
    slo_values: dict[str, float]
    """Each SLO metric at max_rate, the worst over seeds."""
    error: str | None
    target: TargetResult | None = None
    """The replicas at the plan's target rate (None: the plan has none)."""

    @property
    def replicas(self) -> int | None:
        return None if self.target is None else self.target.replicas

    @property
    def cost_per_hour(self) -> float | None:
        """Replicas x GPUs per replica x price per GPU-hour, to serve the target rate."""
        if self.replicas is None:
            return None
        return self.replicas * self.num_gpus * self.candidate.price_per_gpu_hour

    @property
    def cost_per_million_at_target(self) -> float | None:
        """Cost per hour / (target req/s x 3600) x 1e6: what a million requests cost at R."""
        hourly = self.cost_per_hour
        if hourly is None or self.target is None:
            return None
        return hourly / (self.target.rate * 3600) * 1e6

    @property
    def num_gpus(self) -> int:
        return self.candidate.tensor_parallel_size

    @property
    def cost_per_million(self) -> float | None:
        if not self.max_rate:
            return None
        hourly = self.candidate.price_per_gpu_hour * self.num_gpus
        return hourly / (self.max_rate * 3600) * 1e6

    @property
    def status(self) -> str:
        if self.error is not None:
            return f"error: {self.error}"
        if self.max_rate is None:
            return "misses the SLOs at rate_low"
        t = self.target
        if t is not None and t.error is not None:
            return f"error at the target rate: {t.error}"
        if t is not None and t.replicas is None and t.guess is not None:
            return f"no replica count up to {t.guess + MAX_EXTRA_REPLICAS} meets the SLOs"
        return "capped at rate_high" if self.capped else "ok"

    def row(self) -> dict[str, Any]:
        c = self.candidate
        return {
            "candidate": c.name,
            "gpu": c.gpu,
            "tensor_parallel_size": c.tensor_parallel_size,
            "block_size": c.block_size,
            "scheduler": c.scheduler,
            "num_gpus": self.num_gpus,
            "price_per_gpu_hour": c.price_per_gpu_hour,
            "max_rate": self.max_rate,
            "cost_per_million_requests": self.cost_per_million,
            **{f"{k}_at_max_rate": v for k, v in self.slo_values.items()},
            "probes": len(self.probes),
            **({} if self.target is None else self._target_row(self.target)),
            "status": self.status,
        }

    def _target_row(self, t: TargetResult) -> dict[str, Any]:
        return {
            "target_rate": t.rate,
            "replicas": t.replicas,
            "total_gpus": None if t.replicas is None else t.replicas * self.num_gpus,
            "cost_per_hour": self.cost_per_hour,
            "cost_per_million_at_target": self.cost_per_million_at_target,
            **{f"{k}_at_target": v for k, v in t.slo_values.items()},
            "replica_probes": len(t.probes),
        }


def probe_passes(metrics: list[dict[str, Any]], slo: dict[str, float]) -> bool:
    """The probe rule (see the module docstring) over the seeds' flattened summaries."""
    return all(
        not m["deadlocked"]
        and m["finished"] == m["num_requests"]
        and all(m[key] <= limit for key, limit in slo.items())
        for m in metrics
    )


def run_plan(
    spec: PlanSpec,
    *,
    backend: str = "local",
    workers: int | None = None,
    address: str | None = None,
    progress: str | None = None,
) -> list[CandidateResult]:
    """Search every candidate; results ranked by cost per million requests (cheapest first,
    then higher rate, then name), or with a target rate by cost per hour; candidates that meet
    no rate come last."""
    check_backend(backend, workers)
    rounds = _Rounds(spec, backend, workers, address, progress)
    searches = {
        c: RateSearch(spec.rate_low, spec.rate_high, spec.tolerance) for c in spec.candidates()
    }
    errors: dict[Candidate, str] = {}
    at_rate: dict[tuple[Candidate, float], list[dict[str, Any]]] = {}
    while probes := [
        (c, rate)
        for c, s in searches.items()
        if c not in errors and (rate := s.next_rate()) is not None
    ]:
        for (c, rate), metrics in rounds.run(probes, errors).items():
            searches[c].record(rate, probe_passes(metrics, spec.slo))
            at_rate[(c, rate)] = metrics
    targets = {} if spec.target_rate is None else _replicas(spec, searches, errors, rounds)
    out = []
    for c, s in searches.items():
        metrics = at_rate.get((c, s.passed), []) if s.passed is not None else []
        out.append(
            CandidateResult(
                c,
                s.passed,
                s.capped,
                s.probes,
                _worst(metrics, spec),
                errors.get(c),
                targets.get(c),
            )
        )
    return sorted(out, key=_rank if spec.target_rate is None else _rank_at_target)


def _replicas(
    spec: PlanSpec,
    searches: dict[Candidate, RateSearch],
    errors: dict[Candidate, str],
    rounds: _Rounds,
) -> dict[Candidate, TargetResult]:
    """The replica search of every candidate that sustained some rate, in rounds like the
    rate search; the others get no count (every candidate gets the target's columns)."""
    assert spec.target_rate is not None
    found = {
        c: ReplicaSearch.start(spec.target_rate, s.passed, s.failed)
        for c, s in searches.items()
        if c not in errors and s.passed is not None
    }
    failed: dict[Candidate, str] = {}
    at_k: dict[tuple[Candidate, int], list[dict[str, Any]]] = {}
    while probes := [
        (c, r, k)
        for c, r in found.items()
        if c not in failed and (k := r.next_replicas()) is not None
    ]:
        by_rate = {(c, r.rate(k)): (c, k) for c, r, k in probes}
        for key, metrics in rounds.run(list(by_rate), failed).items():
            c, k = by_rate[key]
            found[c].record(k, probe_passes(metrics, spec.slo))
            at_k[(c, k)] = metrics
    out = {c: TargetResult(spec.target_rate, None, None, [], {}, None) for c in searches}
    for c, r in found.items():
        k = r.replicas
        metrics = at_k.get((c, k), []) if k is not None else []
        out[c] = TargetResult(
            spec.target_rate, k, r.guess, r.probes, _worst(metrics, spec), failed.get(c)
        )
    return out


class _Rounds:
    """One round: all (candidate, rate, seed) runs of the round through ``run_points`` at once."""

    def __init__(
        self,
        spec: PlanSpec,
        backend: str,
        workers: int | None,
        address: str | None,
        progress: str | None,
    ) -> None:
        self.spec, self.backend, self.workers, self.address = spec, backend, workers, address
        self.progress = progress
        self.count = 0

    def run(
        self, probes: list[tuple[Candidate, float]], errors: dict[Candidate, str]
    ) -> dict[tuple[Candidate, float], list[dict[str, Any]]]:
        """Each probe's seeds' flattened summaries; a candidate whose run raised gets its first
        error in ``errors`` and no entry."""
        self.count += 1
        jobs = [(c, rate, seed) for c, rate in probes for seed in self.spec.seeds]
        results: dict[tuple[Candidate, float], list[dict[str, Any]]] = {p: [] for p in probes}
        label = None if self.progress is None else f"{self.progress} round {self.count}"
        opts = [c.options(self.spec.options, rate, seed) for c, rate, seed in jobs]
        for o in run_points(
            run_point,
            opts,
            backend=self.backend,
            workers=self.workers,
            address=self.address,
            progress=label,
        ):
            c, rate, _ = jobs[o.index]
            if o.error is not None:
                errors.setdefault(c, o.error)
            else:
                results[(c, rate)].append(o.value or {})
        return {p: m for p, m in results.items() if p[0] not in errors}


def _worst(metrics: list[dict[str, Any]], spec: PlanSpec) -> dict[str, float]:
    return {k: max(m[k] for m in metrics) for k in spec.slo} if metrics else {}


def _rank(r: CandidateResult) -> tuple[bool, float, float, str]:
    cost = r.cost_per_million
    return (cost is None, cost or 0.0, -(r.max_rate or 0.0), r.candidate.name)


def _rank_at_target(r: CandidateResult) -> tuple[bool, float, float, str]:
    cost = r.cost_per_hour
    return (cost is None, cost or 0.0, -(r.max_rate or 0.0), r.candidate.name)

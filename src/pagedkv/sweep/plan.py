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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagedkv.sweep.bisect import RateSearch
from pagedkv.sweep.plan_spec import Candidate, PlanSpec
from pagedkv.sweep.pool import check_backend, run_points
from pagedkv.sweep.sweep import run_point


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
            "status": self.status,
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
    then higher rate, then name); candidates that meet no rate come last."""
    check_backend(backend, workers)
    candidates = spec.candidates()
    searches = {c: RateSearch(spec.rate_low, spec.rate_high, spec.tolerance) for c in candidates}
    errors: dict[Candidate, str] = {}
    at_rate: dict[tuple[Candidate, float], list[dict[str, Any]]] = {}
    round_no = 0
    while True:
        probes = [
            (c, rate)
            for c, s in searches.items()
            if c not in errors and (rate := s.next_rate()) is not None
        ]
        if not probes:
            break
        round_no += 1
        jobs = [(c, rate, seed) for c, rate in probes for seed in spec.seeds]
        results: dict[tuple[Candidate, float], list[dict[str, Any]]] = {p: [] for p in probes}
        label = None if progress is None else f"{progress} round {round_no}"
        opts = [c.options(spec.options, rate, seed) for c, rate, seed in jobs]
        for o in run_points(
            run_point, opts, backend=backend, workers=workers, address=address, progress=label
        ):
            c, rate, _ = jobs[o.index]
            if o.error is not None:
                errors.setdefault(c, o.error)
            else:
                results[(c, rate)].append(o.value or {})
        for (c, rate), metrics in results.items():
            if c not in errors:
                searches[c].record(rate, probe_passes(metrics, spec.slo))
                at_rate[(c, rate)] = metrics
    out = []
    for c, s in searches.items():
        metrics = at_rate.get((c, s.passed), []) if s.passed is not None else []
        worst = {k: max(m[k] for m in metrics) for k in spec.slo} if metrics else {}
        out.append(CandidateResult(c, s.passed, s.capped, s.probes, worst, errors.get(c)))
    return sorted(out, key=_rank)


def _rank(r: CandidateResult) -> tuple[bool, float, float, str]:
    cost = r.cost_per_million
    return (cost is None, cost or 0.0, -(r.max_rate or 0.0), r.candidate.name)

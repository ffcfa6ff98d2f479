"""What every experiment shares: its plan of runs, running them in parallel, the tidy table, the
summary with 95% intervals, and the results directory.

An experiment module defines ``NAME``, ``TITLE``, ``QUESTION``, ``plan(quick, seeds) -> Plan``,
``plot(result, out_dir) -> list[PlotRef]`` and ``findings(result) -> list[str]``.
``run_experiment`` runs its points through ``pagedkv.sweep.pool.run_points`` (processes, a
progress bar with ETA on a terminal), orders the rows by configuration then seed (so the table
never depends on which worker finished first), and ``write_results`` writes the directory:
``results.json`` (the shared schema), ``results.csv`` (the raw rows) and the PNGs, atomically.
A module may also define ``derive(result, quick, workers) -> dict``: results computed after the
rows (e.g. ``rate-latency``'s bisections on the rate), kept in ``ExperimentResult.derived`` and
written under ``derived`` in results.json.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from pagedkv.errors import PagedKVError
from pagedkv.experiments import sharing_metrics  # noqa: F401  (registers its columns)
from pagedkv.experiments.metrics import CATEGORIES, bounds, read_metrics
from pagedkv.io import atomic_write_json, atomic_write_text, output_set
from pagedkv.report import stats
from pagedkv.simulation import SimulationConfig, simulate
from pagedkv.validation import check_int

DEFAULT_SEEDS = 5
QUICK_SEEDS = 3
TIMELINE_BINS = 60
"""Time bins of a memory timeline: enough to see its shape, small enough to ship between
processes."""


@dataclass(frozen=True)
class Point:
    """One run: its configuration's values (the table's key columns), the seed, the complete
    flat config for ``pagedkv.simulate`` and the metrics to read. ``timeline`` also records the
    five memory categories over time (steps one at a time: slower)."""

    config: Mapping[str, Any]
    seed: int
    flat: Mapping[str, Any]
    metrics: tuple[str, ...]
    timeline: bool = False


@dataclass(frozen=True)
class Plan:
    setup: dict[str, Any]
    config_keys: tuple[str, ...]
    metrics: tuple[str, ...]
    points: list[Point]


@dataclass(frozen=True)
class PlotRef:
    file: str
    caption: str


@dataclass
class ExperimentResult:
    experiment: str
    title: str
    question: str
    setup: dict[str, Any]
    config_keys: tuple[str, ...]
    metrics: tuple[str, ...]
    rows: list[dict[str, Any]]
    summary: list[dict[str, Any]]
    timelines: dict[int, list[dict[str, float]]] = field(default_factory=dict)
    """Point index -> memory timeline (only for points planned with ``timeline``)."""
    plots: list[PlotRef] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    derived: dict[str, Any] = field(default_factory=dict)
    """What the module's ``derive`` computed after the rows (empty without one)."""

    @property
    def columns(self) -> list[str]:
        return [*self.config_keys, "seed", *self.metrics]

    def summary_for(self, **config: Any) -> dict[str, Any]:
        """The summary row whose configuration matches ``config`` (a subset of its keys)."""
        for s in self.summary:
            if all(s[k] == v for k, v in config.items()):
                return s
        raise KeyError(config)

    def to_dict(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "title": self.title,
            "question": self.question,
            "setup": self.setup,
            "columns": self.columns,
            "rows": self.rows,
            "summary_columns": stats.summary_columns(self.config_keys, self.metrics),
            "summary": self.summary,
            "plots": [{"file": p.file, "caption": p.caption} for p in self.plots],
            "findings": self.findings,
            "derived": self.derived,
        }

    def to_csv(self) -> str:
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=self.columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        return out.getvalue()


def seed_list(count: int) -> list[int]:
    """Seeds 0 .. count-1: explicit ints, each passed as the workload's seed."""
    return list(range(count))


def _timeline(steps: Sequence[Mapping[str, Any]], bins: int) -> list[dict[str, float]]:
    """The memory categories over time, averaged over equal time bins (duration-weighted)."""
    if not steps:
        return []
    start = float(steps[0]["start_time"])
    end = max(float(s["start_time"]) + float(s["duration"]) for s in steps)
    width = (end - start) / bins or 1.0
    sums = [dict.fromkeys(CATEGORIES, 0.0) for _ in range(bins)]
    weights = [0.0] * bins
    for s in steps:
        b = min(bins - 1, int((float(s["start_time"]) - start) / width))
        w = float(s["duration"]) or 1.0
        weights[b] += w
        capacity = sum(float(s[c]) for c in CATEGORIES)
        for c in CATEGORIES:
            sums[b][c] += w * float(s[c]) / capacity
    out = []
    for b in range(bins):
        if weights[b]:
            out.append(
                {
                    "time": start + (b + 0.5) * width,
                    **{c: sums[b][c] / weights[b] for c in CATEGORIES},
                }
            )
    return out


def measure(point: Point) -> tuple[dict[str, Any], list[dict[str, float]] | None]:
    """Run one point (in a worker process): its raw row, and its timeline when asked."""
    flat = {**point.flat, "seed": point.seed}
    if point.timeline:
        flat["trace_steps"] = True
    result = simulate(SimulationConfig.from_flat(flat))
    row = {**point.config, "seed": point.seed, **read_metrics(result.summary, point.metrics)}
    timeline = _timeline(result.steps, TIMELINE_BINS) if point.timeline else None
    return row, timeline


def run_plan(
    plan: Plan, *, workers: int | None = None, label: str | None = None
) -> tuple[list[dict[str, Any]], dict[int, list[dict[str, float]]]]:
    """Every point of the plan, rows in plan order; a failed point is an error naming it."""
    from pagedkv.sweep.pool import run_points

    rows: dict[int, dict[str, Any]] = {}
    timelines: dict[int, list[dict[str, float]]] = {}
    for outcome in run_points(measure, plan.points, workers=workers, progress=label):
        if outcome.error is not None or outcome.value is None:
            p = plan.points[outcome.index]
            raise PagedKVError(f"run {dict(p.config)} seed {p.seed} failed: {outcome.error}")
        row, timeline = outcome.value
        rows[outcome.index] = row
        if timeline is not None:
            timelines[outcome.index] = timeline
    return [rows[i] for i in range(len(plan.points))], timelines


def run_experiment(
    module: ModuleType,
    *,
    quick: bool = False,
    seeds: int | None = None,
    out: Path | None = None,
    workers: int | None = None,
    cost_model: str | None = None,
    profile: str | None = None,
) -> ExperimentResult:
    """Plan, run, summarize, plot and (with ``out``) write one experiment; ``cost_model`` and
    ``profile`` replace its clock (``setups.with_clock``)."""
    from pagedkv.experiments.setups import with_clock

    if seeds is not None:
        check_int("seeds", seeds, 3)  # an interval needs stats.MIN_N seeds
    count = seeds if seeds is not None else (QUICK_SEEDS if quick else DEFAULT_SEEDS)
    plan: Plan = with_clock(module.plan(quick, seed_list(count)), cost_model, profile)
    rows, timelines = run_plan(plan, workers=workers, label=module.NAME)
    result = ExperimentResult(
        experiment=module.NAME,
        title=module.TITLE,
        question=module.QUESTION,
        setup={**plan.setup, "seeds": seed_list(count), "quick": quick},
        config_keys=plan.config_keys,
        metrics=plan.metrics,
        rows=rows,
        summary=stats.summarize(
            rows, plan.config_keys, plan.metrics, {m: bounds(m) for m in plan.metrics}
        ),
        timelines=timelines,
    )
    derive = getattr(module, "derive", None)
    if derive is not None:
        result.derived = derive(result, quick=quick, workers=workers)
    result.findings = list(module.findings(result))
    if out is not None:
        with output_set():  # the plots and the results appear together, or none
            result.plots = list(module.plot(result, out))
            write_results(result, out)
    return result


def write_results(result: ExperimentResult, out: Path) -> None:
    """results.csv, then results.json last: a directory with results.json is complete."""
    atomic_write_text(out / "results.csv", result.to_csv())
    atomic_write_json(out / "results.json", result.to_dict())


def paired_ratio(
    result: ExperimentResult, metric: str, top: Mapping[str, Any], bottom: Mapping[str, Any]
) -> stats.MeanCI:
    """Per seed, ``metric`` of the ``top`` configuration over the ``bottom`` one's, then the
    mean and interval over seeds: pairing by seed removes the workload's own spread (both runs
    of a seed serve the same requests)."""

    def per_seed(key: Mapping[str, Any]) -> dict[int, float]:
        return {
            r["seed"]: r[metric]
            for r in result.rows
            if all(r[k] == v for k, v in key.items()) and r[metric] is not None
        }

    a, b = per_seed(top), per_seed(bottom)
    return stats.mean_ci(a[s] / b[s] for s in a if b.get(s))


def fmt_ci(ci: stats.MeanCI, digits: int = 3) -> str:
    """'1.23 [1.1, 1.4]' for a ``MeanCI``."""
    if ci.mean is None:
        return "n/a"
    if ci.low is None or ci.high is None:
        return f"{ci.mean:.{digits}g}"
    return f"{ci.mean:.{digits}g} [{ci.low:.{digits}g}, {ci.high:.{digits}g}]"


def fmt(s: Mapping[str, Any], metric: str, digits: int = 3) -> str:
    """'0.123 [0.120, 0.126]': a summary's mean and 95% interval, for findings."""
    m, lo, hi = s[f"{metric}_mean"], s[f"{metric}_ci_low"], s[f"{metric}_ci_high"]
    if m is None:
        return "n/a"
    if lo is None or hi is None:
        return f"{m:.{digits}g}"
    return f"{m:.{digits}g} [{lo:.{digits}g}, {hi:.{digits}g}]"

"""``rate-latency``: normalized latency against request rate for vllm and the paper's
baselines (the vLLM paper's Fig. 12), the highest rate each sustains, and the mean batch size at
the paper's rates (Fig. 13).

A policy *sustains* a rate when its mean normalized latency (end-to-end latency / output
tokens, the paper's y-axis) stays under ``THRESHOLD``. The sustained rate is found per seed by
bisection on the rate (``pagedkv.sweep.bisect.RateSearch``, the capacity planner's search:
geometric midpoints between the highest rate that passed and the lowest that failed) until they
are within a relative ``TOLERANCE``; so it carries an interval over seeds like every other
figure, and a ratio of two sustained rates is known to about twice the tolerance. The latency
curves themselves are measured on a fixed grid (``RATES``), for the plot.

The threshold sits where the curves turn up: several times vllm's unloaded latency (the
findings report it, at the grid's lowest rate), far below an overloaded queue's (seconds per
token). With a finite run (``REQUESTS``) an overloaded queue stays finite, so latency past the
knee grows with the run's length: the sustained rate is the robust figure.

Needs a time model: rates, latencies and batch sizes at a rate are in simulated seconds of the
roofline cost model (``setups.COST_MODEL``), not measured on a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pagedkv.experiments import setups
from pagedkv.experiments.framework import (
    ExperimentResult,
    Plan,
    PlotRef,
    Point,
    fmt,
    fmt_ci,
    run_plan,
)
from pagedkv.report import plots, stats
from pagedkv.sweep.bisect import RateSearch

NAME = "rate-latency"
TITLE = "Request rate against latency"
QUESTION = (
    "How does normalized latency grow with the request rate for vllm, Orca (Oracle, Pow2, "
    "Max) and static batching, which rate does each sustain, and how large are its batches at "
    "the paper's rates?"
)
SCHEDULERS = ("vllm", "orca-oracle", "orca-pow2", "orca-max", "static")
RATES = {
    "sharegpt-like": (0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0),
    "alpaca-like": (2.0, 4.0, 8.0, 16.0, 30.0, 48.0, 64.0, 96.0, 128.0),
}
"""The latency curves' grid (requests/s), for the plot; it holds the batch-size rates, and its
runs give each bisection its first bracket."""
QUICK_RATES = {"sharegpt-like": (0.5, 2.0), "alpaca-like": (4.0, 30.0)}
BATCH_RATE = {"sharegpt-like": 2.0, "alpaca-like": 30.0}
"""The rates of the batch-size comparison: the vLLM paper's Fig. 13 ("Average number of
batched requests when serving OPT-13B for the ShareGPT (2 reqs/s) and Alpaca (30 reqs/s)
traces")."""
PAPER_BATCH = {
    "sharegpt-like": {"orca-max": 7.00, "orca-pow2": 9.81, "orca-oracle": 13.62, "vllm": 30.42},
    "alpaca-like": {"orca-max": 7.00, "orca-pow2": 43.24, "orca-oracle": 72.75, "vllm": 132.44},
}
"""Fig. 13's bars (OPT-13B; the values printed on them), reported beside ours."""
SEARCH = {"sharegpt-like": (0.05, 20.0), "alpaca-like": (0.5, 500.0)}
"""(low, high) requests/s of the bisection: wide enough that every policy fails at the top and
passes at the bottom (a rate passing at the top is reported as a lower bound)."""
TOLERANCE, QUICK_TOLERANCE = 0.02, 0.1
"""Relative: the search stops when failed / passed <= 1 + tolerance."""
THRESHOLD = 0.1
"""Mean normalized latency (s/token) a sustained rate must stay under."""
REQUESTS = {"sharegpt-like": 400, "alpaca-like": 1000}
"""Per run. A finite run bounds an overloaded queue, so its latency stops growing: Alpaca's
short requests need more of them for the queue to push latency past the threshold."""
QUICK_REQUESTS = 150
"""Quick runs still need a queue to build past the knee: fewer requests pass at any rate."""
METRICS = ("norm_latency_mean", "norm_latency_p99", "mean_batch_size", "request_throughput")
TIME_MODEL = setups.time_model(
    "rates, latencies, sustained rates and batch sizes at a rate are simulated seconds"
)


def _requests(quick: bool) -> dict[str, int]:
    return dict.fromkeys(setups.WORKLOADS, QUICK_REQUESTS) if quick else REQUESTS


def _point(workload: str, scheduler: str, rate: float, seed: int, n: int) -> Point:
    return Point(
        {"workload": workload, "scheduler": scheduler, "request_rate": rate},
        seed,
        setups.flat(workload, n, rate, scheduler=scheduler),
        METRICS,
    )


def plan(quick: bool, seeds: Sequence[int]) -> Plan:
    n = _requests(quick)
    grid = QUICK_RATES if quick else RATES
    points = [
        _point(wl, sched, rate, seed, n[wl])
        for wl in setups.WORKLOADS
        for sched in SCHEDULERS
        for rate in grid[wl]
        for seed in seeds
    ]
    setup = setups.setup(
        block_size=16,
        num_requests=n,
        arrival="poisson",
        request_rates={k: list(v) for k, v in grid.items()},
        batch_size_rate=BATCH_RATE,
        sustain_threshold_s_per_token=THRESHOLD,
        sustained_rate_search={
            "bounds": {k: list(v) for k, v in SEARCH.items()},
            "relative_tolerance": QUICK_TOLERANCE if quick else TOLERANCE,
            "method": "bisection, geometric midpoints (pagedkv.sweep.bisect.RateSearch)",
        },
        time_model=TIME_MODEL,
    )
    return Plan(setup, ("workload", "scheduler", "request_rate"), METRICS, points)


def _passes(row: dict[str, Any]) -> bool:
    latency = row["norm_latency_mean"]
    return latency is not None and latency <= THRESHOLD


def derive(result: ExperimentResult, *, quick: bool, workers: int | None) -> dict[str, Any]:
    """Per (workload, scheduler, seed), the sustained rate by bisection from the grid's bracket
    (``_bracket``): every search advances one probe per round, a round's probes in parallel."""
    n = _requests(quick)
    tolerance = QUICK_TOLERANCE if quick else TOLERANCE
    keys = [
        (wl, sched, seed)
        for wl in setups.WORKLOADS
        for sched in SCHEDULERS
        for seed in result.setup["seeds"]
    ]
    searches = {k: _bracket(result, *k, tolerance) for k in keys}
    while True:
        todo = [(k, r) for k, s in searches.items() if (r := s.next_rate()) is not None]
        if not todo:
            break
        points = [_point(wl, sched, rate, seed, n[wl]) for (wl, sched, seed), rate in todo]
        plan = Plan({}, ("workload", "scheduler", "request_rate"), METRICS, points)
        rows, _ = run_plan(setups.clock_of(result, plan))  # the grid's clock
        for (key, rate), row in zip(todo, rows, strict=True):
            searches[key].record(rate, _passes(row))
    return {
        "sustained": [
            {
                "workload": wl,
                "scheduler": sched,
                "seed": seed,
                "rate": searches[(wl, sched, seed)].passed,
                "failed": searches[(wl, sched, seed)].failed,
                "capped": searches[(wl, sched, seed)].capped,
                "probes": len(searches[(wl, sched, seed)].probes),
            }
            for wl, sched, seed in keys
        ],
        "relative_tolerance": tolerance,
    }


def _bracket(
    result: ExperimentResult, workload: str, scheduler: str, seed: int, tolerance: float
) -> RateSearch:
    """A search started from the grid's runs of the same configuration and seed (the same
    simulations a probe would run): between the highest grid rate that passes and the lowest
    above it that fails; the search's own bounds where the grid has no such rate."""
    grid = sorted(
        (r["request_rate"], _passes(r))
        for r in result.rows
        if r["workload"] == workload and r["scheduler"] == scheduler and r["seed"] == seed
    )
    low, high = SEARCH[workload]
    passed = [rate for rate, ok in grid if ok]
    if not passed:  # fails everywhere on the grid: probe from the search's low
        return RateSearch(low, min([high, *(rate for rate, _ in grid)]), tolerance)
    top = max(passed)
    failed = [rate for rate, ok in grid if not ok and rate > top]
    search = RateSearch(top, min(failed) if failed else high, tolerance)
    search.record(top, True)
    if failed:
        search.record(min(failed), False)
    return search


def _searches(result: ExperimentResult, workload: str, scheduler: str) -> list[dict[str, Any]]:
    return [
        s
        for s in result.derived.get("sustained", [])
        if s["workload"] == workload and s["scheduler"] == scheduler
    ]


def sustained(result: ExperimentResult, workload: str, scheduler: str) -> dict[int, float | None]:
    """Seed -> the sustained rate (requests/s) found by bisection; None: not even the search's
    lowest rate passed."""
    return {s["seed"]: s["rate"] for s in _searches(result, workload, scheduler)}


def at_top(result: ExperimentResult, workload: str, scheduler: str) -> bool:
    """Whether some seed still passed at the search's top rate: its sustained rate is then only
    a lower bound."""
    return any(s["capped"] for s in _searches(result, workload, scheduler))


def sustained_ci(result: ExperimentResult, workload: str, scheduler: str) -> stats.MeanCI:
    return stats.mean_ci(sustained(result, workload, scheduler).values())


def sustained_ratio(
    result: ExperimentResult, workload: str, scheduler: str, baseline: str
) -> stats.MeanCI:
    """Per seed, scheduler's sustained rate / baseline's. Seeds are left out where the ratio is
    unknown: the baseline passes no rate of the search (unbounded) or its top (censored)."""
    a = sustained(result, workload, scheduler)
    capped = {s["seed"] for s in _searches(result, workload, baseline) if s["capped"]}
    b = sustained(result, workload, baseline)
    return stats.mean_ci(
        x / y for seed, x in a.items() if x and (y := b.get(seed)) and seed not in capped
    )


def batch_ratio(
    result: ExperimentResult, workload: str, scheduler: str, baseline: str
) -> stats.MeanCI:
    """Per seed, the mean batch size of ``scheduler`` over ``baseline``'s at the paper's rate
    (Fig. 13), when that rate was measured (else an empty interval)."""
    from pagedkv.experiments.framework import paired_ratio

    rate = BATCH_RATE[workload]
    if not any(r["workload"] == workload and r["request_rate"] == rate for r in result.rows):
        return stats.MeanCI(None, None, None, 0)
    key = {"workload": workload, "request_rate": rate}
    return paired_ratio(
        result, "mean_batch_size", {**key, "scheduler": scheduler}, {**key, "scheduler": baseline}
    )


def plot(result: ExperimentResult, out: Path) -> list[PlotRef]:
    refs = []
    fig, axes = plots.figure(2, width=5.5, height=4.2)
    for ax, wl in zip(axes, setups.WORKLOADS, strict=True):
        rows = [s for s in result.summary if s["workload"] == wl]
        plots.summary_lines(ax, rows, "request_rate", "scheduler", "norm_latency_mean")
        ax.axhline(THRESHOLD, color="grey", linestyle="--", linewidth=1)
        ax.set_yscale("log")
        plots.label(ax, "request rate (requests/s)", "mean normalized latency (s/token)", wl)
    plots.save_png(fig, out / "latency.png")
    refs.append(
        PlotRef(
            "latency.png",
            "Mean normalized latency against request rate (mean and 95% CI band over seeds; "
            f"log scale); dashed: the {THRESHOLD} s/token threshold of a sustained rate.",
        )
    )
    fig, axes = plots.figure(2, width=5.0, height=4.0)
    for ax, wl in zip(axes, setups.WORKLOADS, strict=True):
        cis = [sustained_ci(result, wl, s) for s in SCHEDULERS]
        plots.bars_ci(
            ax, SCHEDULERS, [c.mean for c in cis], [c.low for c in cis], [c.high for c in cis]
        )
        plots.label(ax, "scheduler", f"sustained rate (requests/s, < {THRESHOLD} s/token)", wl)
    plots.save_png(fig, out / "sustained.png")
    refs.append(
        PlotRef(
            "sustained.png",
            "The highest request rate each policy serves under the latency threshold, found "
            "by bisection on the rate (per seed; mean and 95% CI).",
        )
    )
    fig, axes = plots.figure(2, width=5.0, height=4.0)
    for ax, wl in zip(axes, setups.WORKLOADS, strict=True):
        rate = _batch_rate(result, wl)
        rows = [result.summary_for(workload=wl, scheduler=s, request_rate=rate) for s in SCHEDULERS]
        plots.bars_ci(
            ax,
            SCHEDULERS,
            [r["mean_batch_size_mean"] for r in rows],
            [r["mean_batch_size_ci_low"] for r in rows],
            [r["mean_batch_size_ci_high"] for r in rows],
        )
        plots.label(ax, "scheduler", "mean batch size (requests)", f"{wl} at {rate:g} requests/s")
    plots.save_png(fig, out / "batch_size.png")
    refs.append(
        PlotRef(
            "batch_size.png",
            "Mean batch size (requests per iteration) at the vLLM paper's Fig. 13 rates (2 "
            "req/s ShareGPT, 30 req/s Alpaca; mean and 95% CI).",
        )
    )
    return refs


def _batch_rate(result: ExperimentResult, workload: str) -> Any:
    rates = sorted({s["request_rate"] for s in result.summary if s["workload"] == workload})
    want = BATCH_RATE[workload]
    return want if want in rates else rates[len(rates) // 2]


def findings(result: ExperimentResult) -> list[str]:
    out = []
    tol = result.derived.get("relative_tolerance")
    for wl in setups.WORKLOADS:
        parts = []
        for sched in SCHEDULERS:
            ci = sustained_ci(result, wl, sched)
            censored = " (the search's top: a lower bound)" if at_top(result, wl, sched) else ""
            parts.append(f"{sched} {fmt_ci(ci)}{censored}")
        out.append(
            f"{wl}: sustained rate (requests/s, bisection to a relative {tol}) "
            + ", ".join(parts)
            + "."
        )
        low = min(r["request_rate"] for r in result.rows if r["workload"] == wl)
        unloaded = result.summary_for(workload=wl, scheduler="vllm", request_rate=low)
        out.append(
            f"{wl}: vllm's mean normalized latency at {low:g} requests/s "
            f"{fmt(unloaded, 'norm_latency_mean')} s/token (the threshold: {THRESHOLD})."
        )
        rate = _batch_rate(result, wl)
        rows = [result.summary_for(workload=wl, scheduler=s, request_rate=rate) for s in SCHEDULERS]
        batch = [
            f"{s} {fmt(r, 'mean_batch_size')}"
            + (f" (paper {PAPER_BATCH[wl][s]:g})" if s in PAPER_BATCH[wl] else "")
            for s, r in zip(SCHEDULERS, rows, strict=True)
        ]
        out.append(f"{wl} at {rate:g} requests/s: mean batch size " + ", ".join(batch) + ".")
    out.append(TIME_MODEL + ".")
    return out

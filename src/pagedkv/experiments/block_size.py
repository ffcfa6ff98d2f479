"""``block-size``: what the block size changes, on both workloads (the seed simulator's sweep;
the vLLM paper's Fig. 18b).

Smaller blocks waste less of a sequence's last block (internal fragmentation) but a block
table holds more entries; larger blocks round every sequence up further, so fewer requests fit
and more are preempted. The raw columns only: the seed simulator's weighted "score" mixed two
units and is not reproduced.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pagedkv.experiments import setups
from pagedkv.experiments.framework import ExperimentResult, Plan, PlotRef, Point
from pagedkv.experiments.metrics import axis_label
from pagedkv.report import plots
from pagedkv.report.compare import Candidate, best
from pagedkv.report.stats import MeanCI

NAME = "block-size"
TITLE = "Block size"
QUESTION = (
    "Which block size serves best: how do preemptions, internal fragmentation, batch size, "
    "throughput and tail latency change from 1 to 256 tokens per block?"
)
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
QUICK_BLOCK_SIZES = (4, 16, 64, 256)
RATES = {"sharegpt-like": 2.0, "alpaca-like": 48.0}
"""Slightly above the throughput vllm sustains at block size 16 under the roofline (OPT-13B on
an A100-40GB, ``REQUESTS`` per run: it levels off near 1.8/s and 35/s however fast requests
arrive), so memory binds at every block size: requests queue for blocks and are preempted,
and the paged kernel's per-block cost and the fragmentation of large blocks both show."""
REQUESTS = {"sharegpt-like": 400, "alpaca-like": 1000}
"""Alpaca's short requests need more of them for a queue to build: 400 at 48/s never preempt."""
QUICK_REQUESTS = 40
METRICS = (
    "preemptions",
    "internal_fragmentation",
    "mean_batch_size",
    "request_throughput",
    "norm_latency_p99",
    "token_utilization",
)
PLOTTED = (
    "preemptions",
    "internal_fragmentation",
    "mean_batch_size",
    "request_throughput",
    "norm_latency_p99",
)


def plan(quick: bool, seeds: Sequence[int]) -> Plan:
    n = dict.fromkeys(setups.WORKLOADS, QUICK_REQUESTS) if quick else REQUESTS
    sizes = QUICK_BLOCK_SIZES if quick else BLOCK_SIZES
    points = [
        Point(
            {"workload": wl, "block_size": bs},
            seed,
            setups.flat(wl, n[wl], RATES[wl], scheduler="vllm", block_size=bs),
            METRICS,
        )
        for wl in setups.WORKLOADS
        for bs in sizes
        for seed in seeds
    ]
    setup = setups.setup(
        scheduler="vllm (recompute)",
        num_requests=n,
        request_rates=RATES,
        arrival="poisson",
        block_sizes=list(sizes),
        capacity="the blocks OPT-13B leaves on an A100-40GB at each block size (~15.6K slots)",
    )
    return Plan(setup, ("workload", "block_size"), METRICS, points)


def plot(result: ExperimentResult, out: Path) -> list[PlotRef]:
    # the workloads' throughputs differ ~10x (their rates do): such a metric gets a panel
    # per workload, so that the smaller is not drawn flat along the axis
    panels = plots.panels_by_scale(result.summary, "workload", PLOTTED)
    fig, axes = plots.figure(len(panels), width=4.0, height=3.6)
    for ax, (metric, workloads) in zip(axes, panels, strict=True):
        plots.summary_lines(
            ax, result.summary, "block_size", "workload", metric, log_x=True, only=workloads
        )
        title = workloads[0] if len(workloads) == 1 else ""
        plots.label(ax, "block size (tokens)", axis_label(metric), title)
    plots.save_png(fig, out / "block_size.png")
    return [
        PlotRef(
            "block_size.png",
            "Block size against preemptions, internal fragmentation, mean batch size, "
            "throughput and p99 normalized latency (vllm; mean and 95% CI band over seeds).",
        )
    ]


def candidates(result: ExperimentResult, workload: str, metric: str) -> list[Candidate]:
    """Each block size's mean ``metric`` and interval on ``workload``."""
    return [
        Candidate(
            f"block size {s['block_size']}",
            MeanCI(s[f"{metric}_mean"], s[f"{metric}_ci_low"], s[f"{metric}_ci_high"], s["n"]),
        )
        for s in result.summary
        if s["workload"] == workload
    ]


def findings(result: ExperimentResult) -> list[str]:
    """Per workload, the best block size for throughput and for tail latency, named only where
    its interval is clear of the others' (``pagedkv.report.compare.best``)."""
    out = []
    for wl in setups.WORKLOADS:
        throughput = best(
            candidates(result, wl, "request_throughput"),
            higher=True,
            what=f"{wl}, request throughput",
            unit="requests/s",
        )
        tail = best(
            candidates(result, wl, "norm_latency_p99"),
            higher=False,
            what=f"{wl}, p99 normalized latency",
            unit="s/token",
        )
        out += [throughput, tail]
    return out

"""``preemption``: recompute against swap, across block sizes (the vLLM paper's Fig. 19).

vllm preempts the latest-arrived request when a running one needs a block and none is free:
either its blocks are dropped and its tokens prefilled again later (recompute), or they move
to the CPU pool and back (swap; vLLM's 4 GiB of swap space). Small blocks make swapping many
small transfers; recompute's cost does not depend on the block size. Arrivals slightly exceed
what vllm serves, so preemption happens.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pagedkv.experiments import setups
from pagedkv.experiments.framework import (
    ExperimentResult,
    Plan,
    PlotRef,
    Point,
    fmt,
    fmt_ci,
    paired_ratio,
)
from pagedkv.experiments.metrics import axis_label
from pagedkv.report import plots

NAME = "preemption"
TITLE = "Preemption: recompute against swap"
QUESTION = (
    "Which preemption mode serves better, recompute or swap, and how does that depend on the "
    "block size?"
)
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
QUICK_BLOCK_SIZES = (4, 64)
MODES = ("recompute", "swap")
WORKLOAD, RATE = "sharegpt-like", 2.0
"""Slightly above the ~1.8 requests/s vllm sustains at block size 16 under the roofline
(OPT-13B, A100-40GB): memory binds, a run preempts about half its requests, so each mode's
cost (2 x layers copies per swapped block; a prefill per recompute) shows."""
REQUESTS, QUICK_REQUESTS = 400, 40
METRICS = (
    "e2e_mean",
    "norm_latency_mean",
    "request_throughput",
    "preemptions",
    "swap_outs",
    "recomputed_tokens",
)
PLOTTED = ("e2e_mean", "request_throughput", "preemptions")


def plan(quick: bool, seeds: Sequence[int]) -> Plan:
    n = QUICK_REQUESTS if quick else REQUESTS
    sizes = QUICK_BLOCK_SIZES if quick else BLOCK_SIZES
    points = [
        Point(
            {"preemption_mode": mode, "block_size": bs},
            seed,
            setups.flat(WORKLOAD, n, RATE, scheduler="vllm", block_size=bs, preemption_mode=mode),
            METRICS,
        )
        for mode in MODES
        for bs in sizes
        for seed in seeds
    ]
    setup = setups.setup(
        scheduler="vllm",
        workload=WORKLOAD,
        num_requests=n,
        request_rate=RATE,
        arrival="poisson",
        block_sizes=list(sizes),
        swap_space_gib=4.0,
    )
    return Plan(setup, ("preemption_mode", "block_size"), METRICS, points)


def plot(result: ExperimentResult, out: Path) -> list[PlotRef]:
    fig, axes = plots.figure(len(PLOTTED), width=4.3, height=3.6)
    for ax, metric in zip(axes, PLOTTED, strict=True):
        plots.summary_lines(ax, result.summary, "block_size", "preemption_mode", metric, log_x=True)
        plots.label(ax, "block size (tokens)", axis_label(metric))
    plots.save_png(fig, out / "preemption.png")
    return [
        PlotRef(
            "preemption.png",
            f"Recompute against swap across block sizes ({WORKLOAD} at {RATE:g} requests/s): "
            "mean end-to-end latency, throughput and preemptions (mean and 95% CI band).",
        )
    ]


def findings(result: ExperimentResult) -> list[str]:
    out = []
    for bs in sorted({s["block_size"] for s in result.summary}):
        r = result.summary_for(preemption_mode="recompute", block_size=bs)
        s = result.summary_for(preemption_mode="swap", block_size=bs)
        ratio = paired_ratio(
            result,
            "e2e_mean",
            {"preemption_mode": "swap", "block_size": bs},
            {"preemption_mode": "recompute", "block_size": bs},
        )
        out.append(
            f"block size {bs}: mean end-to-end latency recompute {fmt(r, 'e2e_mean')} s, "
            f"swap {fmt(s, 'e2e_mean')} s; swap / recompute per seed {fmt_ci(ratio)}."
        )
    return out

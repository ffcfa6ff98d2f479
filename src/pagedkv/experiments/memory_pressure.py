"""``memory-pressure``: the KV budget against concurrency, throughput and tail latency, paged
against contiguous (the seed simulator's memory table).

The budget is set in blocks of 16 (256 .. 4096) and also given in GB for OPT-13B (800 KB of
K/V per token). Every request arrives at t = 0, so the queue is full from the start and the
budget alone limits how many run at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pagedkv.experiments import setups
from pagedkv.experiments.framework import ExperimentResult, Plan, PlotRef, Point, fmt
from pagedkv.experiments.metrics import axis_label
from pagedkv.models.models import get_model
from pagedkv.report import plots

NAME = "memory-pressure"
TITLE = "Memory pressure"
QUESTION = (
    "How do max concurrency, throughput and p99 latency grow with the KV budget (256 to 4096 "
    "blocks), for paged memory and contiguous reservations?"
)
BUDGETS = (256, 512, 1024, 2048, 4096)
QUICK_BUDGETS = (256, 1024, 4096)
SCHEDULERS = ("vllm", "orca-oracle", "orca-max")
REQUESTS, QUICK_REQUESTS = 400, 60
METRICS = (
    "max_running",
    "mean_running",
    "request_throughput",
    "norm_latency_p99",
    "token_utilization",
    "preemptions",
)
PLOTTED = ("max_running", "request_throughput", "norm_latency_p99")
WORKLOAD = "sharegpt-like"


def kv_gb(blocks: int, block_size: int = 16) -> float:
    """The budget in GB (10^9 bytes) of OPT-13B K/V."""
    return round(blocks * block_size * get_model(setups.MODEL).kv_bytes_per_token / 1e9, 3)


def plan(quick: bool, seeds: Sequence[int]) -> Plan:
    n = QUICK_REQUESTS if quick else REQUESTS
    budgets = QUICK_BUDGETS if quick else BUDGETS
    points = [
        Point(
            {"scheduler": sched, "num_gpu_blocks": blocks, "kv_gb": kv_gb(blocks)},
            seed,
            setups.flat(WORKLOAD, n, None, scheduler=sched, num_gpu_blocks=blocks),
            METRICS,
        )
        for sched in SCHEDULERS
        for blocks in budgets
        for seed in seeds
    ]
    setup = setups.setup(
        workload=WORKLOAD,
        num_requests=n,
        arrival="all at t = 0",
        block_size=16,
        budgets_blocks=list(budgets),
        kv_bytes_per_token=get_model(setups.MODEL).kv_bytes_per_token,
    )
    return Plan(setup, ("scheduler", "num_gpu_blocks", "kv_gb"), METRICS, points)


def plot(result: ExperimentResult, out: Path) -> list[PlotRef]:
    fig, axes = plots.figure(len(PLOTTED), width=4.3, height=3.6)
    for ax, metric in zip(axes, PLOTTED, strict=True):
        plots.summary_lines(
            ax, result.summary, "num_gpu_blocks", "scheduler", metric, band=False, log_x=True
        )
        plots.label(ax, "KV budget (blocks of 16 tokens)", axis_label(metric))
    plots.save_png(fig, out / "memory_pressure.png")
    return [
        PlotRef(
            "memory_pressure.png",
            "KV budget against max concurrency, throughput and p99 normalized latency "
            f"({WORKLOAD}, all requests at t = 0; mean and 95% CI over seeds). 256 blocks = "
            f"{kv_gb(256)} GB, 4096 = {kv_gb(4096)} GB of OPT-13B K/V.",
        )
    ]


def findings(result: ExperimentResult) -> list[str]:
    budgets = sorted({s["num_gpu_blocks"] for s in result.summary})
    lo, hi = budgets[0], budgets[-1]
    out = []
    for sched in SCHEDULERS:
        a = result.summary_for(scheduler=sched, num_gpu_blocks=lo)
        b = result.summary_for(scheduler=sched, num_gpu_blocks=hi)
        out.append(
            f"{sched}: max concurrency {fmt(a, 'max_running')} at {lo} blocks -> "
            f"{fmt(b, 'max_running')} at {hi}; throughput {fmt(a, 'request_throughput')} -> "
            f"{fmt(b, 'request_throughput')} requests/s."
        )
    return out

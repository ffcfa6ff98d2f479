"""``fragmentation``: where the KV memory goes, paged against every contiguous variant.

The five categories of DESIGN.md (the vLLM paper's Fig. 2): token states, reservation,
internal and external fragmentation, free, each a share of the capacity C, time-averaged over
the run, and over time for one seed. Every variant gets the same capacity (the OPT-13B /
A100-40GB KV pool). Arrivals outpace every policy's service rate, so requests keep waiting and
memory that cannot be used counts as external fragmentation (the seed simulator's
utilization / fragmentation table, done per category).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pagedkv.experiments import setups
from pagedkv.experiments.framework import ExperimentResult, Plan, PlotRef, Point, fmt
from pagedkv.experiments.metrics import CATEGORIES
from pagedkv.experiments.variants import CONTIGUOUS_VARIANTS
from pagedkv.report import plots

NAME = "fragmentation"
TITLE = "Fragmentation: where the KV memory goes"
QUESTION = (
    "At equal capacity, under load that keeps requests waiting, what share of the KV memory "
    "holds token states, and how much is reservation, internal or external fragmentation, for "
    "paged memory and every contiguous variant?"
)
SCHEDULERS = ("vllm", *CONTIGUOUS_VARIANTS)
RATES = {"sharegpt-like": 4.0, "alpaca-like": 40.0}
"""Poisson rates about twice what vllm serves on each workload (~1.7/s and ~16/s measured):
every policy has a queue."""
REQUESTS, QUICK_REQUESTS = 400, 40
METRICS = (
    *CATEGORIES,
    "token_utilization",
    "pool_occupancy",
    "waste",
    "max_running",
    "request_throughput",
)
TIMELINE_SCHEDULERS = ("vllm", "orca-max", "orca-oracle")


def plan(quick: bool, seeds: Sequence[int]) -> Plan:
    n = QUICK_REQUESTS if quick else REQUESTS
    points = [
        Point(
            {"workload": wl, "scheduler": sched},
            seed,
            setups.flat(wl, n, RATES[wl], scheduler=sched),
            METRICS,
            timeline=seed == seeds[0] and sched in TIMELINE_SCHEDULERS,
        )
        for wl in setups.WORKLOADS
        for sched in SCHEDULERS
        for seed in seeds
    ]
    setup = setups.setup(
        block_size=16,
        num_requests=n,
        request_rates=RATES,
        arrival="poisson",
        capacity="the OPT-13B / A100-40GB KV pool, equal for every scheduler",
    )
    return Plan(setup, ("workload", "scheduler"), METRICS, points)


def plot(result: ExperimentResult, out: Path) -> list[PlotRef]:
    refs = []
    fig, axes = plots.figure(2, width=6.5, height=4.5)
    for ax, wl in zip(axes, setups.WORKLOADS, strict=True):
        rows = [s for s in result.summary if s["workload"] == wl]
        names = [s["scheduler"] for s in rows]
        bottom = [0.0] * len(rows)
        for cat in CATEGORIES:
            means = [s[f"{cat}_mean"] or 0.0 for s in rows]
            err = [
                [
                    m - (s[f"{cat}_ci_low"] if s[f"{cat}_ci_low"] is not None else m)
                    for m, s in zip(means, rows, strict=True)
                ],
                [
                    (s[f"{cat}_ci_high"] if s[f"{cat}_ci_high"] is not None else m) - m
                    for m, s in zip(means, rows, strict=True)
                ],
            ]
            ax.bar(
                range(len(rows)),
                means,
                bottom=bottom,
                yerr=err,
                capsize=2,
                label=cat.replace("_", " "),
            )
            bottom = [b + m for b, m in zip(bottom, means, strict=True)]
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(names, rotation=30, ha="right")
        plots.label(ax, "scheduler (memory manager)", "share of KV capacity C", wl)
    axes[0].legend(fontsize=7, loc="lower left")
    plots.save_png(fig, out / "categories.png")
    refs.append(
        PlotRef(
            "categories.png",
            "Time-averaged memory categories (share of capacity; mean over seeds, error bars: "
            "95% CI of each category), paged (vllm) against every contiguous variant.",
        )
    )
    fig, axes = plots.figure(1, width=8)
    width = 0.4
    for k, wl in enumerate(setups.WORKLOADS):
        rows = [s for s in result.summary if s["workload"] == wl]
        plots.bars_ci(
            axes[0],
            [s["scheduler"] for s in rows],
            [s["token_utilization_mean"] for s in rows],
            [s["token_utilization_ci_low"] for s in rows],
            [s["token_utilization_ci_high"] for s in rows],
            offset=(k - 0.5) * width,
            width=width,
            label_=wl,
        )
    axes[0].legend()
    plots.label(
        axes[0], "scheduler (memory manager)", "token utilization (token states / allocated)"
    )
    plots.save_png(fig, out / "utilization.png")
    refs.append(
        PlotRef(
            "utilization.png",
            "Token utilization (token states / allocated slots), mean and 95% CI over seeds.",
        )
    )
    if result.timelines:
        fig, axes = plots.figure(len(TIMELINE_SCHEDULERS), width=4.5, height=3.6)
        wl = setups.WORKLOADS[0]
        for ax, sched in zip(axes, TIMELINE_SCHEDULERS, strict=True):
            index = next(
                i
                for i in result.timelines
                if result.rows[i]["workload"] == wl and result.rows[i]["scheduler"] == sched
            )
            tl = result.timelines[index]
            ax.stackplot(
                [p["time"] for p in tl],
                *[[p[c] for p in tl] for c in CATEGORIES],
                labels=[c.replace("_", " ") for c in CATEGORIES],
            )
            plots.label(ax, "simulated time (s)", "share of KV capacity C", f"{sched}, {wl}")
        axes[0].legend(fontsize=7, loc="lower right")
        plots.save_png(fig, out / "timeline.png")
        refs.append(
            PlotRef(
                "timeline.png",
                f"The memory categories over time on {wl} (one seed, {result.setup['seeds'][0]}; "
                "time-binned): paged against Orca Max and Oracle.",
            )
        )
    return refs


def findings(result: ExperimentResult) -> list[str]:
    out = []
    for wl in setups.WORKLOADS:
        paged = result.summary_for(workload=wl, scheduler="vllm")
        parts = [
            f"{s['scheduler']} {fmt(s, 'token_utilization', 2)}"
            for s in result.summary
            if s["workload"] == wl and s["scheduler"] != "vllm"
        ]
        out.append(
            f"{wl}: paged token utilization {fmt(paged, 'token_utilization', 3)}, waste "
            f"(reservation + fragmentation) {fmt(paged, 'waste', 2)} of C; contiguous: "
            + ", ".join(parts)
            + "."
        )
    return out

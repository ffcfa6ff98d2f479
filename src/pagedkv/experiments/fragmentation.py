"""``fragmentation``: where the KV memory goes, paged against every contiguous variant.

The five categories of DESIGN.md (the vLLM paper's Fig. 2): token states, reservation,
internal and external fragmentation, free, each a share of the capacity C, time-averaged over
the run, and over time for one seed. Every variant gets the same capacity (the OPT-13B /
A100-40GB KV pool). Arrivals outpace every policy's service rate (``RATES``), so requests keep
waiting and memory that cannot be used counts as external fragmentation; the request counts
make the queued phase dominate the time average (the idle share ``free`` is reported).

Two accounting conventions for a buddy allocator's power-of-two rounding, side by side:

* **slot convention** (the five categories, DESIGN.md): a held slot never filled is internal
  fragmentation, whoever caused it; Orca (Oracle) then shows internal fragmentation;
* **allocator convention** (the paper's Fig. 2 and §3.1, "external fragmentation from the
  memory allocator like the buddy allocator"; its Orca (Oracle) shows 0% internal): only the
  reservation beyond the final length is internal, the rounding is external fragmentation
  (``*_allocator_convention``). The sums agree; only the split moves.

Needs a time model: the rates are requests per simulated second, the clock is the roofline
cost model (``setups.COST_MODEL``).
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
RATES = {"sharegpt-like": 4.0, "alpaca-like": 160.0}
"""Poisson rates (requests/s) above every policy's sustained rate on each workload (the
``rate-latency`` experiment's), vllm's included: every policy has a queue, memory binds."""
REQUESTS = {"sharegpt-like": 1000, "alpaca-like": 4000}
"""Per run: enough that the queued phase, not the ramp-up and the drain of a finite run,
dominates the time average (Alpaca's short requests drain fast, so it needs more)."""
QUICK_REQUESTS = 40
CONVENTION_METRICS = (
    "allocator_rounding",
    "internal_fragmentation_allocator_convention",
    "external_fragmentation_allocator_convention",
)
METRICS = (
    *CATEGORIES,
    *CONVENTION_METRICS,
    "token_utilization",
    "pool_occupancy",
    "waste",
    "waste_of_used",
    "waste_with_idle",
    "max_running",
    "request_throughput",
)
TIMELINE_SCHEDULERS = ("vllm", "orca-max", "orca-oracle")


def plan(quick: bool, seeds: Sequence[int]) -> Plan:
    n = dict.fromkeys(setups.WORKLOADS, QUICK_REQUESTS) if quick else REQUESTS
    points = [
        Point(
            {"workload": wl, "scheduler": sched},
            seed,
            setups.flat(wl, n[wl], RATES[wl], scheduler=sched),
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
        conventions={
            "slot": "every held slot never filled is internal fragmentation (the categories)",
            "allocator": "buddy rounding counted as external fragmentation, as the vLLM "
            "paper's Fig. 2 (*_allocator_convention)",
        },
        time_model=setups.time_model("the request rates are per simulated second"),
    )
    return Plan(setup, ("workload", "scheduler"), METRICS, points)


def _stacked(result: ExperimentResult, cats: Sequence[str], out: Path, name: str) -> None:
    fig, axes = plots.figure(2, width=6.5, height=4.5)
    for ax, wl in zip(axes, setups.WORKLOADS, strict=True):
        rows = [s for s in result.summary if s["workload"] == wl]
        names = [s["scheduler"] for s in rows]
        bottom = [0.0] * len(rows)
        for cat in cats:
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
                label=cat.replace("_allocator_convention", " (allocator conv.)").replace("_", " "),
            )
            bottom = [b + m for b, m in zip(bottom, means, strict=True)]
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(names, rotation=30, ha="right")
        plots.label(ax, "scheduler (memory manager)", "share of KV capacity C", wl)
    axes[0].legend(fontsize=7, loc="lower left")
    plots.save_png(fig, out / name)


ALLOCATOR_CATEGORIES = (
    "token_states",
    "reservation",
    "internal_fragmentation_allocator_convention",
    "external_fragmentation_allocator_convention",
    "free",
)


def plot(result: ExperimentResult, out: Path) -> list[PlotRef]:
    refs = []
    _stacked(result, CATEGORIES, out, "categories.png")
    refs.append(
        PlotRef(
            "categories.png",
            "Time-averaged memory categories, slot convention (buddy rounding counted as "
            "internal fragmentation): share of capacity; mean over seeds, error bars: 95% CI "
            "of each category; paged (vllm) against every contiguous variant.",
        )
    )
    _stacked(result, ALLOCATOR_CATEGORIES, out, "categories_allocator.png")
    refs.append(
        PlotRef(
            "categories_allocator.png",
            "The same, allocator convention (the vLLM paper's Fig. 2: buddy rounding counted "
            "as external fragmentation, so Orca (Oracle) has no internal fragmentation).",
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


def conventions_table(result: ExperimentResult, workload: str) -> list[list[str]]:
    """Rows (scheduler, token states, reservation, then internal / external fragmentation in
    the slot convention and in the allocator convention, free): the two splits side by side,
    each a time-averaged share of C (means over seeds)."""
    rows = []
    for s in result.summary:
        if s["workload"] != workload:
            continue
        cells = [
            "token_states",
            "reservation",
            "internal_fragmentation",
            "external_fragmentation",
            "internal_fragmentation_allocator_convention",
            "external_fragmentation_allocator_convention",
            "free",
        ]
        rows.append([s["scheduler"], *(f"{(s[f'{c}_mean'] or 0.0):.1%}" for c in cells)])
    return rows


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
            f"{wl} at {RATES[wl]:g} requests/s: paged token utilization "
            f"{fmt(paged, 'token_utilization', 3)}, waste (reservation + fragmentation) "
            f"{fmt(paged, 'waste', 2)} of C, {fmt(paged, 'waste_of_used', 2)} of the memory in "
            f"use, {fmt(paged, 'waste_with_idle', 2)} counting idle slots (idle "
            f"{fmt(paged, 'free', 2)}); contiguous token utilization: " + ", ".join(parts) + "."
        )
        split = "; ".join(
            f"{r[0]} internal {r[3]} / external {r[4]} (slot), {r[5]} / {r[6]} (allocator)"
            for r in conventions_table(result, wl)
            if r[0].startswith("orca")
        )
        out.append(
            f"{wl}: buddy rounding, slot convention against the paper's allocator convention "
            f"(share of C): {split}."
        )
    return out

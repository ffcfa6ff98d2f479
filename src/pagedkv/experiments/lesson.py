"""``lesson``: the course lesson's comparison, as it wrote it and at equal memory.

The lesson gave its contiguous allocator 5 slots of 256 tokens (80 blocks of 16) against paged
memory's 100 blocks, and its own loop never preempted. Here: the lesson's own setting, the same
at equal memory (100 blocks: 6 slots), the lesson's loop on paged memory (``greedy-nopreempt``:
it deadlocks) and vLLM's policy (preemption by recompute). Unit clock: a step is an iteration.
The lesson's workload is fixed (request i: 20 + 5i prompt, 50 - i output tokens), so every
seed gives the same run and the intervals have zero width; the seeds are kept for a uniform
table.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pagedkv.experiments.framework import ExperimentResult, Plan, PlotRef, Point, fmt
from pagedkv.report import plots

NAME = "lesson"
TITLE = "The course lesson, as written and at equal memory"
QUESTION = (
    "How many requests does each allocator hold at once for the lesson's 20 requests, how many "
    "steps does it take, how much of its memory holds tokens, and what does the lesson's own "
    "loop (no preemption) do?"
)
METRICS = (
    "finished",
    "deadlocked",
    "iterations",
    "max_running",
    "mean_running",
    "token_utilization",
    "pool_occupancy",
)
SETTINGS = (
    # (setting, scheduler, blocks)
    ("lesson: contiguous 5 slots", "contiguous-slots", 80),
    ("lesson: paged, its loop", "greedy-nopreempt", 100),
    ("equal: contiguous 6 slots", "contiguous-slots", 100),
    ("equal: orca-oracle", "orca-oracle", 100),
    ("equal: paged vllm", "vllm", 100),
)
BASE = {"workload": "lesson", "cost_model": "unit", "max_model_len": 256, "block_size": 16}


def plan(quick: bool, seeds: Sequence[int]) -> Plan:
    points = [
        Point(
            {"setting": name, "scheduler": sched, "num_gpu_blocks": blocks},
            seed,
            {**BASE, "scheduler": sched, "num_gpu_blocks": blocks},
            METRICS,
        )
        for name, sched, blocks in SETTINGS
        for seed in seeds
    ]
    setup = {
        "workload": "lesson (20 requests at t = 0; request i: 20 + 5i prompt, 50 - i output)",
        "cost_model": "unit (1 tick per iteration)",
        "block_size": 16,
        "max_model_len": 256,
        "note": "the lesson's workload is fixed: every seed gives the same run",
    }
    return Plan(setup, ("setting", "scheduler", "num_gpu_blocks"), METRICS, points)


def plot(result: ExperimentResult, out: Path) -> list[PlotRef]:
    fig, axes = plots.figure(3, width=4.5)
    names = [s["setting"] for s in result.summary]
    for ax, metric, ylabel in (
        (axes[0], "iterations", "steps to finish (iterations)"),
        (axes[1], "max_running", "max concurrency (requests)"),
        (axes[2], "token_utilization", "token utilization (token states / allocated)"),
    ):
        plots.bars_ci(
            ax,
            names,
            [s[f"{metric}_mean"] for s in result.summary],
            [s[f"{metric}_ci_low"] for s in result.summary],
            [s[f"{metric}_ci_high"] for s in result.summary],
        )
        plots.label(ax, "setting", ylabel)
    plots.save_png(fig, out / "lesson.png")
    return [
        PlotRef(
            "lesson.png",
            "The lesson's 20 requests: steps, max concurrency and token utilization per "
            "setting (unit clock; the deadlocked run's steps are those until it stalled).",
        )
    ]


def findings(result: ExperimentResult) -> list[str]:
    out = []
    own = result.summary_for(setting="lesson: contiguous 5 slots")
    equal = result.summary_for(setting="equal: contiguous 6 slots")
    paged = result.summary_for(setting="equal: paged vllm")
    greedy = result.summary_for(setting="lesson: paged, its loop")
    out.append(
        f"Max concurrency: contiguous {fmt(own, 'max_running')} (lesson's 80 blocks), "
        f"{fmt(equal, 'max_running')} at equal memory, paged {fmt(paged, 'max_running')}."
    )
    out.append(
        f"Steps to finish: contiguous {fmt(own, 'iterations')} / {fmt(equal, 'iterations')}, "
        f"paged {fmt(paged, 'iterations')}; token utilization contiguous "
        f"{fmt(equal, 'token_utilization')}, paged {fmt(paged, 'token_utilization')}."
    )
    if greedy["deadlocked_mean"]:
        out.append(
            f"The lesson's own loop on paged memory deadlocks with {greedy['finished_mean']:g} "
            "of 20 requests finished: every running sequence waits for a block none will free."
        )
    return out

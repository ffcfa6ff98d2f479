"""``prefix-sharing``: what automatic prefix caching buys as more requests share a prefix.

The workload is 'shared-prefix' (``workloads/shared_prefix.py``): 4 system prompts of 512
tokens with Zipf(1) popularity; a share ratio r of the requests start with one of them, the
others with a private prefix of the same length, so every ratio serves the same lengths and
only what is shared changes. Three settings at equal memory: paged ``vllm`` with prefix caching,
``vllm`` without it, and contiguous ``orca-oracle`` (which cannot share). Blocks saved is the
engine's one definition (``sharing_metrics.py``): saved / (saved + allocated) blocks,
time-averaged, the share of the memory a run without sharing would need.
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
from pagedkv.experiments.sharing_metrics import SHARING_METRICS
from pagedkv.report import plots

NAME = "prefix-sharing"
TITLE = "Prefix sharing"
QUESTION = (
    "As the share of requests that start with a common system prompt grows from 0 to 100%, "
    "how much of the prompt hits the prefix cache, how much KV memory does sharing save, and "
    "how many more requests run at once, with what throughput and latency, against no caching "
    "and against a contiguous cache?"
)
CACHING, PLAIN, CONTIGUOUS = "vllm + prefix caching", "vllm", "orca-oracle"
SETTINGS = {CACHING: ("vllm", True), PLAIN: ("vllm", False), CONTIGUOUS: ("orca-oracle", False)}
RATIOS = (0.0, 0.25, 0.5, 0.75, 1.0)
QUICK_RATIOS = (0.0, 0.5, 1.0)
PREFIX_LEN, NUM_PREFIXES, ZIPF = 512, 4, 1.0
RATES = {"sharegpt-like": 1.5, "alpaca-like": 20.0}
"""Above what vllm without caching serves with a 512-token prefix (~1.1/s and ~6.5/s at ratio
0): memory limits it, so what sharing saves can turn into throughput."""
REQUESTS, QUICK_REQUESTS = 400, 40
METRICS = (
    "prefix_hit_rate",
    "prefix_evictions",
    "saved_fraction",
    "blocks_per_running",
    "max_running",
    "mean_running",
    "request_throughput",
    "norm_latency_mean",
    "ttft_mean",
    "preemptions",
)
PLOTTED = (
    "prefix_hit_rate",
    "saved_fraction",
    "blocks_per_running",
    "mean_running",
    "request_throughput",
    "norm_latency_mean",
)
assert set(SHARING_METRICS) >= {"prefix_hit_rate", "saved_fraction"}  # registered


def plan(quick: bool, seeds: Sequence[int]) -> Plan:
    n = QUICK_REQUESTS if quick else REQUESTS
    ratios = QUICK_RATIOS if quick else RATIOS
    points = [
        Point(
            {"workload": wl, "share_ratio": ratio, "setting": setting},
            seed,
            setups.flat(
                "shared-prefix",
                n,
                RATES[wl],
                lengths=wl,
                prefix_len=PREFIX_LEN,
                num_prefixes=NUM_PREFIXES,
                prefix_zipf=ZIPF,
                share_ratio=ratio,
                scheduler=scheduler,
                enable_prefix_caching=caching,
            ),
            METRICS,
        )
        for wl in setups.WORKLOADS
        for ratio in ratios
        for setting, (scheduler, caching) in SETTINGS.items()
        for seed in seeds
    ]
    setup = setups.setup(
        workload="shared-prefix",
        lengths_after_prefix=list(setups.WORKLOADS),
        prefix_len=PREFIX_LEN,
        num_prefixes=NUM_PREFIXES,
        prefix_zipf=ZIPF,
        share_ratios=list(ratios),
        settings={
            k: {"scheduler": s, "enable_prefix_caching": c} for k, (s, c) in SETTINGS.items()
        },
        num_requests=n,
        request_rates=RATES,
        arrival="poisson",
        block_size=16,
        blocks_saved="saved_fraction: time-averaged saved / (saved + allocated) blocks, saved = "
        "block references - blocks in use (the engine's summary['sharing'])",
        blocks_per_running="time-averaged allocated blocks / mean running requests",
    )
    return Plan(setup, ("workload", "share_ratio", "setting"), METRICS, points)


def plot(result: ExperimentResult, out: Path) -> list[PlotRef]:
    refs = []
    for wl in setups.WORKLOADS:
        summary = [s for s in result.summary if s["workload"] == wl]
        fig, axes = plots.figure(len(PLOTTED), width=4.0, height=3.6)
        for ax, metric in zip(axes, PLOTTED, strict=True):
            plots.summary_lines(ax, summary, "share_ratio", "setting", metric)
            plots.label(ax, "share ratio", axis_label(metric), wl if metric == PLOTTED[0] else "")
        name = f"prefix_sharing_{wl}.png"
        plots.save_png(fig, out / name)
        refs.append(
            PlotRef(
                name,
                f"{wl} after a 512-token prefix (4 prefixes, Zipf 1): share ratio against prefix "
                "cache hit rate, blocks saved, blocks per running request, mean running "
                "requests, throughput "
                "and mean normalized latency; vllm with and without prefix caching and "
                "orca-oracle (mean and 95% CI band over seeds).",
            )
        )
    return refs


def findings(result: ExperimentResult) -> list[str]:
    out = []
    top = max(r["share_ratio"] for r in result.rows)
    for wl in setups.WORKLOADS:
        on = {"workload": wl, "share_ratio": top, "setting": CACHING}
        off = {**on, "setting": PLAIN}
        orca = {**on, "setting": CONTIGUOUS}
        zero = {**on, "share_ratio": 0.0}
        saved = fmt(result.summary_for(**on), "saved_fraction")
        out.append(
            f"{wl}, share ratio {top:g}: prefix cache hit rate "
            f"{fmt(result.summary_for(**on), 'prefix_hit_rate')} (at ratio 0: "
            f"{fmt(result.summary_for(**zero), 'prefix_hit_rate')}, hits of preempted requests' "
            f"own blocks); blocks saved (share of the blocks needed without sharing) {saved}, "
            f"blocks per running request with caching / without x"
            f"{fmt_ci(paired_ratio(result, 'blocks_per_running', on, off))}; mean running "
            f"requests x"
            f"{fmt_ci(paired_ratio(result, 'mean_running', on, off))} and max running x"
            f"{fmt_ci(paired_ratio(result, 'max_running', on, off))} of vllm without caching."
        )
        out.append(
            f"{wl}, share ratio {top:g}: throughput with caching over vllm without x"
            f"{fmt_ci(paired_ratio(result, 'request_throughput', on, off))}, over orca-oracle x"
            f"{fmt_ci(paired_ratio(result, 'request_throughput', on, orca))}; mean normalized "
            f"latency with caching / without x"
            f"{fmt_ci(paired_ratio(result, 'norm_latency_mean', on, off))}."
        )
    return out

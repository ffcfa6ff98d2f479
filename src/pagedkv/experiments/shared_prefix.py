"""``shared-prefix``: the vLLM paper's translation case, 1-shot and 5-shot prompts (§6.3).

Every request starts with the same translation prompt, 80 tokens with one example or 341 with
five (Kwon et al., SOSP'23, §6.3, Fig. 16, LLaMA-13B on WMT16 English-German; here Llama-2-13B,
the same shape, on one A100-40GB), then one sentence to translate (``workloads/shared_prefix``:
``TRANSLATION_LIKE``, our length choice). vllm with prefix caching shares the prompt's blocks;
vllm without caching and contiguous ``orca-oracle`` hold a copy per request. A fourth setting,
vllm with the prompt registered as a pinned prefix (explicit mode, ``memory/pinned.py``), shares
all its blocks, the partial last one included (copied on the first write), and computes it once
at t = 0 instead of on the first request.

The paper reports vLLM's throughput over Orca (Oracle) at equal latency: 1.67x for 1-shot and
3.58x for 5-shot. Here throughput is offline: all requests at t = 0, finished / makespan, so
the figure is the capacity ratio, not the paper's latency-bound one.
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
    paired_ratio,
)
from pagedkv.experiments.metrics import axis_label
from pagedkv.experiments.prefix_sharing import CACHING, CONTIGUOUS, PLAIN, SETTINGS
from pagedkv.report import plots

NAME = "shared-prefix"
TITLE = "Shared prefix (translation)"
QUESTION = (
    "With a 1-shot (80-token) or 5-shot (341-token) translation prompt shared by every request, "
    "how much more throughput does vllm with prefix caching reach than vllm without it and "
    "than a contiguous cache (orca-oracle)? (The vLLM paper: 1.67x and 3.58x over Orca.)"
)
MODEL = "Llama-2-13B"
SHOTS = (1, 5)
PINNED = "vllm + pinned prefixes"
VARIANTS: dict[str, dict[str, Any]] = {
    **{k: {"scheduler": s, "enable_prefix_caching": c} for k, (s, c) in SETTINGS.items()},
    PINNED: {"scheduler": "vllm", "enable_pinned_prefixes": True},
}
"""Each setting's flat keys: the prefix-sharing experiment's three, and explicit mode."""
PAPER = {1: 1.67, 5: 3.58}
"""vLLM over Orca (Oracle), Kwon et al., SOSP'23, §6.3 (Fig. 16)."""
REQUESTS, QUICK_REQUESTS = 1000, 100
METRICS = (
    "request_throughput",
    "prefix_hit_rate",
    "max_running",
    "mean_running",
    "saved_fraction",
    "blocks_per_running",
)


def plan(quick: bool, seeds: Sequence[int]) -> Plan:
    n = QUICK_REQUESTS if quick else REQUESTS
    points = [
        Point(
            {"shots": shots, "setting": setting},
            seed,
            setups.flat(
                "translation",
                n,
                model=MODEL,
                shots=shots,
                **options,
            ),
            METRICS,
        )
        for shots in SHOTS
        for setting, options in VARIANTS.items()
        for seed in seeds
    ]
    setup = setups.setup(
        model=MODEL,
        workload="translation",
        prefix_lens={"1-shot": 80, "5-shot": 341},
        sentence_lengths="lognormal, mean 30 tokens, sigma 0.5, both sides (our choice)",
        settings=VARIANTS,
        num_requests=n,
        arrival="all-at-once (offline throughput)",
        block_size=16,
    )
    return Plan(setup, ("shots", "setting"), METRICS, points)


def plot(result: ExperimentResult, out: Path) -> list[PlotRef]:
    fig, axes = plots.figure(2, width=4.5, height=3.6)
    for ax, metric in zip(axes, ("request_throughput", "mean_running"), strict=True):
        plots.summary_lines(ax, result.summary, "shots", "setting", metric)
        ax.set_xticks(list(SHOTS))
        plots.label(ax, "shots in the shared prompt", axis_label(metric))
    plots.save_png(fig, out / "shared_prefix.png")
    return [
        PlotRef(
            "shared_prefix.png",
            "Translation with a shared 1-shot (80-token) or 5-shot (341-token) prompt: offline "
            "throughput and mean running requests, vllm with and without prefix caching, vllm "
            "with the prompt pinned (explicit mode) and orca-oracle (Llama-2-13B, A100-40GB; "
            "mean and 95% CI over seeds).",
        )
    ]


def findings(result: ExperimentResult) -> list[str]:
    out = []
    for shots in SHOTS:
        on = {"shots": shots, "setting": CACHING}
        off, orca = {**on, "setting": PLAIN}, {**on, "setting": CONTIGUOUS}
        out.append(
            f"{shots}-shot: throughput of vllm with prefix caching over orca-oracle x"
            f"{fmt_ci(paired_ratio(result, 'request_throughput', on, orca))} (the paper: "
            f"{PAPER[shots]}x over Orca at equal latency), over vllm without caching x"
            f"{fmt_ci(paired_ratio(result, 'request_throughput', on, off))}; hit rate "
            f"{fmt(result.summary_for(**on), 'prefix_hit_rate')}."
        )
        pinned = {**on, "setting": PINNED}
        out.append(
            f"{shots}-shot: pinned prefix (explicit mode) over prefix caching x"
            f"{fmt_ci(paired_ratio(result, 'request_throughput', pinned, on))} in throughput; "
            f"hit rate {fmt(result.summary_for(**pinned), 'prefix_hit_rate')} (the partial "
            "last block too), memory saving "
            f"{fmt(result.summary_for(**pinned), 'saved_fraction')} against "
            f"{fmt(result.summary_for(**on), 'saved_fraction')}."
        )
    return out

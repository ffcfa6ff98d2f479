"""``chat``: multi-turn conversations with prefix caching on and off, against the cache size.

The workload is 'chat' (``workloads/chat.py``): sessions arrive as a Poisson process; each has
up to 6 turns after a 128-token system prompt, Alpaca-like messages and answers, and an
exponential think time (mean 5 s) between an answer and the next turn, each turn's prompt being
the whole conversation so far. With caching, a turn can reuse the blocks its conversation left
behind, if they were not evicted (LRU) while the user was thinking: the cache size decides
that. Turns are closed-loop, so throughput follows the users; TTFT and the hit rate are what
caching changes.
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

NAME = "chat"
TITLE = "Multi-turn chat"
QUESTION = (
    "In multi-turn chat, how much of each prompt does prefix caching find in the cache, and "
    "how much does it cut the time to first token, as the KV cache grows?"
)
BLOCKS = (128, 256, 512, 1024, 2048)
QUICK_BLOCKS = (128, 512, 2048)
"""KV blocks of 16 tokens; OPT-13B on an A100-40GB has ~977 (``setups``)."""
SESSIONS, QUICK_SESSIONS = 100, 12
TURNS, SYSTEM_PROMPT, THINK_TIME = 6, 128, 5.0
SESSION_RATE = 1.0
"""New sessions per second; with ~6 turns and 5 s thinking, about 4 requests/s in all."""
LENGTHS = "alpaca-like"
METRICS = (
    "prefix_hit_rate",
    "prefix_evictions",
    "ttft_mean",
    "ttft_p99",
    "norm_latency_mean",
    "request_throughput",
    "preemptions",
    "finished",
)
PLOTTED = ("prefix_hit_rate", "ttft_mean", "ttft_p99", "norm_latency_mean")
assert set(SHARING_METRICS) >= {"prefix_hit_rate", "ttft_mean"}  # registered


def plan(quick: bool, seeds: Sequence[int]) -> Plan:
    sessions = QUICK_SESSIONS if quick else SESSIONS
    blocks = QUICK_BLOCKS if quick else BLOCKS
    flat = {
        **setups.HARDWARE,
        "workload": "chat",
        "num_sessions": sessions,
        "chat_turns": TURNS,
        "prefix_len": SYSTEM_PROMPT,
        "lengths": LENGTHS,
        "think_time_mean": THINK_TIME,
        "request_rate": SESSION_RATE,
        "scheduler": "vllm",
    }
    points = [
        Point(
            {"num_gpu_blocks": nb, "caching": "on" if caching else "off"},
            seed,
            {**flat, "num_gpu_blocks": nb, "enable_prefix_caching": caching},
            METRICS,
        )
        for nb in blocks
        for caching in (True, False)
        for seed in seeds
    ]
    setup = setups.setup(
        workload="chat",
        scheduler="vllm (recompute)",
        num_sessions=sessions,
        chat_turns=TURNS,
        system_prompt_len=SYSTEM_PROMPT,
        lengths=LENGTHS,
        think_time_mean=THINK_TIME,
        session_rate=SESSION_RATE,
        arrival="poisson (sessions); later turns closed-loop",
        num_gpu_blocks=list(blocks),
        block_size=16,
        eviction="LRU",
    )
    return Plan(setup, ("num_gpu_blocks", "caching"), METRICS, points)


def plot(result: ExperimentResult, out: Path) -> list[PlotRef]:
    fig, axes = plots.figure(len(PLOTTED), width=4.0, height=3.6)
    for ax, metric in zip(axes, PLOTTED, strict=True):
        plots.summary_lines(ax, result.summary, "num_gpu_blocks", "caching", metric, log_x=True)
        plots.label(ax, "KV cache (blocks of 16 tokens)", axis_label(metric), "prefix caching")
        if metric.startswith("ttft"):
            ax.set_yscale("log")  # seconds when the cache is small, milliseconds when not
    plots.save_png(fig, out / "chat.png")
    return [
        PlotRef(
            "chat.png",
            "Multi-turn chat (6 turns, 128-token system prompt, Alpaca-like turns, 5 s think "
            "time): KV cache size against prefix cache hit rate, mean and p99 TTFT and mean "
            "normalized latency, with prefix caching on and off (vllm; mean and 95% CI band).",
        )
    ]


def findings(result: ExperimentResult) -> list[str]:
    out = []
    sizes = sorted({r["num_gpu_blocks"] for r in result.rows})
    for nb in (sizes[0], sizes[-1]):
        on = {"num_gpu_blocks": nb, "caching": "on"}
        off = {**on, "caching": "off"}
        out.append(
            f"{nb} blocks: prefix cache hit rate {fmt(result.summary_for(**on), 'prefix_hit_rate')}"
            f", {fmt(result.summary_for(**on), 'prefix_evictions')} evictions; mean TTFT with "
            f"caching / without x{fmt_ci(paired_ratio(result, 'ttft_mean', on, off))} "
            f"({fmt(result.summary_for(**on), 'ttft_mean')} s against "
            f"{fmt(result.summary_for(**off), 'ttft_mean')} s)."
        )
    return out

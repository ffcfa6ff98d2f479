"""``eviction``: LRU against LFU eviction of the prefix cache, on chat and shared-prefix load.

Both policies hand out uncached free blocks first; they differ only in which *cached* free
block an allocation gives up (``memory/eviction.py``): LRU the least recently freed, LFU the one
with the fewest uses (references taken since it was filled), ties least recently freed.

* ``chat``: the ``chat`` experiment's sessions (6 turns after a 128-token system prompt,
  Alpaca-like turns, 5 s think time, sessions arriving at 1/s), fewer of them. A conversation's
  blocks come back one think time later, and a finished conversation's never do.
* ``shared-prefix``: 16 system prompts of 256 tokens with Zipf(1) popularity, half the requests
  start with one, the others with a private prompt of the same length (Alpaca-like text after
  it), Poisson at 10 requests/s. Popular prefixes come back often, private ones never.

Each at cache sizes where evictions happen (the fewest blocks so that every request still fits,
up to where only a few evictions are left). Paired per seed (both policies serve the same
requests), the differences LFU - LRU remove the workload's own spread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pagedkv.experiments import setups
from pagedkv.experiments.framework import ExperimentResult, Plan, PlotRef, Point, fmt, fmt_ci
from pagedkv.experiments.metrics import axis_label
from pagedkv.experiments.sharing_metrics import SHARING_METRICS
from pagedkv.report import plots, stats

NAME = "eviction"
TITLE = "Prefix cache eviction: LRU and LFU"
QUESTION = (
    "When the prefix cache is full, does evicting the least frequently used block (LFU) keep "
    "more hits, fewer evictions, more throughput and a lower TTFT than evicting the least "
    "recently used one (LRU, vLLM's policy), on multi-turn chat and on shared system prompts?"
)
POLICIES = ("lru", "lfu")
CHAT, SHARED = "chat", "shared-prefix"
WORKLOADS = (CHAT, SHARED)
BLOCKS = {CHAT: (256, 512, 1024), SHARED: (256, 512, 1024)}
QUICK_BLOCKS = {CHAT: (128, 256), SHARED: (256, 512)}
"""KV blocks of 16 tokens (OPT-13B on an A100-40GB has ~977). The largest size still evicts."""
SESSIONS, QUICK_SESSIONS = 40, 12
REQUESTS, QUICK_REQUESTS = 200, 60
TURNS, SYSTEM_PROMPT, THINK_TIME, SESSION_RATE = 6, 128, 5.0, 1.0
PREFIX_LEN, NUM_PREFIXES, ZIPF, SHARE_RATIO, RATE = 256, 16, 1.0, 0.5, 10.0
LENGTHS = "alpaca-like"
METRICS = (
    "prefix_hit_rate",
    "prefix_evictions",
    "request_throughput",
    "ttft_mean",
    "finished",
)
PLOTTED = ("prefix_hit_rate", "prefix_evictions", "request_throughput", "ttft_mean")
assert set(SHARING_METRICS) >= {"prefix_hit_rate", "prefix_evictions", "ttft_mean"}


def _flat(workload: str, quick: bool) -> dict[str, Any]:
    if workload == CHAT:
        return {
            **setups.HARDWARE,
            "workload": "chat",
            "num_sessions": QUICK_SESSIONS if quick else SESSIONS,
            "chat_turns": TURNS,
            "prefix_len": SYSTEM_PROMPT,
            "lengths": LENGTHS,
            "think_time_mean": THINK_TIME,
            "request_rate": SESSION_RATE,
        }
    return setups.flat(
        "shared-prefix",
        QUICK_REQUESTS if quick else REQUESTS,
        RATE,
        lengths=LENGTHS,
        prefix_len=PREFIX_LEN,
        num_prefixes=NUM_PREFIXES,
        prefix_zipf=ZIPF,
        share_ratio=SHARE_RATIO,
    )


def plan(quick: bool, seeds: Sequence[int]) -> Plan:
    sizes = QUICK_BLOCKS if quick else BLOCKS
    points = [
        Point(
            {"workload": wl, "num_gpu_blocks": nb, "policy": policy},
            seed,
            {
                **_flat(wl, quick),
                "scheduler": "vllm",
                "enable_prefix_caching": True,
                "eviction_policy": policy,
                "num_gpu_blocks": nb,
            },
            METRICS,
        )
        for wl in WORKLOADS
        for nb in sizes[wl]
        for policy in POLICIES
        for seed in seeds
    ]
    setup = setups.setup(
        scheduler="vllm (recompute), prefix caching on",
        policies={
            "lru": "evict the least recently freed cached block",
            "lfu": "evict the cached block with the fewest uses (references taken since it was "
            "filled: allocation, prefix hits, forks), ties least recently freed",
        },
        chat={
            "num_sessions": QUICK_SESSIONS if quick else SESSIONS,
            "chat_turns": TURNS,
            "system_prompt_len": SYSTEM_PROMPT,
            "think_time_mean": THINK_TIME,
            "session_rate": SESSION_RATE,
            "lengths": LENGTHS,
        },
        shared_prefix={
            "num_requests": QUICK_REQUESTS if quick else REQUESTS,
            "prefix_len": PREFIX_LEN,
            "num_prefixes": NUM_PREFIXES,
            "prefix_zipf": ZIPF,
            "share_ratio": SHARE_RATIO,
            "request_rate": RATE,
            "arrival": "poisson",
            "lengths": LENGTHS,
        },
        num_gpu_blocks={wl: list(sizes[wl]) for wl in WORKLOADS},
        block_size=16,
    )
    return Plan(setup, ("workload", "num_gpu_blocks", "policy"), METRICS, points)


def plot(result: ExperimentResult, out: Path) -> list[PlotRef]:
    refs = []
    for wl in WORKLOADS:
        summary = [s for s in result.summary if s["workload"] == wl]
        fig, axes = plots.figure(len(PLOTTED), width=4.0, height=3.6)
        for ax, metric in zip(axes, PLOTTED, strict=True):
            plots.summary_lines(ax, summary, "num_gpu_blocks", "policy", metric, log_x=True)
            plots.label(ax, "KV cache (blocks of 16 tokens)", axis_label(metric), wl)
            if metric == "ttft_mean":
                ax.set_yscale("log")  # seconds at the smallest cache, milliseconds above
        name = f"eviction_{wl.replace('-', '_')}.png"
        plots.save_png(fig, out / name)
        refs.append(
            PlotRef(
                name,
                f"{wl}: KV cache size against prefix cache hit rate, evictions, throughput and "
                "mean TTFT under LRU and LFU eviction (vllm with prefix caching; mean and 95% "
                "CI band over seeds).",
            )
        )
    return refs


def paired_difference(
    result: ExperimentResult, metric: str, top: Mapping[str, Any], bottom: Mapping[str, Any]
) -> stats.MeanCI:
    """Per seed, ``metric`` of ``top`` minus that of ``bottom``; mean and 95% interval."""

    def per_seed(key: Mapping[str, Any]) -> dict[int, float]:
        return {
            r["seed"]: float(r[metric])
            for r in result.rows
            if all(r[k] == v for k, v in key.items()) and r[metric] is not None
        }

    a, b = per_seed(top), per_seed(bottom)
    return stats.mean_ci(a[s] - b[s] for s in a if s in b)


def _verdict(ci: stats.MeanCI, higher_is_better: bool) -> str:
    if ci.low is None or ci.high is None or ci.low <= 0 <= ci.high:
        return "no significant difference"
    lfu_wins = (ci.low > 0) == higher_is_better
    return "LFU better" if lfu_wins else "LRU better"


def findings(result: ExperimentResult) -> list[str]:
    out = []
    for wl in WORKLOADS:
        for nb in sorted({r["num_gpu_blocks"] for r in result.rows if r["workload"] == wl}):
            lru = {"workload": wl, "num_gpu_blocks": nb, "policy": "lru"}
            lfu = {**lru, "policy": "lfu"}
            hit = paired_difference(result, "prefix_hit_rate", lfu, lru)
            ttft = paired_difference(result, "ttft_mean", lfu, lru)
            s_lru, s_lfu = result.summary_for(**lru), result.summary_for(**lfu)
            out.append(
                f"{wl}, {nb} blocks: hit rate LRU {fmt(s_lru, 'prefix_hit_rate')}, LFU "
                f"{fmt(s_lfu, 'prefix_hit_rate')}, LFU - LRU "
                f"{fmt_ci(hit)} ({_verdict(hit, True)}); evictions LRU "
                f"{fmt(s_lru, 'prefix_evictions', 4)}, LFU "
                f"{fmt(s_lfu, 'prefix_evictions', 4)}; mean TTFT LFU - LRU "
                f"{fmt_ci(ttft)} s ({_verdict(ttft, False)}); throughput LFU - LRU "
                f"{fmt_ci(paired_difference(result, 'request_throughput', lfu, lru))} requests/s."
            )
    return out

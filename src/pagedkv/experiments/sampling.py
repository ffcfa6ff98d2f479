"""``sampling``: memory saved by parallel sampling and beam search, and what it buys (§6.3).

A request of n parallel samples or of a beam search of width k is one group of sequences
sharing its prompt's blocks (and, for beams, the history up to each fork: the simulator's
beams fork and die by the seeded survival model of ``pagedkv.engine.beam``). The **memory
saving** is the engine's ``saved_fraction``: time-averaged blocks saved by sharing over the
blocks a run without sharing would need (saved + allocated), the vLLM paper's definition.

The **baseline** is ``orca-oracle`` (contiguous, exact reservations), which refuses groups: it
serves the same work as n (or k) independent requests per group, each with the full prompt and
the full output (``samples_as_requests``), nothing shared. Throughput is offline (every
request at t = 0, so memory is the bottleneck until the tail): groups finished per second,
vllm's requests/s against orca's requests/s / width.

The vLLM paper (Kwon et al., SOSP'23, §6.3, Fig. 15: OPT-13B, Alpaca) reports 6.1-9.8% saved
by parallel sampling and 37.6-55.2% by beam search, for widths 2-6; ours are reported beside
them, the survival model is not tuned to hit them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pagedkv.experiments import setups
from pagedkv.experiments.framework import ExperimentResult, Plan, PlotRef, Point, fmt, fmt_ci
from pagedkv.experiments.metrics import axis_label
from pagedkv.report import plots, stats

NAME = "sampling"
TITLE = "Parallel sampling and beam search"
QUESTION = (
    "How much KV memory do parallel sampling (n = 2, 4, 6) and beam search (k = 2, 4, 6) save "
    "by sharing (the vLLM paper: 6.1-9.8% and 37.6-55.2% on Alpaca), and how much more "
    "throughput does vllm reach than orca-oracle serving the same sequences unshared?"
)
WIDTHS = (2, 4, 6)
SEARCHES = {"parallel": "num_samples", "beam": "beam_width"}
BASELINE = "independent"
"""The ``search`` value of orca-oracle's rows: width independent requests per group."""
PAPER = {"parallel": (0.061, 0.098), "beam": (0.376, 0.552)}
"""Memory saved on Alpaca, widths 2-6 (Kwon et al., SOSP'23, §6.3)."""
REQUESTS = {"alpaca-like": 160, "sharegpt-like": 20}
QUICK_REQUESTS = {"alpaca-like": 16, "sharegpt-like": 5}
"""Groups per run. Beam groups are simulated round by round (no fast-forward: they change
every round), so the default run stays ~30 s: 160 Alpaca-like groups at once are more than the
pool holds (memory binds, for vllm too); 20 ShareGPT-like groups (long outputs: slow to step)
nearly all fit in vllm's pool at once, so there the gain is orca-oracle's capacity limit."""
METRICS = ("saved_fraction", "request_throughput", "mean_running", "preemptions")


def plan(quick: bool, seeds: Sequence[int]) -> Plan:
    sizes = QUICK_REQUESTS if quick else REQUESTS
    points = []
    for workload in setups.WORKLOADS:
        for width in WIDTHS:
            runs = [(search, "vllm", {field: width}) for search, field in SEARCHES.items()] + [
                (BASELINE, "orca-oracle", {"num_samples": width, "samples_as_requests": True})
            ]
            for search, scheduler, extra in runs:
                config = {"workload": workload, "search": search, "width": width}
                flat = setups.flat(workload, sizes[workload], scheduler=scheduler, **extra)
                points += [Point({**config, "setting": scheduler}, s, flat, METRICS) for s in seeds]
    setup = setups.setup(
        workloads=list(setups.WORKLOADS),
        widths=list(WIDTHS),
        groups_per_run=dict(sizes),
        settings={
            "vllm": "one group of width sequences per request (shared prompt; beams share "
            "their history up to each fork)",
            "orca-oracle": "width independent requests per group, each with the full prompt",
        },
        beam_model="stay 0.5, decay 0.5 (pagedkv.engine.beam.BeamModel defaults)",
        arrival="all-at-once (offline throughput: memory-bound)",
        block_size=16,
    )
    return Plan(setup, ("workload", "search", "width", "setting"), METRICS, points)


def group_gain(result: ExperimentResult, workload: str, search: str, width: int) -> stats.MeanCI:
    """Per seed, vllm's groups/s over orca-oracle's (its requests/s / width), then the mean and
    95% interval over seeds (paired: both runs of a seed serve the same groups)."""

    def per_seed(search_: str) -> dict[int, float]:
        return {
            r["seed"]: float(r["request_throughput"])
            for r in result.rows
            if (r["workload"], r["search"], r["width"]) == (workload, search_, width)
        }

    vllm, orca = per_seed(search), per_seed(BASELINE)
    return stats.mean_ci(vllm[s] * width / orca[s] for s in vllm if orca.get(s))


def plot(result: ExperimentResult, out: Path) -> list[PlotRef]:
    fig, axes = plots.figure(2, width=4.5, height=3.6)
    ax = axes[0]
    for workload in setups.WORKLOADS:
        for search in SEARCHES:
            rows = [
                result.summary_for(workload=workload, search=search, width=w, setting="vllm")
                for w in WIDTHS
            ]
            plots.line_ci(
                ax,
                list(WIDTHS),
                [r["saved_fraction_mean"] for r in rows],
                [r["saved_fraction_ci_low"] for r in rows],
                [r["saved_fraction_ci_high"] for r in rows],
                f"{search}, {workload}",
            )
    ax.set_xticks(list(WIDTHS))
    ax.legend(fontsize=7)
    plots.label(ax, "samples n / beam width k", axis_label("saved_fraction"))
    ax = axes[1]
    for workload in setups.WORKLOADS:
        for search in SEARCHES:
            gains = [group_gain(result, workload, search, w) for w in WIDTHS]
            plots.line_ci(
                ax,
                list(WIDTHS),
                [g.mean for g in gains],
                [g.low for g in gains],
                [g.high for g in gains],
                f"{search}, {workload}",
            )
    ax.set_xticks(list(WIDTHS))
    ax.legend(fontsize=7)
    plots.label(ax, "samples n / beam width k", "throughput over orca-oracle (x, groups/s)")
    plots.save_png(fig, out / "sampling.png")
    return [
        PlotRef(
            "sampling.png",
            "Left: memory saved by sharing (saved / needed without sharing) for parallel "
            "sampling and beam search; right: vllm's offline throughput (groups/s) over "
            "orca-oracle serving each group as independent requests (OPT-13B, A100-40GB; "
            "mean and 95% CI over seeds).",
        )
    ]


def findings(result: ExperimentResult) -> list[str]:
    out = []
    for search in SEARCHES:
        low, high = PAPER[search]
        for workload in setups.WORKLOADS:
            parts = []
            for w in WIDTHS:
                s = result.summary_for(workload=workload, search=search, width=w, setting="vllm")
                parts.append(
                    f"{w}: {fmt(s, 'saved_fraction')} saved, x"
                    f"{fmt_ci(group_gain(result, workload, search, w))} over orca-oracle"
                )
            paper = (
                f" (the paper, Alpaca: {low:.1%}-{high:.1%} saved)" if "alpaca" in workload else ""
            )
            out.append(f"{search} on {workload}, width " + "; ".join(parts) + paper + ".")
    return out

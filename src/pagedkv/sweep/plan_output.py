"""The plan's outputs: a rich table, ``plan.csv``, ``plan.json`` and ``plan.png``, atomically."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from pagedkv.io import atomic_write_bytes, atomic_write_json, atomic_write_text, output_set
from pagedkv.sweep.plan import CandidateResult
from pagedkv.sweep.plan_spec import PlanSpec
from pagedkv.sweep.table import columns_of, to_csv


def plan_table(results: Sequence[CandidateResult], spec: PlanSpec) -> Table:
    slo = ", ".join(f"{k} <= {v:g} s" for k, v in spec.slo.items())
    title = f"Capacity plan: {slo}; every one of {len(spec.seeds)} seeds must meet it"
    target = spec.target_rate
    if target is not None:
        title += f"; serving {target:g} req/s"
    table = Table(title=title)
    columns = ["rank", "candidate", "GPUs", "$/GPU-h", "max req/s", "$/M requests"]
    if target is not None:
        columns += ["replicas", "$/hour", f"$/M at {target:g}/s"]
    for col in (*columns, "status"):
        table.add_column(col, justify="left" if col in ("candidate", "status") else "right")
    for rank, r in enumerate(results, 1):
        cells = [
            str(rank),
            r.candidate.name,
            str(r.num_gpus),
            f"{r.candidate.price_per_gpu_hour:g}",
            "-" if r.max_rate is None else f"{r.max_rate:.3g}",
            _num(r.cost_per_million),
        ]
        if target is not None:
            replicas = r.replicas
            cells += [
                "-" if replicas is None else str(replicas),
                _num(r.cost_per_hour),
                _num(r.cost_per_million_at_target),
            ]
        table.add_row(*cells, r.status)
    return table


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


@output_set()  # the table, the JSON and the plot together, or none
def write_plan(results: Sequence[CandidateResult], spec: PlanSpec, out: Path) -> list[Path]:
    rows = [r.row() for r in results]
    csv_path = atomic_write_text(out / "plan.csv", to_csv(rows, columns_of(rows, [])))
    payload: dict[str, Any] = {
        "spec": spec.to_dict(),
        "rule": "a rate passes when every seed meets every SLO, deadlocks not, rejects nothing",
        "candidates": [{**r.row(), "probe_rates": r.probes, **_replica_probes(r)} for r in results],
    }
    json_path = atomic_write_json(out / "plan.json", payload)
    png = out / "plan.png"
    target = spec.target_rate
    plot = plot_plan(results, png) if target is None else plot_target(results, target, png)
    return [csv_path, json_path, plot]


def _replica_probes(r: CandidateResult) -> dict[str, Any]:
    """Each replica count simulated at the target rate and whether it met the SLOs."""
    return {} if r.target is None else {"replica_counts_probed": r.target.probes}


def plot_plan(results: Sequence[CandidateResult], path: Path) -> Path:
    """Cost per million requests per candidate (bars), the sustained rate written beside each."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    shown = [r for r in results if r.cost_per_million is not None]
    fig, ax = plt.subplots(figsize=(8, 0.5 * max(len(shown), 2) + 1.5))
    names = [r.candidate.name for r in shown][::-1]
    costs = [r.cost_per_million or 0.0 for r in shown][::-1]
    ax.barh(names, costs, color="tab:blue")
    for y, r in enumerate(shown[::-1]):
        cap = "+" if r.capped else ""
        ax.annotate(f" {r.max_rate:.3g}{cap} req/s", (costs[y], y), va="center", fontsize=8)
    ax.set_xlabel("cost per million requests (price units)")
    ax.set_title("Cheapest deployment that meets the SLOs")
    return _save(fig, ax, not shown, path)


def plot_target(results: Sequence[CandidateResult], rate: float, path: Path) -> Path:
    """Cost per hour to serve the target rate per candidate (bars), the replicas beside each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in results if r.cost_per_hour is not None]
    fig, ax = plt.subplots(figsize=(8, 0.5 * max(len(shown), 2) + 1.5))
    names = [r.candidate.name for r in shown][::-1]
    costs = [r.cost_per_hour or 0.0 for r in shown][::-1]
    ax.barh(names, costs, color="tab:blue")
    for y, r in enumerate(shown[::-1]):
        ax.annotate(f" {r.replicas} replicas", (costs[y], y), va="center", fontsize=8)
    ax.margins(x=0.15)  # room for the labels beside the bars
    ax.set_xlabel(f"cost per hour to serve {rate:g} req/s (price units)")
    ax.set_title("Cheapest deployment that serves the target rate inside the SLOs")
    return _save(fig, ax, not shown, path)


def _save(fig: Any, ax: Any, empty: bool, path: Path) -> Path:
    import matplotlib.pyplot as plt

    if empty:
        ax.text(0.5, 0.5, "no candidate meets the SLOs", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())

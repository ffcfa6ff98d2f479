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
    table = Table(title=f"Capacity plan: {slo}; every one of {len(spec.seeds)} seeds must meet it")
    for col in ("rank", "candidate", "GPUs", "$/GPU-h", "max req/s", "$/M requests", "status"):
        table.add_column(col, justify="left" if col in ("candidate", "status") else "right")
    for rank, r in enumerate(results, 1):
        cost = r.cost_per_million
        table.add_row(
            str(rank),
            r.candidate.name,
            str(r.num_gpus),
            f"{r.candidate.price_per_gpu_hour:g}",
            "-" if r.max_rate is None else f"{r.max_rate:.3g}",
            "-" if cost is None else f"{cost:.4g}",
            r.status,
        )
    return table


@output_set()  # the table, the JSON and the plot together, or none
def write_plan(results: Sequence[CandidateResult], spec: PlanSpec, out: Path) -> list[Path]:
    rows = [r.row() for r in results]
    csv_path = atomic_write_text(out / "plan.csv", to_csv(rows, columns_of(rows, [])))
    payload: dict[str, Any] = {
        "spec": spec.to_dict(),
        "rule": "a rate passes when every seed meets every SLO, deadlocks not, rejects nothing",
        "candidates": [{**r.row(), "probe_rates": r.probes} for r in results],
    }
    json_path = atomic_write_json(out / "plan.json", payload)
    return [csv_path, json_path, plot_plan(results, out / "plan.png")]


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
    if not shown:
        ax.text(0.5, 0.5, "no candidate meets the SLOs", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())

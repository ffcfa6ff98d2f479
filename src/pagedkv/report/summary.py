"""Terminal tables of simulation results (rich): one run's summary, and runs side by side.

Both read plain results (a run's flat ``config`` and its ``summary`` dict, or the bench's
rows), never engine internals. Times are in the run's clock: ticks under the unit cost model
(one per iteration), seconds under the roofline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from pagedkv.engine.metrics import CATEGORIES
from pagedkv.experiments.bench import BenchRow, clock_unit
from pagedkv.report.console import fmt_sig

LATENCIES = (
    ("ttft", "TTFT"),
    ("tpot", "TPOT"),
    ("e2e", "E2E latency"),
    ("normalized_latency", "normalized latency (per output token)"),
)


def fmt_time(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit != "s":
        return f"{value:,.2f} {unit}"
    # Per-token times are milliseconds, whole runs minutes: keep three significant figures.
    return f"{fmt_sig(value * 1000)} ms" if abs(value) < 1 else f"{value:,.2f} s"


def _pct(value: float | None) -> str:
    """None: a ratio with nothing under it (the token utilization of a run that held nothing)."""
    return "n/a" if value is None else f"{value:.1%}"


def summary_table(config: Mapping[str, Any], summary: Mapping[str, Any]) -> Table:
    """The summary of one ``pagedkv simulate`` run (``SimulationResult.config`` / ``.summary``)."""
    unit = clock_unit(str(config["cost_model"]))
    per = "tick" if unit == "ticks" else "s"
    hardware = (
        "unit clock" if unit == "ticks" else f"{config['model']} on {config['gpu']}, roofline"
    )
    capacity = summary["num_gpu_blocks"] * config["block_size"]
    table = Table(
        title=(
            f"{config['scheduler']} on {config['workload']} ({summary['num_requests']} requests),"
            f" {hardware}, {summary['num_gpu_blocks']} blocks of {config['block_size']}"
        ),
        caption=(
            f"Memory: share of the C = {capacity:,} token slots, averaged over iterations "
            "weighted by their duration; token utilization = token states / allocated, "
            "pool occupancy = allocated / C."
        ),
    )
    table.add_column("metric")
    for col in ("value / mean", "p50", "p90", "p99"):
        table.add_column(col, justify="right")

    def row(name: str, value: str) -> None:
        table.add_row(name, value, "", "", "")

    row("requests finished", f"{summary['finished']} of {summary['num_requests']}")
    row("requests rejected (can never fit)", str(summary["rejected"]))
    if summary.get("deadlocked"):
        stuck = summary.get("stuck_requests", [])
        row("[bold red]deadlocked[/]", f"[bold red]yes: {len(stuck)} requests stuck[/]")
    row("simulated time", fmt_time(summary["sim_time"], unit))
    row("iterations", f"{summary['iterations']:,}")
    row(f"request throughput (per {per})", fmt_sig(summary["request_throughput"], 4))
    row(f"output token throughput (per {per})", fmt_sig(summary["output_token_throughput"], 4))
    table.add_section()
    row("max running (at once)", str(summary["max_running"]))
    row("mean running (per iteration)", f"{summary['mean_running']:.2f}")
    row("preemptions", str(summary["preemptions"]))
    row("swap outs", str(summary["swap_outs"]))
    table.add_section()
    for key, name in LATENCIES:
        stats = summary.get(key)
        if stats is None:
            row(name, "-")
            continue
        suffix = "/tok" if key == "normalized_latency" else ""
        cells = [fmt_time(stats[q], unit) + suffix for q in ("mean", "p50", "p90", "p99")]
        table.add_row(name, *cells)
    table.add_section()
    memory = summary["memory"]
    for name in CATEGORIES:
        row(name.replace("_", " "), _pct(memory[name]))
    row("token utilization", _pct(memory["token_utilization"]))
    row("pool occupancy", _pct(memory["pool_occupancy"]))
    cache = summary.get("prefix_cache")
    if cache and cache["query_tokens"]:
        table.add_section()
        row(
            "prefix cache hits (tokens)",
            f"{cache['hit_tokens']:,} of {cache['query_tokens']:,} ({_pct(cache['hit_rate'])})",
        )
        row("prefix cache evictions (blocks)", f"{cache['evictions']:,}")
    return table


MEMORY_FROM = 8
"""The bench table's columns from this one on (after the scheduler's) are shares of memory."""


def bench_table(rows: Sequence[BenchRow], title: str) -> Table:
    """Rows of one workload of ``pagedkv bench`` (``experiments.bench``), one per scheduler.

    Headers are short and broken over lines so that twelve columns fit 120 characters.
    """
    return _bench_table(rows, title, list(range(len(_bench_columns(rows)))))


def bench_tables(rows: Sequence[BenchRow], title: str, console: Console) -> list[Table]:
    """``bench_table``, or where it is wider than ``console`` several tables stacked, each
    with the scheduler and as many of the next columns as fit whole: no cell is cut."""

    def width(columns: list[int], part: str) -> int:
        table = _bench_table(rows, part, columns)
        return Measurement.get(console, unbounded, table).maximum

    unbounded = console.options.update_width(10**6)  # a table's natural width, uncut
    groups: list[list[int]] = [[]]
    for i in range(len(_bench_columns(rows))):
        if groups[-1] and width([*groups[-1], i], title) > console.width:
            groups.append([])
        groups[-1].append(i)
    if len(groups) == 1:
        return [bench_table(rows, title)]
    return [
        _bench_table(rows, f"{title} ({k} of {len(groups)})", columns)
        for k, columns in enumerate(groups, 1)
    ]


def _bench_columns(rows: Sequence[BenchRow]) -> list[str]:
    per = "tick" if rows[0].clock == "ticks" else "s"
    return [
        "finished",
        "iters",
        "sim time",
        f"req/{per}",
        "max\nrun.",
        "mean\nrun.",
        "pre-\nempt.",
        "p99 lat.\nper token",
        "token\nutil.",
        "pool\nocc.",
        "frag.",
    ]


def _bench_cells(r: BenchRow) -> list[str]:
    latency = r.p99_normalized_latency
    return [
        f"{r.finished:,}/{r.num_requests:,}",
        f"{r.iterations:,}",
        f"{r.sim_time:,.1f}",
        fmt_sig(r.request_throughput),
        f"{r.max_running:,}",
        f"{r.mean_running:,.1f}",
        f"{r.preemptions:,}",
        "-" if latency is None else fmt_sig(latency),
        _pct(r.token_utilization),
        _pct(r.pool_occupancy),
        _pct(r.fragmentation),
    ]


def _bench_table(rows: Sequence[BenchRow], title: str, columns: list[int]) -> Table:
    memory = columns[-1] >= MEMORY_FROM
    table = Table(
        title=f"{title}; times in {rows[0].clock}",
        caption=(
            "memory columns: time-weighted shares of the KV capacity; "
            "frag. = internal + external fragmentation"
            if memory
            else None
        ),
    )
    table.add_column("scheduler", no_wrap=True)
    headers = _bench_columns(rows)
    for i in columns:
        table.add_column(headers[i], justify="right", no_wrap=True)
    for r in rows:
        cells = _bench_cells(r)
        table.add_row(
            r.scheduler + ("\n[bold red]deadlocked[/]" if r.deadlocked else ""),
            *(cells[i] for i in columns),
        )
    return table

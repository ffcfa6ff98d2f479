"""``run_sweep``: every point of a spec through ``run_points``, journaled, into one tidy table.

Each finished point is appended to ``journal.jsonl`` (flushed) the moment it arrives; the table
(``results.csv``, ``results.parquet``) is rebuilt from the journal at the end, sorted by point,
also after a Ctrl-C. A rerun with the same ``--out`` runs only the points not in the journal, so
the final table is the same whether the sweep ran once or was interrupted and resumed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagedkv.simulation import SimulationConfig, simulate
from pagedkv.sweep.journal import Journal
from pagedkv.sweep.pool import check_backend, run_points
from pagedkv.sweep.spec import SweepPoint, SweepSpec
from pagedkv.sweep.table import columns_of, flatten_summary, write_tables

JOURNAL = "journal.jsonl"
PointFn = Callable[[dict[str, Any]], dict[str, Any]]


def run_point(options: dict[str, Any]) -> dict[str, Any]:
    """One point, where the worker runs it: flat options in, flat scalar metrics out."""
    return flatten_summary(simulate(SimulationConfig.from_flat(options)).summary)


@dataclass(frozen=True)
class SweepOutcome:
    total: int
    ran: int
    skipped: int
    failed: int
    interrupted: bool
    files: list[Path] = field(default_factory=list)


def run_sweep(
    spec: SweepSpec,
    out: Path,
    *,
    backend: str = "local",
    workers: int | None = None,
    address: str | None = None,
    progress: str | None = None,
    retry_failed: bool = False,
    fn: PointFn = run_point,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> SweepOutcome:
    """Run the points of ``spec`` not yet in ``out/journal.jsonl`` and write the table.

    Everything is validated (every point's config, the backend) before a point runs.
    ``fn`` (module-level, picklable) and ``on_row`` (called in this process after each point is
    journaled) exist for tests and benchmarks. A ``KeyboardInterrupt`` still writes the table of
    what finished, then propagates.
    """
    points = spec.points()
    check_backend(backend, workers)
    journal = Journal(out / JOURNAL)
    todo = [p for p in points if _needs_run(journal.rows.get(p.point_id), retry_failed)]
    ran = 0
    interrupted = False
    try:
        outcomes = run_points(
            fn,
            [p.options for p in todo],
            backend=backend,
            workers=workers,
            address=address,
            progress=progress,
        )
        for o in outcomes:
            point = todo[o.index]
            entry = {
                "point_id": point.point_id,
                "options": point.options,
                "error": o.error,
                "metrics": o.value or {},
            }
            journal.append(entry)
            ran += 1
            if on_row is not None:
                on_row(entry)
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        journal.close()
        rows = table_rows(spec, points, journal.rows)
        leading = ["point", "point_id", *spec.varied_keys, "seed", "error"]
        files = write_tables(rows, columns_of(rows, leading), out) if rows else []
    failed = sum(1 for r in rows if r["error"] is not None)
    return SweepOutcome(len(points), ran, len(points) - len(todo), failed, interrupted, files)


def _needs_run(entry: dict[str, Any] | None, retry_failed: bool) -> bool:
    return entry is None or (retry_failed and entry.get("error") is not None)


def table_rows(
    spec: SweepSpec, points: list[SweepPoint], done: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """One row per finished point of this spec, in point order (journal entries of points the
    spec no longer has are kept in the journal but left out of the table)."""
    rows = []
    for p in points:
        entry = done.get(p.point_id)
        if entry is None:
            continue
        rows.append(
            {
                "point": p.index,
                "point_id": p.point_id,
                **p.varied,
                "seed": p.options["seed"],
                "error": entry.get("error"),
                **entry.get("metrics", {}),
            }
        )
    return rows

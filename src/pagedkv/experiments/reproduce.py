"""``pagedkv reproduce``: every experiment, the block map, the claims and the HTML report."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from pagedkv.experiments import framework
from pagedkv.experiments.claims import run_claims
from pagedkv.experiments.registry import EXPERIMENTS


def reproduce(
    out: Path,
    *,
    quick: bool = False,
    workers: int | None = None,
    say: Callable[[str], None] = print,
) -> Path:
    """Run everything into ``out``; return the report's path. ``say`` reports each step and
    its wall time, which ``out/timings.json`` records for the report's summary (the one file
    that differs between two runs; no result depends on it)."""
    start = time.perf_counter()
    steps: dict[str, float] = {}
    for name, module in EXPERIMENTS.items():
        t = time.perf_counter()
        framework.run_experiment(module, quick=quick, out=out / name, workers=workers)
        steps[name] = round(time.perf_counter() - t, 1)
        say(f"{name}: {out / name} ({steps[name]:.0f} s)")
    from pagedkv.report.block_map import run_block_map

    t = time.perf_counter()
    run_block_map(out / "block-map", quick=quick)
    steps["block-map"] = round(time.perf_counter() - t, 1)
    say(f"block-map: {out / 'block-map'} ({steps['block-map']:.0f} s)")
    t = time.perf_counter()
    claims = run_claims(out, quick=quick, workers=workers)
    steps["claims"] = round(time.perf_counter() - t, 1)
    for c in claims:
        say(f"  claim {c.id}: {c.verdict}")
    say(f"claims: {out / 'claims'}")
    from pagedkv.io import atomic_write_json
    from pagedkv.report.html import build_report
    from pagedkv.report.overview import TIMINGS

    command = "pagedkv reproduce" + (" --quick" if quick else "")
    total = round(time.perf_counter() - start, 1)
    atomic_write_json(out / TIMINGS, {"command": command, "steps": steps, "total_s": total})

    report = build_report(out)
    say(f"report: {report}")
    say(f"total: {time.perf_counter() - start:.0f} s")
    return report

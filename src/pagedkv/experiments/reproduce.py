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
    its wall time (for the user; nothing written depends on it)."""
    start = time.perf_counter()
    for name, module in EXPERIMENTS.items():
        t = time.perf_counter()
        framework.run_experiment(module, quick=quick, out=out / name, workers=workers)
        say(f"{name}: {out / name} ({time.perf_counter() - t:.0f} s)")
    from pagedkv.report.block_map import run_block_map

    t = time.perf_counter()
    run_block_map(out / "block-map", quick=quick)
    say(f"block-map: {out / 'block-map'} ({time.perf_counter() - t:.0f} s)")
    claims = run_claims(out, quick=quick, workers=workers)
    for c in claims:
        say(f"  claim {c.id}: {c.verdict}")
    say(f"claims: {out / 'claims'}")
    from pagedkv.report.html import build_report

    report = build_report(out)
    say(f"report: {report}")
    say(f"total: {time.perf_counter() - start:.0f} s")
    return report

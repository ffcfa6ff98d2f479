"""What `pagedkv simulate --json` spends outside the event loop, phase by phase, at scale.

The phases of one run, timed in one process: the workload (``make_workload``), the engine
built (the workload again, each spec turned into its ``Request``), the event loop itself (for
scale: another benchmark's business, ``bench_engine.py``), the summary, the per-request
records, and the JSON streamed into a file; with the peak resident memory after each. The
issue's target is the whole at 10^6 ShareGPT-like requests at 2 req/s (OPT-13B, A100-40GB,
vllm, recompute): under 60 s and 1.5 GB. Seconds are noisy on a shared machine; compare
trees side by side in one sitting.

    python benchmarks/bench_outside.py [--requests 200000] [--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import resource
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from pagedkv.engine.metrics import request_record, summarize
from pagedkv.io import atomic_write_json
from pagedkv.simulation import SimulationConfig, SimulationResult, build_engine
from pagedkv.workloads.factory import make_workload


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def phases(requests: int) -> list[tuple[str, float, float]]:
    """(phase, seconds, peak MB so far) for one run of ``requests`` requests."""
    config = SimulationConfig.from_flat(
        {
            "model": "OPT-13B",
            "gpu": "A100-40GB",
            "scheduler": "vllm",
            "preemption_mode": "recompute",
            "workload": "sharegpt-like",
            "num_requests": requests,
            "request_rate": 2.0,
            "seed": 0,
        }
    )
    rows: list[tuple[str, float, float]] = []

    def timed(name: str, start: float) -> None:
        rows.append((name, time.perf_counter() - start, _peak_mb()))

    t = time.perf_counter()
    specs = make_workload(config.workload)
    timed("workload", t)
    del specs
    t = time.perf_counter()
    engine = build_engine(config)
    timed("engine built (workload included)", t)
    t = time.perf_counter()
    run = engine.run()
    timed("event loop", t)
    t = time.perf_counter()
    summary = summarize(run.requests, run.totals, run.sim_time, engine.scheduler.kv.capacity)
    timed("summary", t)
    t = time.perf_counter()
    records = []  # as simulate makes them: each request let go as its record is made
    run.requests.reverse()
    while run.requests:
        records.append(request_record(run.requests.pop()))
    timed("records", t)
    result = SimulationResult(config.to_flat(), summary, records, [])
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        atomic_write_json(Path(d) / "run.json", result.to_dict())
        timed("JSON written", t)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--json", type=Path, help="Write the figures here too.")
    args = parser.parse_args()
    gc.disable()  # as simulate runs: the collector paused from the workload to the records
    try:
        rows = phases(args.requests)
    finally:
        gc.enable()
    table = Table(title=f"simulate --json outside the event loop, {args.requests} requests")
    for column in ("phase", "s", "peak MB"):
        table.add_column(column)
    for name, seconds, peak in rows:
        table.add_row(name, f"{seconds:.2f}", f"{peak:.0f}")
    Console().print(table)
    if args.json:
        atomic_write_json(
            args.json,
            {
                "requests": args.requests,
                "phases": [{"phase": n, "s": s, "peak_mb": p} for n, s, p in rows],
            },
        )


if __name__ == "__main__":
    main()

"""Simulator speed: a large ShareGPT-like Poisson run, and fast-forward against --reference.

    python benchmarks/bench_engine.py [--requests 100000] [--slice 2000] [--rate 1.5] [--repeat 3]

Reports wall time, simulated requests per wall second and peak memory (RSS) of the large run,
and, on a slice run both ways in the same process (alternating, ``--repeat`` times; a fast
measurement repeats the fast run for as long as a reference run takes, so both average over the
same span of this noisy machine; the fastest measurement of each is kept), the fast-forward's
speed-up over stepping every iteration (the two runs' summaries must agree). The slice's
seconds are the engine runs: drawing the workload is the same work in both and is timed apart
(the ratio with it is given too); the large run's wall time includes it. Ratios, not absolute
seconds, are what to compare across machines.
"""

from __future__ import annotations

import argparse
import math
import resource
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from pagedkv.engine.metrics import summarize
from pagedkv.io import atomic_write_json
from pagedkv.simulation import SimulationConfig, build_engine


def run(requests: int, rate: float, reference: bool) -> tuple[float, float, dict[str, Any]]:
    """Wall seconds to build the engine (the workload drawn) and to run it, and the summary;
    the summary also gets ``scheduler_rounds`` and ``windows`` (the fast-forward's), whose sum
    is the events the run paid for."""
    config = SimulationConfig.from_flat(
        {
            "model": "OPT-13B",
            "gpu": "A100-40GB",
            "scheduler": "vllm",
            "preemption_mode": "recompute",
            "workload": "sharegpt-like",
            "num_requests": requests,
            "request_rate": rate,
            "seed": 0,
            "reference": reference,
        }
    )
    t0 = time.perf_counter()
    engine = build_engine(config)
    t1 = time.perf_counter()
    result = engine.run()
    t2 = time.perf_counter()
    summary = summarize(
        result.requests, result.totals, result.sim_time, engine.scheduler.kv.capacity
    )
    ff = engine.fast_forward
    summary["windows"] = ff.windows if ff is not None else 0
    summary["scheduler_rounds"] = summary["iterations"] - (ff.rounds if ff is not None else 0)
    return t1 - t0, t2 - t1, summary


def close(a: Any, b: Any) -> bool:
    """Equal, floats to 1e-9 relative (the fast-forward sums series in closed form)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return bool(a == b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--slice", type=int, default=2_000)
    parser.add_argument("--rate", type=float, default=1.5, help="requests per second")
    parser.add_argument(
        "--repeat", type=int, default=3, help="slice measurements each way, alternating"
    )
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()

    # The slice both ways, alternating, ``--repeat`` times. The machine's speed drifts over
    # seconds, so each fast measurement repeats the fast run until it has taken as long as the
    # reference run before it (the mean per run is kept): both sides then average over the same
    # span of time. The fastest measurement of each gives the ratio; each pair's ratio shows the
    # spread.
    pairs = []
    for _ in range(args.repeat):
        ref_build, ref_s, ref = run(args.slice, args.rate, reference=True)
        builds: list[float] = []
        runs: list[float] = []
        while not runs or sum(runs) < ref_s:
            fast_build, fast_run, fast = run(args.slice, args.rate, reference=False)
            builds.append(fast_build)
            runs.append(fast_run)
        pairs.append((ref_build, ref_s, min(builds), sum(runs) / len(runs)))
    ref_build, ref_s = min(p[0] for p in pairs), min(p[1] for p in pairs)
    fast_build, fast_s = min(p[2] for p in pairs), min(p[3] for p in pairs)
    spread = [p[1] / p[3] for p in pairs]
    events = fast.pop("scheduler_rounds") + fast.pop("windows")
    ref.pop("scheduler_rounds"), ref.pop("windows")
    agree = close(ref, fast)  # the whole summary: counts exact, time-weighted floats close
    # Skipping iterations cannot buy more than the iterations per event the run has.
    per_event = fast["iterations"] / events
    big_build, big_run, big = run(args.requests, args.rate, reference=False)
    big_s = big_build + big_run
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    rounds, windows = big["scheduler_rounds"], big["windows"]

    table = Table(title="pagedkv simulator speed (OPT-13B, A100-40GB, vllm, ShareGPT-like)")
    for col in ("run", "requests", "iterations", "wall s", "sim req / wall s", "note"):
        table.add_column(col, justify="left" if col in ("run", "note") else "right")
    table.add_row(
        "reference",
        str(args.slice),
        str(ref["iterations"]),
        f"{ref_s:.2f}",
        f"{args.slice / ref_s:,.0f}",
        "steps every iteration",
    )
    table.add_row(
        "fast-forward",
        str(args.slice),
        str(fast["iterations"]),
        f"{fast_s:.2f}",
        f"{args.slice / fast_s:,.0f}",
        f"{ref_s / fast_s:.1f}x the reference (engine runs, fastest of {args.repeat} "
        "measurements each, a fast one as long as a reference run; "
        f"pairs {min(spread):.1f}-{max(spread):.1f}x; "
        f"{(ref_build + ref_s) / (fast_build + fast_s):.1f}x with the workload drawn); "
        f"summaries agree: {agree}; {events:,} events, {per_event:.1f} iterations per event",
    )
    table.add_row(
        "fast-forward",
        str(args.requests),
        str(big["iterations"]),
        f"{big_s:.2f}",
        f"{args.requests / big_s:,.0f}",
        f"peak RSS {peak_mb:,.0f} MiB; workload {big_build:.1f} s, run {big_run:.1f} s; "
        f"{rounds:,} scheduler rounds + {windows:,} windows",
    )
    Console().print(table)
    if args.json:
        atomic_write_json(
            args.json,
            {
                "slice": {
                    "requests": args.slice,
                    "reference_s": ref_s,
                    "fast_s": fast_s,
                    "speedup": ref_s / fast_s,
                    "repeat": args.repeat,
                    "pair_speedups": spread,
                    "build_s": {"reference": ref_build, "fast": fast_build},
                    "agree": agree,
                    "events": events,
                    "iterations_per_event": per_event,
                },
                "large": {
                    "requests": args.requests,
                    "wall_s": big_s,
                    "build_s": big_build,
                    "run_s": big_run,
                    "requests_per_s": args.requests / big_s,
                    "peak_rss_mib": peak_mb,
                    "iterations": big["iterations"],
                },
            },
        )


if __name__ == "__main__":
    main()

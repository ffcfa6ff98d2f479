"""Simulator speed: a large ShareGPT-like Poisson run, and fast-forward against --reference.

    python benchmarks/bench_engine.py [--requests 100000] [--slice 2000] [--rate 1.5] [--repeat 5]

Reports wall time, simulated requests per wall second and peak memory (RSS) of the large run,
and, on a slice run both ways in the same process, the fast-forward's speed-up over stepping
every iteration (the two runs' summaries must agree). The slice's seconds are the engine runs:
drawing the workload is the same work in both and is timed apart (the ratio with it is given
too); the large run's wall time includes it. Ratios, not absolute seconds, are what to compare
across machines.

How the ratio is measured: this machine's speed drifts by tens of percent over seconds, so the
two sides must be timed at the same moments. Each of ``--repeat`` pairs runs the fast run for
about half a reference run's time, then the reference once, then the fast run for as long again
(A B A: the fast side's mean per run brackets the reference, so a drift that is linear over the
pair cancels). A pair's ratio is the reference over that mean; the speed-up reported is the
median pair (a pair that a sudden change of speed straddles is an outlier either way), with
every pair shown. One reference run before the pairs warms up and sets the spans.
"""

from __future__ import annotations

import argparse
import math
import resource
import statistics
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
        "--repeat", type=int, default=5, help="A B A pairs of slice measurements (odd: a median)"
    )
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    for flag in ("requests", "slice", "repeat"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    if not args.rate > 0:
        parser.error(f"--rate must be > 0, got {args.rate}")

    # The slice both ways in A B A pairs (the module docstring says why).
    _, span, _ = run(args.slice, args.rate, reference=True)  # warm-up; sets the spans

    def fast_span(seconds: float) -> tuple[float, float, dict[str, Any]]:
        """Fast runs for about ``seconds``: the fastest build and the mean run."""
        builds: list[float] = []
        runs: list[float] = []
        while not runs or sum(runs) < seconds:
            fast_build, fast_run, summary = run(args.slice, args.rate, reference=False)
            builds.append(fast_build)
            runs.append(fast_run)
        return min(builds), statistics.fmean(runs), summary

    pairs = []  # (reference build, reference run, fast build, fast run), seconds
    for _ in range(args.repeat):
        before_build, before, fast = fast_span(span / 2)
        ref_build, span, ref = run(args.slice, args.rate, reference=True)
        after_build, after, fast = fast_span(span / 2)
        pairs.append((ref_build, span, min(before_build, after_build), (before + after) / 2))
    spread = [p[1] / p[3] for p in pairs]
    middle = sorted(range(len(pairs)), key=lambda i: spread[i])[len(pairs) // 2]
    ref_build, ref_s, fast_build, fast_s = pairs[middle]  # the median pair
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
        f"{ref_s / fast_s:.1f}x the reference (engine runs; the median of {args.repeat} "
        "A B A pairs, fast runs around a reference run; "
        f"pairs {', '.join(f'{x:.1f}' for x in sorted(spread))}x; "
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

"""Simulator speed: a large ShareGPT-like Poisson run, and fast-forward against --reference.

    python benchmarks/bench_engine.py [--requests 100000] [--slice 2000] [--rate 1.5] [--repeat 5]
    python benchmarks/bench_engine.py --cases [--requests 20000] [--repeat 3]


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

``--cases``: the base run (vllm, recompute, ``--rate``) against runs that each change one thing
(``CASES``), every one in a fresh process (so its peak RSS is its own), round robin over
``--repeat`` rounds, so a drift of the machine's speed reaches every case alike. Per case: the
median and the fastest round's wall seconds per request (the workload drawn and the engine run,
not the interpreter's start; on a shared machine the fastest is the least disturbed), the peak
RSS, and each as a ratio to the base run's; the JSON adds the RSS after the imports (what every
case pays before any work).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from pagedkv.engine.metrics import summarize
from pagedkv.io import atomic_write_json
from pagedkv.simulation import SimulationConfig, build_engine

CASES: dict[str, dict[str, Any]] = {
    "base": {},
    "rate 10": {"request_rate": 10.0},
    "chunked prefill": {"enable_chunked_prefill": True},
    "prefix caching": {
        "workload": "shared-prefix",
        "prefix_len": 200,
        "enable_prefix_caching": True,
    },
    "swap": {"preemption_mode": "swap", "request_rate": 10.0},
    "reserve": {"scheduler": "reserve"},
    "orca-oracle": {"scheduler": "orca-oracle"},
    "vllm-v1": {"scheduler": "vllm-v1"},
    "vllm-v1 prefix caching": {
        "scheduler": "vllm-v1",
        "workload": "shared-prefix",
        "prefix_len": 200,
        "enable_prefix_caching": True,
    },
}
"""What each ``--cases`` run changes in the base run's flat config. Swap runs at rate 10, where
the base policy preempts (at the base rate it seldom does, and swap would be the base run)."""


def run(
    requests: int, rate: float, reference: bool, case: str = "base"
) -> tuple[float, float, dict[str, Any]]:
    """Wall seconds to build the engine (the workload drawn) and to run it, and the summary;
    the summary also gets ``scheduler_rounds`` and ``windows`` (the fast-forward's), whose sum
    is the events the run paid for."""
    flat: dict[str, Any] = {
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
    config = SimulationConfig.from_flat(flat | CASES[case])
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


def same(a: Any, b: Any) -> bool:
    """Byte-identical as JSON (the clock counts integer ticks: both paths give the same
    integers, so the same floats)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def rss_mib() -> float:
    """This process's resident memory now (Linux ``/proc``), MiB."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def one_case(case: str, requests: int, rate: float) -> None:
    """Run one case in this (fresh) process; print its figures as one JSON line."""
    imported = rss_mib()
    build, run_s, summary = run(requests, rate, reference=False, case=case)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    out = {"wall_s": build + run_s, "build_s": build, "peak_mib": peak, "imports_mib": imported}
    print(json.dumps(out | {"iterations": summary["iterations"]}))


def cases(requests: int, rate: float, repeat: int, path: str | None) -> None:
    """Every case in a fresh process, round robin over ``repeat`` rounds (module docstring)."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in CASES}
    for _ in range(repeat):
        for name in CASES:
            argv = [sys.executable, __file__, "--one-case", name, "--requests", str(requests)]
            done = subprocess.run(
                [*argv, "--rate", str(rate)], check=True, capture_output=True, text=True
            )
            runs[name].append(json.loads(done.stdout.splitlines()[-1]))
    rows = {}
    for name, got in runs.items():
        walls = [r["wall_s"] for r in got]
        rows[name] = {
            "us_per_request": statistics.median(walls) / requests * 1e6,
            "fastest_us_per_request": min(walls) / requests * 1e6,
            "peak_mib": statistics.median(r["peak_mib"] for r in got),
            "imports_mib": statistics.median(r["imports_mib"] for r in got),
            "iterations": got[0]["iterations"],
            "runs_s": walls,
        }
    base = rows["base"]
    table = Table(title=f"pagedkv cases: {requests:,} requests, {repeat} rounds")
    columns = ("us / request", "x base", "fastest", "x base", "peak MiB", "x base", "runs s")
    for col in ("case", *columns):
        table.add_column(col, justify="left" if col == "case" else "right")
    for name, row in rows.items():
        row["cost_ratio"] = row["us_per_request"] / base["us_per_request"]
        row["fastest_ratio"] = row["fastest_us_per_request"] / base["fastest_us_per_request"]
        row["memory_ratio"] = row["peak_mib"] / base["peak_mib"]
        table.add_row(
            name,
            f"{row['us_per_request']:,.0f}",
            f"{row['cost_ratio']:.2f}",
            f"{row['fastest_us_per_request']:,.0f}",
            f"{row['fastest_ratio']:.2f}",
            f"{row['peak_mib']:,.0f}",
            f"{row['memory_ratio']:.2f}",
            ", ".join(f"{s:.1f}" for s in row["runs_s"]),
        )
    Console(width=120).print(table)
    if path:
        atomic_write_json(path, {"requests": requests, "rate": rate, "cases": rows})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, help="default 100000 (20000 with --cases)")
    parser.add_argument("--slice", type=int, default=2_000)
    parser.add_argument("--rate", type=float, default=1.5, help="requests per second")
    parser.add_argument(
        "--repeat", type=int, default=5, help="A B A pairs of slice measurements (odd: a median)"
    )
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--cases", action="store_true", help="per-case cost and memory")
    parser.add_argument("--one-case", choices=CASES, help=argparse.SUPPRESS)  # a child run
    args = parser.parse_args()
    if args.requests is None:
        args.requests = 20_000 if args.cases else 100_000
    for flag in ("requests", "slice", "repeat"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    if not args.rate > 0:
        parser.error(f"--rate must be > 0, got {args.rate}")
    if args.one_case:
        one_case(args.one_case, args.requests, args.rate)
        return
    if args.cases:
        cases(args.requests, args.rate, args.repeat, args.json)
        return

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
    agree = same(ref, fast)  # the whole summary, byte for byte
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

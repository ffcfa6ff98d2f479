"""Sweep fan-out: the same 200 small simulations serial in-process, on the local process pool
and on Ray, in one run.

    python benchmarks/bench_sweep.py [--points 200] [--requests 20] [--workers N]
                                     [--address auto] [--no-ray] [--json PATH]

Reports, per backend, wall seconds, points per second and the overhead per point: the
worker-seconds spent on anything but simulating (pickling, IPC, scheduling, the pool's or
Ray's start-up inside the run), i.e. ``(wall x workers - serial) / points``. Ray's own start-up
(``ray.init``) is timed separately. With points this small the overhead is the story; a point
that simulates for seconds hides it. Compare ratios, not absolute seconds, across machines.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from pagedkv.io import atomic_write_json
from pagedkv.sweep.pool import run_points
from pagedkv.sweep.spec import SweepSpec
from pagedkv.sweep.sweep import run_point


def points(n: int, requests: int) -> list[dict[str, Any]]:
    """``n`` distinct small points: block sizes x schedulers x rates x seeds, cut to ``n``."""
    spec = SweepSpec.from_dict(
        {
            "workload": "sharegpt-like",
            "num_requests": requests,
            "grid": {
                "block_size": [8, 16, 32, 64],
                "scheduler": ["vllm", "orca-max", "orca-oracle", "reserve", "static"],
                "request_rate": [1.0, 4.0, 16.0],
            },
            "seeds": max(1, -(-n // 60)),
        }
    )
    return [p.options for p in spec.points()[:n]]


def timed(backend: str, pts: list[dict[str, Any]], workers: int, address: str | None) -> float:
    t0 = time.perf_counter()
    outcomes = list(run_points(run_point, pts, backend=backend, workers=workers, address=address))
    wall = time.perf_counter() - t0
    errors = [o.error for o in outcomes if o.error is not None]
    if len(outcomes) != len(pts) or errors:
        raise SystemExit(f"{backend}: {len(outcomes)} outcomes, errors: {errors[:3]}")
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--points", type=int, default=200)
    parser.add_argument("--requests", type=int, default=20, help="requests per simulation")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--address", help="a Ray cluster (auto, ray://host:10001)")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray backend")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()

    pts = points(args.points, args.requests)
    t0 = time.perf_counter()
    for p in pts:
        run_point(p)
    serial = time.perf_counter() - t0
    rows: list[dict[str, Any]] = [{"backend": "serial in-process", "workers": 1, "wall_s": serial}]
    rows.append({"backend": "local pool", "workers": args.workers})
    rows[-1]["wall_s"] = timed("local", pts, args.workers, None)
    ray_init_s = None
    if not args.no_ray:
        try:
            import ray
        except ImportError:
            print("Ray is not installed: skipped (pip install 'pagedkv[ray]')")
        else:
            t0 = time.perf_counter()
            local = args.address is None
            ray.init(
                address=args.address,
                num_cpus=args.workers if local else None,
                include_dashboard=False,
                log_to_driver=False,
            )
            ray_init_s = time.perf_counter() - t0
            cpus = args.workers if local else int(ray.cluster_resources().get("CPU", 1))  # type: ignore[no-untyped-call]
            rows.append({"backend": "ray", "workers": cpus})
            rows[-1]["wall_s"] = timed("ray", pts, cpus, args.address)
            ray.shutdown()
    for row in rows:
        row["points_per_s"] = len(pts) / row["wall_s"]
        row["overhead_ms_per_point"] = (row["wall_s"] * row["workers"] - serial) / len(pts) * 1e3

    table = Table(
        title=f"{len(pts)} sweep points ({args.requests} ShareGPT-like requests each), "
        f"serial {serial / len(pts) * 1e3:.1f} ms a point"
    )
    for col in ("backend", "workers", "wall s", "points / s", "overhead ms / point"):
        table.add_column(col, justify="left" if col == "backend" else "right")
    for row in rows:
        table.add_row(
            row["backend"],
            str(row["workers"]),
            f"{row['wall_s']:.2f}",
            f"{row['points_per_s']:.1f}",
            f"{row['overhead_ms_per_point']:.1f}",
        )
    console = Console()
    console.print(table)
    if ray_init_s is not None:
        console.print(f"ray.init: {ray_init_s:.1f} s (not in the Ray row)")
    if args.json:
        atomic_write_json(args.json, {"points": len(pts), "ray_init_s": ray_init_s, "rows": rows})


if __name__ == "__main__":
    main()

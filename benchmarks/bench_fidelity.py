"""Simulator fidelity: the profiled cost model and the roofline against the real executor.

    python benchmarks/bench_fidelity.py [--models tiny-llama small-llama llama-110m]
        [--block-sizes 1 16 64] [--requests 24] [--budget-s 30] [--json PATH]

A thin wrapper over ``pagedkv profile`` and ``pagedkv fidelity`` (``pagedkv.tensors.profiler``,
``pagedkv.tensors.fidelity``): each model is profiled once (its own runs), then every workload
below runs at every block size through the real executor and the simulator. Workloads (the
evaluated ones are seeded apart from the profile's calibration runs):

* ``poisson``: Poisson arrivals at about half of what decode batches of 8 sustain (from the
  profile), memory ample (4096 token slots at every block size);
* ``chunked+prefix``: chunked prefill (budget 256 tokens) and prefix caching, every prompt
  starting with one 32-token prefix;
* ``recompute`` / ``swap``: all arrivals at once into 640 token slots, so preemption happens.

Per run: the per-step |error| (median, p90) and the sim / real - 1 of output-token throughput,
mean TTFT and mean TPOT, for the profiled model, the roofline of the same machine and a second
real run (the noise floor: real vs real); and the profile without its ``layer_residual`` (the
operators' sum alone) on the same runs; and ``replay``, the simulator with every step
taking what the real run measured for its shape (the median): what one shape's spread of
measured times does to the TTFT and TPOT through the schedule, which no cost model removes.
One torch thread, timed with this thread's CPU time (other processes do not count), each real
step the median of ``--repeats`` timings. A second table gives each step kind's signed error
(``by_kind``: decode, prefill, recompute, swap, copies) beside the same of the second real run.

A shared machine's speed also drifts between the profile's runs and the evaluated ones (other
processes contend for the caches and memory, which this thread's CPU time does not hide), so
each model is profiled a second time after its runs: ``drift`` is the median (and largest)
|second / first - 1| of the two profiles' prices of the same steps (decode batches of 1..16
sequences over 64..512-token contexts, and single prefills of 16..512 tokens), printed per
model: the floor of a profile against runs taken minutes apart.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from pagedkv.engine.batch_shape import BatchShape
from pagedkv.engine.profiled_cost import ProfiledCost
from pagedkv.io import atomic_write_json
from pagedkv.tensors.fidelity import fidelity
from pagedkv.tensors.model_shapes import resolve_model
from pagedkv.tensors.profile_config import FidelityConfig, ProfileConfig
from pagedkv.tensors.profiler import profile

SLOTS = 640  # token slots of the preemption workloads
AMPLE = 4096  # token slots of the others (256 blocks of 16), the same at every block size


def workloads(rate: float, bs: int) -> dict[str, dict[str, Any]]:
    return {
        "poisson": {"request_rate": rate, "num_gpu_blocks": AMPLE // bs},
        "chunked+prefix": {
            "request_rate": rate,
            "num_gpu_blocks": AMPLE // bs,
            "enable_chunked_prefill": True,
            "max_num_batched_tokens": 256,
            "enable_prefix_caching": True,
            "shared_prefix_len": 32,
        },
        "recompute": {"num_gpu_blocks": SLOTS // bs, "preemption_mode": "recompute"},
        "swap": {"num_gpu_blocks": SLOTS // bs, "preemption_mode": "swap"},
    }


def _operators(o: dict[str, Any] | None) -> str:
    """The profile without its whole-step term (``layer_residual``) on the same runs."""
    if o is None:
        return "-"
    e = o["step_error"]
    return f"{e['median']:.0%}/{e['p90']:.0%}, {o['ttft_error']:+.1%}"


def step_kind(step: dict[str, Any]) -> str:
    """A real step's kind (``fidelity``'s ``steps`` records): what it runs beyond its batch."""
    if step["swap_in"] or step["swap_out"]:
        return "swap"
    if step["copies"]:
        return "copies"
    if step["recomputes"]:
        return "recompute"
    return "prefill" if any(n > 1 for n, _ in step["chunks"]) else "decode"


def by_kind(steps: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per step kind: how many, the signed median of profiled / measured - 1, and of the second
    real run's time against the first over the steps both ran alike (the floor; None where
    none did): a kind priced off by more than its floor, one way, is the model's."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for step in steps:
        groups.setdefault(step_kind(step), []).append(step)
    out: dict[str, dict[str, Any]] = {}
    for kind, group in sorted(groups.items()):
        again = [
            x["measured_again_s"] / x["measured_s"] - 1 for x in group if "measured_again_s" in x
        ]
        out[kind] = {
            "steps": len(group),
            "signed_median": statistics.median(
                x["profiled_s"] / x["measured_s"] - 1 for x in group
            ),
            "floor_signed_median": statistics.median(again) if again else None,
        }
    return out


def _kinds_text(groups: dict[str, dict[str, Any]]) -> str:
    parts = []
    for kind, g in groups.items():
        floor = g["floor_signed_median"]
        text = f"{kind} {g['steps']}: {g['signed_median']:+.1%}"
        parts.append(text if floor is None else f"{text} ({floor:+.1%})")
    return ", ".join(parts)


def drift_shapes() -> list[BatchShape]:
    """The steps the two profiles of a model are compared on (module docstring)."""
    decode = [BatchShape.decode(s, c) for s in range(1, 17) for c in (64, 128, 256, 512)]
    prefill = [BatchShape.from_chunks([(t, 0)]) for t in (16, 32, 64, 128, 256, 512)]
    return decode + prefill


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--models", nargs="+", default=["tiny-llama", "small-llama", "llama-110m"])
    parser.add_argument("--block-sizes", nargs="+", type=int, default=[1, 16, 64])
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--budget-s", type=float, default=30.0)
    parser.add_argument("--workloads", nargs="+", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    console = Console(width=180)
    table = Table(
        title="simulated vs real: profiled | roofline | real again (same machine, same runs)"
    )
    for col in ("model", "workload", "bs", "iters real/sim", "step med", "step p90"):
        table.add_column(col)
    for col in ("throughput", "TTFT", "TPOT"):
        table.add_column(col, justify="right")
    table.add_column("operators' sum: step med/p90, TTFT", justify="right")
    table.add_column("replay: TTFT, TPOT", justify="right")
    kinds = Table(title="signed error by step kind: profiled / real - 1 (real again / real - 1)")
    for col in ("model", "workload", "bs", "steps: signed median (floor)"):
        kinds.add_column(col)
    results: list[dict[str, Any]] = []
    drift: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            cfg = ProfileConfig(
                model=model, block_sizes=tuple(args.block_sizes), budget_s=args.budget_s
            )
            prof = profile(cfg)
            path = Path(tmp) / f"{model}.json"
            prof.write(path)
            _, spec = resolve_model(model, prof.dtype)
            step8 = ProfiledCost(prof, spec, args.block_sizes[0]).step_time(
                BatchShape.decode(8, 64)
            )
            rate = 0.5 * 8 / (step8 * 36)  # half of what decode batches of 8 sustain
            for bs in args.block_sizes:
                for name, flags in workloads(rate, bs).items():
                    if args.workloads and name not in args.workloads:
                        continue
                    run = fidelity(
                        FidelityConfig(
                            model=model,
                            profile=str(path),
                            num_requests=args.requests,
                            block_size=bs,
                            repeats=args.repeats,
                            noise_floor=True,
                            **flags,
                        )
                    )
                    p, r, n = run["summary"], run["roofline"], run["noise"]
                    groups = by_kind(run["steps"])
                    results.append(
                        {
                            "model": model,
                            "workload": name,
                            "block_size": bs,
                            **run,
                            "by_kind": groups,
                        }
                    )
                    kinds.add_row(model, name, str(bs), _kinds_text(groups))

                    def pair(key: str, p: Any = p, r: Any = r, n: Any = n) -> str:
                        return f"{p[key]:+.1%} | {r[key]:+.1%} | {n[key]:+.1%}"

                    def step(key: str, p: Any = p, r: Any = r, n: Any = n) -> str:
                        floor = n["step_error"][key]
                        floor_text = "-" if floor is None else f"{floor:.0%}"
                        return (
                            f"{p['step_error'][key]:.0%} | {r['step_error'][key]:.0%} | "
                            + floor_text
                        )

                    table.add_row(
                        model,
                        name,
                        str(bs),
                        f"{p['iterations_real']}/{p['iterations_sim']}",
                        step("median"),
                        step("p90"),
                        pair("throughput_error"),
                        pair("ttft_error"),
                        pair("tpot_error"),
                        _operators(run.get("operators")),
                        f"{run['replay']['ttft_error']:+.1%}, {run['replay']['tpot_error']:+.1%}",
                    )
            again = profile(cfg)
            first, second = (ProfiledCost(q, spec, args.block_sizes[0]) for q in (prof, again))
            rel = [abs(second.step_time(x) / first.step_time(x) - 1) for x in drift_shapes()]
            drift[model] = {"median": statistics.median(rel), "max": max(rel)}
    console.print(table)
    console.print(kinds)
    for model, d in drift.items():
        console.print(
            f"{model}: profile vs profile (drift) median {d['median']:.1%}, max {d['max']:.1%}"
        )
    if args.json:
        atomic_write_json(args.json, {"results": results, "drift": drift})


if __name__ == "__main__":
    main()

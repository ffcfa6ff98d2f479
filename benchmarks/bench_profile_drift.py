"""Profile against profile: how far two profiles of one model, taken back to back, price the
same steps apart (the drift ``bench_fidelity.py`` reports), and each profile's wall time.

    python benchmarks/bench_profile_drift.py [--models tiny-llama small-llama]
        [--block-sizes 1 16 64] [--budget-s 30] [--pairs 1] [--json PATH]

The steps compared are ``bench_fidelity.drift_shapes`` (decode batches of 1..16 sequences over
64..512-token contexts and single prefills of 16..512 tokens), priced at every block size
profiled: per model, the median and largest |second / first - 1| over them. Run it pinned to
one core (``taskset -c 1``) on a machine as quiet as the one the profile will serve.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from pagedkv.engine.profiled_cost import ProfiledCost
from pagedkv.io import atomic_write_json
from pagedkv.tensors.model_shapes import resolve_model
from pagedkv.tensors.profile_config import ProfileConfig
from pagedkv.tensors.profiler import profile

sys.path.insert(0, str(Path(__file__).parent))
from bench_fidelity import drift_shapes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--models", nargs="+", default=["tiny-llama", "small-llama"])
    parser.add_argument("--block-sizes", nargs="+", type=int, default=[1, 16, 64])
    parser.add_argument("--budget-s", type=float, default=30.0)
    parser.add_argument("--pairs", type=int, default=1, help="back-to-back pairs per model")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    out: dict[str, Any] = {}
    for model in args.models:
        sizes = tuple(args.block_sizes)
        cfg = ProfileConfig(model=model, block_sizes=sizes, budget_s=args.budget_s)
        rel: list[float] = []
        walls: list[float] = []
        for _ in range(args.pairs):
            profiles = []
            for _ in range(2):
                start = time.perf_counter()
                profiles.append(profile(cfg))
                walls.append(time.perf_counter() - start)
            _, spec = resolve_model(model, profiles[0].dtype)
            for bs in args.block_sizes:
                a, b = (ProfiledCost(p, spec, bs) for p in profiles)
                rel += [abs(b.step_time(x) / a.step_time(x) - 1) for x in drift_shapes()]
        out[model] = {
            "median": statistics.median(rel),
            "p90": statistics.quantiles(rel, n=10)[-1],
            "max": max(rel),
            "wall_s": walls,
        }
        d = out[model]
        print(
            f"{model}: drift median {d['median']:.1%} p90 {d['p90']:.1%} max {d['max']:.1%};"
            f" wall {', '.join(f'{w:.0f}' for w in walls)} s",
            flush=True,
        )
    if args.json:
        atomic_write_json(args.json, out)


if __name__ == "__main__":
    main()

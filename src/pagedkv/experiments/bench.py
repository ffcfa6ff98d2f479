"""``pagedkv bench``'s side-by-side simulation: every scheduler on the same workload and memory.

Two workloads, each run to the end through ``pagedkv.simulate`` for every scheduler:

* the course lesson at equal memory: 20 requests at t = 0, 100 blocks of 16 slots, maximum
  length 256, the unit clock (one tick per iteration, so times are the lesson's step counts);
  ``greedy-nopreempt``, the lesson's own policy, is added to show its deadlock;
* ShareGPT-like lengths on OPT-13B / A100-40GB (the vLLM paper's first setup, ~15.6K slots),
  roofline clock, ``SHAREGPT_REQUESTS`` Poisson arrivals at 2 requests/s, seed 0.

Only the scheduler changes within a workload, so a difference between two rows is the policy
and its memory manager. vllm preempts by recompute (its default preemption mode).
"""

from __future__ import annotations

import csv
import dataclasses
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pagedkv.simulation import SimulationConfig, SimulationResult, simulate

SCHEDULERS = (
    "vllm",
    "reserve",
    "orca-oracle",
    "orca-pow2",
    "orca-max",
    "contiguous-slots",
    "static",
)
LESSON_ONLY = ("greedy-nopreempt",)
"""On ShareGPT its deadlock is the same lesson, told again at more cost."""

SHAREGPT_REQUESTS = 500
"""Half vLLM's benchmark default (1000): ~2.5 s for all seven schedulers on one core."""
REQUEST_RATE = 2.0
"""Poisson arrivals per second: about what vllm serves here (1.7/s over 500 requests), so the
queue builds for every policy and their capacity shows in latency and time."""

LESSON = {
    "workload": "lesson",
    "num_gpu_blocks": 100,
    "block_size": 16,
    "max_model_len": 256,
    "cost_model": "unit",
}


def sharegpt(num_requests: int = SHAREGPT_REQUESTS) -> dict[str, Any]:
    """The ShareGPT-like workload's flat config."""
    return {
        "workload": "sharegpt-like",
        "num_requests": num_requests,
        "request_rate": REQUEST_RATE,
        "seed": 0,
        "model": "OPT-13B",
        "gpu": "A100-40GB",
        "cost_model": "roofline",
    }


def clock_unit(cost_model: str) -> str:
    """'ticks' under the unit clock (one per iteration), 's' under the roofline cost model."""
    return "ticks" if cost_model == "unit" else "s"


def titles(sharegpt_requests: int = SHAREGPT_REQUESTS) -> dict[str, str]:
    """Each workload's name -> a one-line description (the tables' titles)."""
    return {
        "lesson": "The lesson at equal memory, every scheduler to the end (unit clock)",
        "sharegpt-like": f"{sharegpt_requests} ShareGPT-like requests at {REQUEST_RATE:g}/s "
        "(Poisson), OPT-13B on A100-40GB (roofline clock)",
    }


@dataclass(frozen=True)
class BenchRow:
    """One scheduler's run of one workload (times in ``clock``: ticks or seconds)."""

    workload: str
    scheduler: str
    clock: str
    num_requests: int
    finished: int
    deadlocked: bool
    iterations: int
    sim_time: float
    request_throughput: float
    max_running: int
    mean_running: float
    preemptions: int
    p99_normalized_latency: float | None
    token_utilization: float | None  # None: the run held nothing (engine.metrics)
    pool_occupancy: float
    internal_fragmentation: float
    external_fragmentation: float

    @property
    def fragmentation(self) -> float:
        """Internal + external fragmentation, as a share of the capacity."""
        return self.internal_fragmentation + self.external_fragmentation

    @classmethod
    def from_result(cls, workload: str, result: SimulationResult) -> BenchRow:
        s, memory = result.summary, result.summary["memory"]
        latency = s["normalized_latency"]
        return cls(
            workload=workload,
            scheduler=str(result.config["scheduler"]),
            clock=clock_unit(str(result.config["cost_model"])),
            num_requests=s["num_requests"],
            finished=s["finished"],
            deadlocked=s["deadlocked"],
            iterations=s["iterations"],
            sim_time=s["sim_time"],
            request_throughput=s["request_throughput"],
            max_running=s["max_running"],
            mean_running=s["mean_running"],
            preemptions=s["preemptions"],
            p99_normalized_latency=None if latency is None else latency["p99"],
            token_utilization=memory["token_utilization"],
            pool_occupancy=memory["pool_occupancy"],
            internal_fragmentation=memory["internal_fragmentation"],
            external_fragmentation=memory["external_fragmentation"],
        )

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "fragmentation": self.fragmentation}


@dataclass(frozen=True)
class SideBySide:
    """The rows, and each workload's complete flat config (what ``pagedkv simulate`` takes)."""

    workloads: Mapping[str, Mapping[str, Any]]
    rows: tuple[BenchRow, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "workloads": {k: dict(v) for k, v in self.workloads.items()},
            "rows": [r.to_dict() for r in self.rows],
        }

    def to_csv(self) -> str:
        """One line per row, tidy (one column per field); an empty cell is a missing value."""
        rows = [r.to_dict() for r in self.rows]
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue()


def side_by_side(
    sharegpt_requests: int = SHAREGPT_REQUESTS, schedulers: Sequence[str] = SCHEDULERS
) -> SideBySide:
    """Run every scheduler on both workloads (the lesson also with ``LESSON_ONLY``)."""
    plans = (
        ("lesson", LESSON, (*schedulers, *LESSON_ONLY)),
        ("sharegpt-like", sharegpt(sharegpt_requests), tuple(schedulers)),
    )
    workloads: dict[str, dict[str, Any]] = {}
    rows: list[BenchRow] = []
    for name, flat, names in plans:
        for scheduler in names:
            result = simulate(SimulationConfig.from_flat({**flat, "scheduler": scheduler}))
            rows.append(BenchRow.from_result(name, result))
            # Everything but the scheduler is the same within a workload.
            workloads[name] = {k: v for k, v in result.config.items() if k != "scheduler"}
    return SideBySide(workloads, tuple(rows))

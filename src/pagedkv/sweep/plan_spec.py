"""A capacity plan: candidates (GPU x tensor-parallel degree x block size x scheduler), a
workload, SLOs and the rate range to search, from YAML or flags.

```yaml
model: OPT-13B
workload: sharegpt-like        # any other top-level key: a simulate option for every probe
num_requests: 200
gpus: {A100-40GB: 1.50, A100-80GB: 2.00}   # price per GPU-hour
tensor_parallel_sizes: [1, 2]
block_sizes: [16]
schedulers: [vllm]
slo: {ttft_p99: 2.0, tpot_p99: 0.1}        # seconds; also normalized_latency_p99
seeds: 3
rate_low: 0.25
rate_high: 64
tolerance: 0.05
target_rate: 100               # optional: replicas and cost per hour to serve 100 req/s
```
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagedkv.errors import ConfigError
from pagedkv.models.gpus import get_gpu
from pagedkv.simulation import FLAT_KEYS, SimulationConfig
from pagedkv.sweep.bisect import MIN_TOLERANCE
from pagedkv.sweep.spec import _seeds
from pagedkv.validation import check_bounds, check_float, float_field, read_yaml
from pagedkv.workloads.config import MAX_RATE, MIN_RATE

SLO_METRICS = ("ttft_p99", "tpot_p99", "normalized_latency_p99")
VARIED = ("gpu", "tensor_parallel_size", "block_size", "scheduler", "seed", "request_rate")
LISTS = {
    "tensor_parallel_sizes": ([1], int),
    "block_sizes": ([16], int),
    "schedulers": (["vllm"], str),
}
RATES = ("rate_low", "rate_high", "tolerance", "target_rate")
RESERVED = ("gpus", *LISTS, "slo", "seeds", *RATES)
MAX_PRICE = 1e6
"""Price per GPU-hour: any finite price up to a million."""
MAX_SLO_SECONDS = 1e9


@dataclass(frozen=True)
class Candidate:
    gpu: str
    tensor_parallel_size: int
    block_size: int
    scheduler: str
    price_per_gpu_hour: float

    @property
    def name(self) -> str:
        return f"{self.gpu} x{self.tensor_parallel_size} bs{self.block_size} {self.scheduler}"

    def options(self, base: Mapping[str, Any], rate: float, seed: int) -> dict[str, Any]:
        return {
            **base,
            "gpu": self.gpu,
            "tensor_parallel_size": self.tensor_parallel_size,
            "block_size": self.block_size,
            "scheduler": self.scheduler,
            "request_rate": rate,
            "seed": seed,
        }


@dataclass(frozen=True)
class PlanSpec:
    options: dict[str, Any]
    gpus: dict[str, float]
    tensor_parallel_sizes: tuple[int, ...]
    block_sizes: tuple[int, ...]
    schedulers: tuple[str, ...]
    slo: dict[str, float]
    seeds: tuple[int, ...]
    rate_low: float = float_field(0.25, "Lowest rate probed (req/s).", MIN_RATE, MAX_RATE)
    rate_high: float = float_field(64.0, "Highest rate probed (req/s).", MIN_RATE, MAX_RATE)
    tolerance: float = float_field(
        0.05,
        "Relative precision of each candidate's rate: the search stops when the lowest failing "
        "rate / the highest passing one <= 1 + tolerance.",
        MIN_TOLERANCE,
        10.0,
    )
    target_rate: float | None = float_field(
        None,
        "The rate to serve (req/s), split evenly over replicas: each candidate gets the fewest "
        "replicas that meet the SLOs at target_rate / replicas, and their cost per hour "
        "(default: none, rank by cost per million requests).",
        MIN_RATE,
        MAX_RATE,
    )

    def __post_init__(self) -> None:
        check_bounds(self)
        for key, value in self.options.items():
            if key in VARIED:
                raise ConfigError(key, value, "is chosen by the planner; list candidates instead")
            if key not in FLAT_KEYS:
                raise ConfigError(key, value, "is not an option; see `pagedkv simulate --help`")
        if not self.gpus:
            raise ConfigError("gpus", self.gpus, "must map at least one GPU to its price")
        for name, price in self.gpus.items():
            get_gpu(name)
            check_float(f"gpus.{name}", price, 0.0, MAX_PRICE, lo_open=True)
        if not self.slo:
            raise ConfigError("slo", self.slo, "must set at least one of " + ", ".join(SLO_METRICS))
        for metric, limit in self.slo.items():
            if metric not in SLO_METRICS:
                raise ConfigError(
                    f"slo.{metric}", limit, "must be one of " + ", ".join(SLO_METRICS)
                )
            check_float(f"slo.{metric}", limit, 0.0, MAX_SLO_SECONDS, lo_open=True)
        if self.rate_high <= self.rate_low:
            raise ConfigError("rate_high", self.rate_high, f"must be > rate_low ({self.rate_low})")
        # Every candidate's config, built now: a bad value fails before any probe runs. (A
        # candidate whose engine cannot be built, a model too big for its GPU, is a result:
        # the plan reports it as an error row.)
        for c in self.candidates():
            SimulationConfig.from_flat(c.options(self.options, self.rate_low, self.seeds[0]))

    def candidates(self) -> list[Candidate]:
        return [
            Candidate(gpu, tp, bs, sched, self.gpus[gpu])
            for gpu, tp, bs, sched in itertools.product(
                self.gpus, self.tensor_parallel_sizes, self.block_sizes, self.schedulers
            )
        ]

    @classmethod
    def from_dict(cls, data: object) -> PlanSpec:
        if not isinstance(data, Mapping):
            raise ConfigError("plan", data, "must be a mapping of plan keys and simulate options")
        gpus = data.get("gpus", {})
        if not isinstance(gpus, Mapping):
            raise ConfigError("gpus", gpus, "must map GPU names to a price per GPU-hour")
        slo = data.get("slo", {})
        if not isinstance(slo, Mapping):
            raise ConfigError("slo", slo, "must map SLO metrics to limits in seconds")
        lists = {key: _list(key, data.get(key, d), t) for key, (d, t) in LISTS.items()}
        rates = {k: data[k] for k in RATES if k in data}
        return cls(
            options={k: v for k, v in data.items() if k not in RESERVED},
            gpus={str(k): v for k, v in gpus.items()},
            tensor_parallel_sizes=lists["tensor_parallel_sizes"],
            block_sizes=lists["block_sizes"],
            schedulers=lists["schedulers"],
            slo={str(k): v for k, v in slo.items()},
            seeds=_seeds(data.get("seeds", 3)),
            **rates,
        )

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: Mapping[str, Any] | None = None) -> PlanSpec:
        data = read_yaml("plan", path) or {}
        if not isinstance(data, dict):
            raise ConfigError("plan", str(path), "must be a YAML mapping")
        return cls.from_dict({**data, **(overrides or {})})

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.options,
            "gpus": self.gpus,
            "tensor_parallel_sizes": list(self.tensor_parallel_sizes),
            "block_sizes": list(self.block_sizes),
            "schedulers": list(self.schedulers),
            "slo": self.slo,
            "seeds": list(self.seeds),
            "rate_low": self.rate_low,
            "rate_high": self.rate_high,
            "tolerance": self.tolerance,
            # only when set: a plan without a target writes the same JSON as before it existed
            **({} if self.target_rate is None else {"target_rate": self.target_rate}),
        }


def _list(field: str, value: object, kind: type) -> tuple[Any, ...]:
    if not isinstance(value, list):
        value = [value]  # a single value is a list of one
    if not value or any(isinstance(v, bool) or not isinstance(v, kind) for v in value):
        raise ConfigError(field, value, f"must be a non-empty list of {kind.__name__} values")
    return tuple(value)

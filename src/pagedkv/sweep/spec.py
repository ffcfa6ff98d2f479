"""A sweep spec: base simulate options, a grid (cartesian product), zipped lists and seeds.

```yaml
workload: sharegpt-like        # any other top-level key: a simulate option fixed for every point
num_requests: 200
grid:                          # every combination of these lists
  block_size: [8, 16, 32]
  scheduler: [vllm, orca-max]
zip:                           # these lists side by side (equal lengths)
  gpu: [A100-40GB, A100-80GB]
  num_gpu_blocks: [800, 2000]
seeds: 3                       # a count (seeds 0, 1, 2) or a list of seeds
```

Points come grid-major, then zip rows, then seeds. Every point's ``SimulationConfig`` is built
up front and checked as its engine build would check it (``simulation.check_buildable``: the
pools' memory, a contiguous space too small for max_model_len, pinned prefixes that do not fit,
the workload itself), so an unknown key or a bad value is one ``ConfigError`` before any point
runs. A spec has at most ``MAX_POINTS`` points.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagedkv.errors import ConfigError
from pagedkv.simulation import FLAT_KEYS, SimulationConfig, check_buildable
from pagedkv.validation import read_yaml
from pagedkv.workloads.config import MAX_SEED, WorkloadConfig

RESERVED = ("grid", "zip", "seeds")
OPTION_HELP = "is not an option; see `pagedkv simulate --help`"
RUN_OPTIONS = ("reference", "trace_steps")
MAX_POINTS = 100_000
"""Points of one sweep: each is a journal line and a table row, and is checked up front."""
MAX_SEEDS = 10_000


@dataclass(frozen=True)
class SweepPoint:
    """One configuration x seed: its flat simulate options and the keys the sweep varies."""

    index: int
    point_id: str
    options: dict[str, Any]
    varied: dict[str, Any]


@dataclass(frozen=True)
class SweepSpec:
    base: dict[str, Any]
    grid: dict[str, list[Any]]
    zipped: dict[str, list[Any]]
    seeds: tuple[int, ...]

    @property
    def varied_keys(self) -> list[str]:
        return [*self.grid, *self.zipped]

    @classmethod
    def from_dict(cls, data: object) -> SweepSpec:
        if not isinstance(data, Mapping):
            raise ConfigError("spec", data, "must be a mapping of options, grid, zip and seeds")
        base = {k: v for k, v in data.items() if k not in RESERVED}
        grid = _lists("grid", data.get("grid"))
        zipped = _lists("zip", data.get("zip"))
        lengths = {len(v) for v in zipped.values()}
        if len(lengths) > 1:
            sizes = {k: len(v) for k, v in zipped.items()}
            raise ConfigError("zip", sizes, "every zipped list must have the same length")
        seeds = _seeds(data.get("seeds", 1))
        seen: dict[str, str] = {}
        for where, keys in (("options", base), ("grid", grid), ("zip", zipped)):
            for key, value in keys.items():
                _check_key(f"{where}.{key}" if where != "options" else key, key, value)
                if key in seen:
                    raise ConfigError(key, value, f"is set in both {seen[key]} and {where}")
                if key == "seed":
                    raise ConfigError(key, value, "is swept by `seeds` (a count or a list)")
                seen[key] = where
        return cls(dict(base), grid, zipped, seeds)

    @classmethod
    def from_yaml(cls, path: str | Path) -> SweepSpec:
        return cls.from_dict(read_yaml("spec", path))

    def points(self) -> list[SweepPoint]:
        """Every point, each validated by building its ``SimulationConfig`` now."""
        rows = list(zip(*self.zipped.values(), strict=True)) or [()]  # lengths checked
        total = math.prod(len(v) for v in self.grid.values()) * len(rows) * len(self.seeds)
        if total > MAX_POINTS:
            raise ConfigError("spec", f"{total} points", f"must have at most {MAX_POINTS} points")
        out: list[SweepPoint] = []
        ids: dict[str, dict[str, Any]] = {}
        checked: set[WorkloadConfig] = set()
        for combo in itertools.product(*self.grid.values()):
            for row in rows:
                varied = {
                    **dict(zip(self.grid, combo, strict=True)),
                    **dict(zip(self.zipped, row, strict=True)),
                }
                for seed in self.seeds:
                    options = {**self.base, **varied, "seed": seed}
                    config = SimulationConfig.from_flat(options)
                    check_buildable(config, checked)
                    pid = point_id(config)
                    if pid in ids:
                        raise ConfigError(
                            "spec", varied, f"is the same configuration as {ids[pid]}"
                        )
                    ids[pid] = varied
                    out.append(SweepPoint(len(out), pid, options, varied))
        return out


def point_id(config: SimulationConfig) -> str:
    """A stable id of a point: the hash of its complete config (defaults spelled out), so a spec
    that writes a default explicitly, or lists its keys in another order, names the same point."""
    canonical = json.dumps(config.to_flat(), sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def _lists(field: str, value: object) -> dict[str, list[Any]]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not value:
        raise ConfigError(field, value, "must be a non-empty mapping of option: [values]")
    out: dict[str, list[Any]] = {}
    for key, values in value.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{field}.{key}", values, "must be a non-empty list of values")
        out[str(key)] = values
    return out


def _seeds(value: object) -> tuple[int, ...]:
    allowed = (
        f"must be a count in [1, {MAX_SEEDS}] or a non-empty list of at most {MAX_SEEDS} "
        f"distinct integers in [0, {MAX_SEED}]"
    )
    if isinstance(value, int) and not isinstance(value, bool):
        if not 1 <= value <= MAX_SEEDS:
            raise ConfigError("seeds", value, allowed)
        return tuple(range(value))
    if (
        not isinstance(value, list)
        or not value
        or len(value) > MAX_SEEDS
        or any(
            isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= MAX_SEED for s in value
        )
        or len(set(value)) != len(value)
    ):
        raise ConfigError("seeds", value, allowed)
    return tuple(value)


def _check_key(field: str, key: str, value: object) -> None:
    if key not in FLAT_KEYS and key not in RUN_OPTIONS:
        raise ConfigError(field, value, OPTION_HELP)

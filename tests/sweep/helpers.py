"""Shared small specs and picklable point functions for the sweep tests."""

from __future__ import annotations

import os
from typing import Any

from pagedkv.simulation import SimulationConfig
from pagedkv.sweep.spec import point_id
from pagedkv.sweep.sweep import run_point

COUNTER_ENV = "PAGEDKV_TEST_SWEEP_COUNTER"

# 12 small points (~50 ms each): 2 block sizes x 2 schedulers x (3 zipped rates) ... x 1 seed
SMALL_SPEC: dict[str, Any] = {
    "workload": "sharegpt-like",
    "num_requests": 12,
    "grid": {"block_size": [8, 16], "scheduler": ["vllm", "orca-max"]},
    "zip": {"request_rate": [2.0, 8.0, 32.0], "max_num_seqs": [8, 16, 64]},
    "seeds": [3],
}


def counted_run_point(options: dict[str, Any]) -> dict[str, Any]:
    """``run_point``, and one line per run in the file named by $PAGEDKV_TEST_SWEEP_COUNTER
    (appends of one short line are atomic, so pool workers can share the file)."""
    with open(os.environ[COUNTER_ENV], "a", encoding="utf-8") as f:
        f.write(point_id(SimulationConfig.from_flat(options)) + "\n")
    return run_point(options)


def fail_large_blocks(options: dict[str, Any]) -> dict[str, Any]:
    """Like ``run_point``, but a point with block_size 16 raises."""
    if options["block_size"] == 16:
        raise RuntimeError("block size 16 is broken here")
    return run_point(options)

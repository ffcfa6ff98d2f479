"""The footprint prices bound what the structures really take (measured again here with
tracemalloc), and the cap refuses a run before it holds anything."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pagedkv import footprint
from pagedkv.errors import ConfigError
from pagedkv.memory.config import CacheConfig
from pagedkv.memory.manager import KVCacheManager
from pagedkv.simulation import SimulationConfig, engine_parts, simulate
from pagedkv.workloads.token_ids import own_ids


def _measured(make: Callable[[], Any]) -> int:
    """Peak bytes allocated while ``make`` runs and its result is alive."""
    gc.collect()
    tracemalloc.start()
    try:
        kept = make()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del kept
    return peak


TINY = str(Path(__file__).parent / "engine" / "tiny-opt-config.json")
"""A two-layer OPT of width 64: 512 bytes of K/V per token, so 1 TiB of swap is 2^31 slots."""


def test_a_block_costs_less_than_its_price() -> None:
    n = 20_000
    config = CacheConfig(num_gpu_blocks=n, num_cpu_blocks=n, enable_prefix_caching=True)
    peak = _measured(lambda: KVCacheManager(config))
    assert peak / (2 * n) <= footprint.BYTES_PER_BLOCK


def test_a_request_through_a_run_costs_less_than_its_price() -> None:
    n = 2000
    config = SimulationConfig.from_flat(
        {"workload": "alpaca-like", "num_requests": n, "num_gpu_blocks": 2000, "cost_model": "unit"}
    )
    peak = _measured(lambda: simulate(config))
    # the pools' share priced apart: what is left is the requests'
    blocks = 2000 * footprint.BYTES_PER_BLOCK
    assert (peak - blocks) / n <= footprint.BYTES_PER_REQUEST


def test_a_token_id_costs_its_price() -> None:
    n = 200_000
    ids = own_ids(3, 0, n)
    header = 1024  # a tuple's own bytes, the range it is made from
    assert _measured(lambda: own_ids(1, 0, n)) <= footprint.BYTES_PER_TOKEN_ID * n + header
    repeated = _measured(lambda: ids + own_ids(2, 0, 1))
    assert (
        repeated <= footprint.BYTES_PER_REPEATED_ID * n + footprint.BYTES_PER_TOKEN_ID + 2 * header
    )


def test_the_cap_is_inclusive_and_the_message_one_line() -> None:
    footprint.check_memory("x", 1, "exactly the cap", footprint.MEMORY_CAP_BYTES)
    with pytest.raises(ConfigError) as err:
        footprint.check_memory("x", 7, "7 things", footprint.MEMORY_CAP_BYTES + 1)
    assert err.value.field == "x"
    assert err.value.value == 7
    assert "7 things" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("flat", "field"),
    [
        ({"num_gpu_blocks": 1 << 30}, "num_gpu_blocks"),
        (
            {"num_gpu_blocks": 100, "swap_space": 1024, "model": TINY, "block_size": 1},
            "swap_space",
        ),
        (
            {"workload": "fixed", "prompt_len": 8, "output_len": 8, "num_requests": 1 << 24},
            "num_requests",
        ),
        ({"workload": "chat", "num_sessions": 1 << 20, "chat_turns": 100}, "num_sessions"),
        (
            {
                "workload": "fixed",
                "prompt_len": 8,
                "output_len": 8,
                "num_requests": 1 << 20,
                "num_samples": 64,
                "samples_as_requests": True,
            },
            "num_requests",
        ),
    ],
)
def test_a_run_over_the_cap_is_refused_before_it_allocates(
    flat: dict[str, Any], field: str
) -> None:
    peak = 0

    def build() -> None:
        engine_parts(SimulationConfig.from_flat({"cost_model": "unit", **flat}))

    gc.collect()
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError) as err:
            build()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert err.value.field == field
    assert "GiB" in str(err.value)
    assert peak < 50 * 2**20  # refused from the numbers alone

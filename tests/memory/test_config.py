"""Bad configuration is rejected at construction, naming the field, the value, what is allowed."""

from __future__ import annotations

from typing import Any

import pytest

from pagedkv.errors import ConfigError, PagedKVError
from pagedkv.memory.config import CacheConfig, ContiguousConfig, Placement, Reservation
from pagedkv.validation import field_help


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"block_size": 0}, "block_size"),
        ({"block_size": -16}, "block_size"),
        ({"block_size": 16.0}, "block_size"),
        ({"block_size": "16"}, "block_size"),
        ({"block_size": True}, "block_size"),
        ({"num_gpu_blocks": 0}, "num_gpu_blocks"),
        ({"num_gpu_blocks": 2.5}, "num_gpu_blocks"),
        ({"num_cpu_blocks": -1}, "num_cpu_blocks"),
        ({"watermark": 1.0}, "watermark"),
        ({"watermark": -0.1}, "watermark"),
        ({"enable_prefix_caching": 1}, "enable_prefix_caching"),
        ({"num_gpu_blocks": 10**10}, "num_gpu_blocks"),
        ({"num_gpu_blocks": 1 << 28}, "num_gpu_blocks"),  # in bounds, over the footprint cap
        ({"num_cpu_blocks": 1 << 28}, "num_cpu_blocks"),
        ({"watermark": float("nan")}, "watermark"),
    ],
)
def test_cache_config_rejects(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        CacheConfig(**kwargs)
    err = info.value
    assert err.field == field
    assert str(err).startswith(f"{field}: got {next(iter(kwargs.values()))!r}")
    assert "must" in str(err)
    assert isinstance(err, PagedKVError)
    assert isinstance(err, ValueError)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"capacity": 0}, "capacity"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"capacity": 100, "max_model_len": 200}, "max_model_len"),
        ({"max_model_len": 8, "block_size": 16}, "max_model_len"),
        ({"placement": "best-fit"}, "placement"),
        ({"reservation": "exact"}, "reservation"),
        ({"placement": "buddy", "reservation": "slots"}, "placement"),
        ({"capacity": 2**51}, "capacity"),
        ({"capacity": 2**50, "max_model_len": 16, "reservation": "slots"}, "capacity"),
    ],
)
def test_contiguous_config_rejects(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        ContiguousConfig(**kwargs)
    assert info.value.field == field


def test_unknown_policy_lists_the_allowed_ones() -> None:
    with pytest.raises(ConfigError, match="'first-fit', 'buddy'"):
        ContiguousConfig(placement="best-fit")  # type: ignore[arg-type]


def test_policies_accept_their_names() -> None:
    cfg = ContiguousConfig(placement="buddy", reservation="pow2")  # type: ignore[arg-type]
    assert cfg.placement is Placement.BUDDY
    assert cfg.reservation is Reservation.POW2


def test_configs_are_frozen_and_documented() -> None:
    cfg = CacheConfig()
    with pytest.raises(AttributeError):
        cfg.block_size = 8  # type: ignore[misc]
    assert "Token slots per block" in field_help(CacheConfig, "block_size")
    assert cfg.capacity == cfg.num_gpu_blocks * cfg.block_size
    assert CacheConfig(num_gpu_blocks=1000, watermark=0.01).watermark_blocks == 10

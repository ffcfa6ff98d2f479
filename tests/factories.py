"""Test factories: one place that builds requests, configs and allocators for the tests."""

from __future__ import annotations

from dataclasses import dataclass

from pagedkv.memory.config import CacheConfig, Placement, Reservation
from pagedkv.memory.manager import KVCacheManager

BLOCK_SIZES = (1, 16, 7)
"""Every memory test runs over these: the smallest, vLLM's default, and one that divides nothing."""

CONTIGUOUS_VARIANTS = [
    (Placement.FIRST_FIT, Reservation.MAX),
    (Placement.FIRST_FIT, Reservation.POW2),
    (Placement.FIRST_FIT, Reservation.ORACLE),
    (Placement.FIRST_FIT, Reservation.SLOTS),
    (Placement.BUDDY, Reservation.MAX),
    (Placement.BUDDY, Reservation.POW2),
    (Placement.BUDDY, Reservation.ORACLE),
]
"""Every valid placement x reservation ('slots' has fixed slots, so first-fit only)."""


@dataclass(frozen=True)
class FakeRequest:
    """What the memory layer needs to know of a request."""

    seq_id: int
    prompt_len: int
    output_len: int
    token_ids: tuple[int, ...] | None

    @property
    def final_len(self) -> int:
        return self.prompt_len + self.output_len


def make_request(
    seq_id: int = 0,
    prompt_len: int = 10,
    output_len: int = 5,
    *,
    prefix: tuple[int, ...] = (),
    with_tokens: bool = True,
) -> FakeRequest:
    """A request whose prompt is ``prefix`` followed by ids unique to ``seq_id``."""
    tokens = None
    if with_tokens:
        own = tuple(1_000_000 * (seq_id + 1) + k for k in range(max(0, prompt_len - len(prefix))))
        tokens = (prefix + own)[:prompt_len]
    return FakeRequest(seq_id, prompt_len, output_len, tokens)


def make_manager(
    block_size: int = 16,
    num_gpu_blocks: int = 64,
    *,
    num_cpu_blocks: int = 0,
    watermark: float = 0.0,
    prefix_caching: bool = False,
) -> KVCacheManager:
    return KVCacheManager(
        CacheConfig(
            num_gpu_blocks=num_gpu_blocks,
            block_size=block_size,
            num_cpu_blocks=num_cpu_blocks,
            watermark=watermark,
            enable_prefix_caching=prefix_caching,
        )
    )

"""Test factories: one place that builds requests, configs and allocators for the tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagedkv.engine.config import PreemptionMode, SchedulerConfig
from pagedkv.engine.cost_model import CostModel, UnitCost
from pagedkv.engine.engine import Engine
from pagedkv.engine.executor import SimExecutor
from pagedkv.engine.policies import SCHEDULERS
from pagedkv.memory.config import CacheConfig, Placement, Reservation
from pagedkv.memory.manager import KVCacheManager
from pagedkv.workloads.spec import RequestSpec

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


def make_engine(
    scheduler: str,
    workload: list[RequestSpec],
    *,
    num_gpu_blocks: int = 100,
    block_size: int = 16,
    num_cpu_blocks: int = 0,
    max_model_len: int = 256,
    preemption_mode: str = "recompute",
    group_preemption_mode: str = "swap",
    chunked: bool = False,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    cost: CostModel | None = None,
    reference: bool = False,
    trace_steps: bool = False,
    watermark: float = 0.01,
    prefix_caching: bool = False,
    token_times: bool = False,
) -> Engine:
    """An engine over a simulated executor, with integrity checked after every iteration."""
    seqs: dict[str, Any] = {} if max_num_seqs is None else {"max_num_seqs": max_num_seqs}
    sched_cfg = SchedulerConfig(
        scheduler=scheduler,
        max_model_len=max_model_len,
        preemption_mode=PreemptionMode(preemption_mode),
        group_preemption_mode=PreemptionMode(group_preemption_mode),
        enable_chunked_prefill=chunked,
        max_num_batched_tokens=max_num_batched_tokens,
        **seqs,
    )
    cache = CacheConfig(
        num_gpu_blocks=num_gpu_blocks,
        block_size=block_size,
        num_cpu_blocks=num_cpu_blocks,
        watermark=watermark,
        enable_prefix_caching=prefix_caching,
    )
    cls = SCHEDULERS[scheduler]
    kv = cls.make_allocator(cache, sched_cfg)
    return Engine(
        cls(sched_cfg, kv),
        SimExecutor(cost if cost is not None else UnitCost()),
        workload,
        check_integrity=True,
        reference=reference,
        trace_steps=trace_steps,
        token_times=token_times,
    )

"""A PagedKVCache that checks the engine's write guarantee: no block is written while its
reference count is above 1 (a shared block is copied first, copy-on-write), and every written
block is held by some sequence (reference count exactly 1)."""

from __future__ import annotations

from typing import Any

import torch

from pagedkv.engine.engine import Engine, EngineRun
from pagedkv.engine.executor import StepResult
from pagedkv.engine.scheduler import SchedulerOutput
from pagedkv.memory.manager import KVCacheManager
from pagedkv.tensors.executor import TorchExecutor
from pagedkv.tensors.kv_cache import PagedKVCache


class CheckedCache(PagedKVCache):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kv: KVCacheManager | None = None  # set once the allocator exists
        self.blocks_written = 0

    def write(
        self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        if self.kv is not None:
            blocks = sorted({int(s) // self.block_size for s in slot_mapping.tolist()})
            refs = {b: self.kv.gpu.ref_counts[b] for b in blocks}
            bad = {b: r for b, r in refs.items() if r != 1}
            assert not bad, f"layer {layer}: writing blocks with reference counts {bad}"
            self.blocks_written += len(blocks)
        super().write(layer, slot_mapping, k, v)


def run_checked(engine: Engine) -> tuple[EngineRun, int]:
    """Run a real engine built with ``cache_factory=CheckedCache``: no write may go into a block
    others still share. Returns the run (not deadlocked) and the block copies it performed."""
    executor = engine.executor
    assert isinstance(executor, TorchExecutor)
    assert isinstance(executor.cache, CheckedCache)
    assert isinstance(engine.scheduler.kv, KVCacheManager)
    executor.cache.kv = engine.scheduler.kv
    copies = 0
    execute = executor.execute

    def counting(batch: SchedulerOutput) -> StepResult:
        nonlocal copies
        copies += len(batch.copies)
        return execute(batch)

    executor.execute = counting  # type: ignore[method-assign]
    run = engine.run()
    assert not run.deadlocked
    return run, copies

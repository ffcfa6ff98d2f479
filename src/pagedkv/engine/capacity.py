"""KV capacity: how many K/V blocks a model leaves on a GPU, as vLLM sizes them; the swap pool.

Combines a GPU (``gpus.py``) and a model (``models.py``): memory x utilization, less the weights
per GPU and an activation reserve, in whole blocks. Sizes are binary (GiB), see ``gpus.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pagedkv.errors import ConfigError
from pagedkv.models.gpus import GiB, GPUSpec
from pagedkv.models.models import ModelSpec, check_tensor_parallel
from pagedkv.validation import check_float, check_int

DEFAULT_ACTIVATION_RESERVE_BYTES = 128 * 2**20
"""Memory per GPU kept for activations, besides gpu_memory_utilization's 10% headroom.

vLLM measures this with a profiling forward pass; the vLLM paper's Table 1 leaves ~0.06 GiB for it
on OPT-13B (0.9 x 40 GiB - 25.7 GB of weights - 12 GiB of KV). 128 MiB keeps the paper's
OPT-13B / A100-40GB figures within 1% (11.9 GiB, 15.6K slots vs 12 GiB, 15.7K); raise it for
large models or large token budgets.
"""


@dataclass(frozen=True)
class KVCapacity:
    """How much K/V fits on each GPU, and the block pool it makes."""

    num_gpu_blocks: int
    kv_bytes_per_gpu: int
    """Memory given to K/V on each GPU (before rounding down to whole blocks)."""
    block_size: int
    block_bytes_per_gpu: int
    """One block's K/V on one GPU: block_size x kv_bytes_per_token_per_gpu."""
    kv_bytes_per_token_per_gpu: int
    weight_bytes_per_gpu: int
    tensor_parallel_size: int
    num_layers: int = 1
    num_sliding_layers: int = 0
    sliding_window: int | None = None
    """The model's window (see ``ModelSpec``): ``max_concurrency`` counts it."""

    @property
    def token_slots(self) -> int:
        """C = num_gpu_blocks x block_size (the same on every GPU: each holds a token's share)."""
        return self.num_gpu_blocks * self.block_size

    def layer_blocks_per_request(self, tokens: int) -> int:
        """Blocks of one layer a request of ``tokens`` tokens holds, summed over the layers.

        A full-attention layer holds ceil(T / block_size); a sliding-window layer at most the
        blocks its last W tokens span, ceil((W - 1) / block_size) + 1 (the window's first
        token may sit anywhere in its block), as vLLM's hybrid allocator frees the others.
        """
        blocks = math.ceil(check_int("tokens", tokens, 1) / self.block_size)
        full = self.num_layers - self.num_sliding_layers
        if self.sliding_window is None:
            return full * blocks
        window = math.ceil((self.sliding_window - 1) / self.block_size) + 1
        return full * blocks + self.num_sliding_layers * min(blocks, window)

    def max_concurrency(self, tokens: int) -> int:
        """Requests of ``tokens`` tokens whose K/V fit at once (vLLM's "maximum concurrency"):
        K/V memory // (one layer's block x ``layer_blocks_per_request``). Without a window
        this is num_gpu_blocks // ceil(T / block_size); with one, long requests fit more often,
        which the simulated block pool does not model (docs/models.md)."""
        layer_block = self.block_bytes_per_gpu // self.num_layers
        return self.kv_bytes_per_gpu // (layer_block * self.layer_blocks_per_request(tokens))


def kv_capacity(
    gpu: GPUSpec,
    model: ModelSpec,
    *,
    tensor_parallel_size: int = 1,
    gpu_memory_utilization: float = 0.9,
    activation_reserve_bytes: int = DEFAULT_ACTIVATION_RESERVE_BYTES,
    block_size: int = 16,
) -> KVCapacity:
    """vLLM's sizing: KV = memory x utilization - weights / tp - activations, in whole blocks.

    ``gpu_memory_utilization`` is vLLM's (default 0.9), in (0, 1]. Raises ConfigError when the
    weights and the reserve leave room for no block.
    """
    tp = check_tensor_parallel(model, tensor_parallel_size)
    check_float("gpu_memory_utilization", gpu_memory_utilization, 0.0, 1.0, lo_open=True)
    check_int("activation_reserve_bytes", activation_reserve_bytes, 0)
    check_int("block_size", block_size, 1)
    weights = math.ceil(model.weight_bytes / tp)
    usable = int(gpu.memory_bytes * gpu_memory_utilization)
    kv_bytes = usable - weights - activation_reserve_bytes
    per_token = model.kv_bytes_per_token_per_gpu(tp)
    block_bytes = block_size * per_token
    if kv_bytes < block_bytes:
        raise ConfigError(
            "tensor_parallel_size",
            tp,
            f"leaves {kv_bytes / GiB:.2f} GiB for K/V on each {gpu.name}: {model.name}'s weights "
            f"({weights / GiB:.2f} GiB per GPU) plus activation_reserve_bytes must fit in "
            f"memory x gpu_memory_utilization ({usable / GiB:.2f} GiB) with room for one block; "
            "use more GPUs, a bigger GPU or a smaller model",
        )
    return KVCapacity(
        num_gpu_blocks=kv_bytes // block_bytes,
        kv_bytes_per_gpu=kv_bytes,
        block_size=block_size,
        block_bytes_per_gpu=block_bytes,
        kv_bytes_per_token_per_gpu=per_token,
        weight_bytes_per_gpu=weights,
        tensor_parallel_size=tp,
        num_layers=model.num_layers,
        num_sliding_layers=model.num_sliding_layers,
        sliding_window=model.sliding_window,
    )


def swap_space_blocks(
    swap_space_bytes: int, model: ModelSpec, *, tensor_parallel_size: int = 1, block_size: int = 16
) -> int:
    """Blocks of the CPU swap pool: swap space per GPU // one block's K/V on one GPU.

    As in vLLM, ``swap_space_bytes`` is per GPU (vLLM's default is 4 GiB), since each GPU swaps
    its own share of every block.
    """
    check_int("swap_space_bytes", swap_space_bytes, 0)
    check_int("block_size", block_size, 1)
    return swap_space_bytes // (block_size * model.kv_bytes_per_token_per_gpu(tensor_parallel_size))

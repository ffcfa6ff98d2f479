"""The paged KV cache: per-layer K and V tensors addressed by physical block.

Layout (one K and one V tensor per layer, as in vLLM)::

    [num_blocks, block_size, num_kv_heads, head_dim]

A token's *slot* is ``block * block_size + offset``; a sequence's block table (from
``pagedkv.memory``) maps its logical block ``i`` to a physical block. The cache only moves data;
which blocks to write, copy (copy-on-write, ``BlockCopy``) or swap (``SwapMapping``) is decided by
the memory manager, which never imports torch.

A CPU pool of ``num_cpu_blocks`` blocks per layer (same layout) backs ``swap_out``/``swap_in``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import torch

from pagedkv.memory.interface import BlockCopy, SwapMapping


def _check_positive(name: str, value: int, *, allow_zero: bool = False) -> None:
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}: expected an int >= {low}, got {value!r}")


def _check_block_ids(name: str, ids: Sequence[int], num_blocks: int, pool: str) -> None:
    for b in ids:
        if not 0 <= b < num_blocks:
            raise ValueError(
                f"{name}: block {b} is out of range for the {pool} pool of {num_blocks} blocks"
            )


def _split(pairs: Iterable[BlockCopy] | Iterable[SwapMapping]) -> tuple[list[int], list[int]]:
    """(sources, destinations) of block copies or swap mappings."""
    src: list[int] = []
    dst: list[int] = []
    for pair in pairs:
        src.append(int(pair.src))
        dst.append(int(pair.dst))
    return src, dst


def slot_mapping(
    block_table: Sequence[int],
    start: int,
    end: int,
    block_size: int,
    *,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Flat slot indices (``block * block_size + offset``) of token positions ``[start, end)``
    of a sequence whose logical blocks map to the physical blocks ``block_table``.

    Returns a 1-D ``torch.long`` tensor of length ``end - start`` on ``device``.
    """
    _check_positive("block_size", block_size)
    capacity = len(block_table) * block_size
    if not 0 <= start <= end <= capacity:
        raise ValueError(
            f"start/end: need 0 <= start <= end <= len(block_table) * block_size = {capacity}, "
            f"got start={start}, end={end}"
        )
    positions = torch.arange(start, end, dtype=torch.long)
    blocks = torch.as_tensor(list(block_table), dtype=torch.long)
    if blocks.numel() == 0:
        return positions.to(device)
    slots = blocks[positions // block_size] * block_size + positions % block_size
    return slots.to(device)


class PagedKVCache:
    """K/V tensors of every layer, laid out in blocks; plus a CPU swap pool.

    ``k_caches[layer]`` / ``v_caches[layer]`` are ``[num_blocks, block_size, num_kv_heads,
    head_dim]`` tensors on ``device``; ``cpu_k_caches`` / ``cpu_v_caches`` the same with
    ``num_cpu_blocks`` blocks, on the CPU (pinned when ``device`` is CUDA). Everything starts
    zeroed.
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        num_cpu_blocks: int = 0,
    ) -> None:
        _check_positive("num_layers", num_layers)
        _check_positive("num_blocks", num_blocks)
        _check_positive("block_size", block_size)
        _check_positive("num_kv_heads", num_kv_heads)
        _check_positive("head_dim", head_dim)
        _check_positive("num_cpu_blocks", num_cpu_blocks, allow_zero=True)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype: expected a floating-point torch.dtype, got {dtype!r}")
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.num_cpu_blocks = num_cpu_blocks
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        cpu_shape = (num_cpu_blocks, block_size, num_kv_heads, head_dim)
        pin = self.device.type == "cuda"

        def gpu_pool() -> list[torch.Tensor]:
            return [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]

        def cpu_pool() -> list[torch.Tensor]:
            return [
                torch.zeros(cpu_shape, dtype=dtype, device="cpu", pin_memory=pin)
                for _ in range(num_layers)
            ]

        self.k_caches: list[torch.Tensor] = gpu_pool()
        self.v_caches: list[torch.Tensor] = gpu_pool()
        self.cpu_k_caches: list[torch.Tensor] = cpu_pool()
        self.cpu_v_caches: list[torch.Tensor] = cpu_pool()

    # ----- shapes -------------------------------------------------------------------------------
    @property
    def num_slots(self) -> int:
        """Token slots per layer in the device pool: ``num_blocks * block_size``."""
        return self.num_blocks * self.block_size

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block takes across all layers, K and V."""
        per_layer = self.block_size * self.num_kv_heads * self.head_dim * self.dtype.itemsize
        return 2 * self.num_layers * per_layer

    def _check_layer(self, layer: int) -> None:
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise ValueError(f"layer: expected an int, got {layer!r}")
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer: {layer} is out of range for {self.num_layers} layers")

    def _ids(self, values: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(values), dtype=torch.long, device=self.device)

    # ----- writes and reads ---------------------------------------------------------------------
    def write(
        self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Store the K/V of ``num_tokens`` tokens of ``layer`` at the flat slots ``slot_mapping``.

        ``slot_mapping``: 1-D integer tensor of ``num_tokens`` slot indices
        (``block * block_size + offset``); ``k``, ``v``: ``[num_tokens, num_kv_heads, head_dim]``
        in the cache's dtype. Slots must be distinct (as the memory manager guarantees).
        """
        self._check_layer(layer)
        if not isinstance(slot_mapping, torch.Tensor) or slot_mapping.dim() != 1:
            raise ValueError("slot_mapping: expected a 1-D tensor of slot indices")
        if slot_mapping.dtype not in (torch.long, torch.int32, torch.int64):
            raise ValueError(f"slot_mapping: expected an integer tensor, got {slot_mapping.dtype}")
        n = slot_mapping.shape[0]
        expected = (n, self.num_kv_heads, self.head_dim)
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != expected:
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(
                    f"{name}: expected shape [num_tokens, num_kv_heads, head_dim] = "
                    f"{list(expected)}, got {list(got) if isinstance(got, tuple) else got}"
                )
            if t.dtype != self.dtype:
                raise ValueError(f"{name}: expected dtype {self.dtype}, got {t.dtype}")
        if n == 0:
            return
        if slot_mapping.device.type == "cpu":  # a bounds check on the host costs no sync
            low, high = int(slot_mapping.min()), int(slot_mapping.max())
            if low < 0 or high >= self.num_slots:
                bad = low if low < 0 else high
                raise ValueError(
                    f"slot_mapping: slot {bad} is out of range for {self.num_slots} slots"
                )
        index = slot_mapping.to(device=self.device, dtype=torch.long)
        flat_shape = (self.num_slots, self.num_kv_heads, self.head_dim)
        self.k_caches[layer].view(flat_shape).index_copy_(0, index, k.to(self.device))
        self.v_caches[layer].view(flat_shape).index_copy_(0, index, v.to(self.device))

    def gather(
        self, layer: int, block_table: Sequence[int], num_tokens: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The K and V of a sequence's first ``num_tokens`` tokens of ``layer``, contiguous:
        two ``[num_tokens, num_kv_heads, head_dim]`` tensors (copies: the blocks are scattered).
        For reference paths and tests; the fast attention path never materialises this."""
        self._check_layer(layer)
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
            raise ValueError(f"num_tokens: expected an int >= 0, got {num_tokens!r}")
        needed = -(-num_tokens // self.block_size)
        if needed > len(block_table):
            raise ValueError(
                f"block_table: {num_tokens} tokens need {needed} blocks of {self.block_size}, "
                f"the table has {len(block_table)}"
            )
        blocks = list(block_table[:needed])
        _check_block_ids("block_table", blocks, self.num_blocks, "device")
        index = self._ids(blocks)
        shape = (needed * self.block_size, self.num_kv_heads, self.head_dim)
        k = self.k_caches[layer].index_select(0, index).view(shape)[:num_tokens]
        v = self.v_caches[layer].index_select(0, index).view(shape)[:num_tokens]
        return k, v

    # ----- block moves --------------------------------------------------------------------------
    def _pools(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(device pool, CPU pool) of every layer's K and V."""
        return zip(
            (*self.k_caches, *self.v_caches), (*self.cpu_k_caches, *self.cpu_v_caches), strict=True
        )

    def snapshot(self) -> list[torch.Tensor]:
        """A copy of every pool (device and CPU, K and V), for ``restore``; held in host memory,
        so a GPU's cache need not fit on it twice."""
        return [t.to("cpu", copy=True) for t in self._tensors]

    def restore(self, snapshot: list[torch.Tensor]) -> None:
        """Put back what ``snapshot`` copied, in place: the pools keep their storage (a kernel
        reading them by address reads the restored values)."""
        for tensor, saved in zip(self._tensors, snapshot, strict=True):
            tensor.copy_(saved)

    @property
    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return (*self.k_caches, *self.v_caches, *self.cpu_k_caches, *self.cpu_v_caches)

    def copy_blocks(self, copies: Iterable[BlockCopy]) -> None:
        """Copy-on-write: copy device block ``src`` into device block ``dst``, in every layer.
        All copies read the blocks as they were before any of them (a gather, then a scatter)."""
        src, dst = _split(copies)
        if not src:
            return
        _check_block_ids("copies", src + dst, self.num_blocks, "device")
        src_ids, dst_ids = self._ids(src), self._ids(dst)
        for cache in (*self.k_caches, *self.v_caches):
            cache.index_copy_(0, dst_ids, cache.index_select(0, src_ids))

    def swap_out(self, mappings: Iterable[SwapMapping]) -> None:
        """Copy device block ``src`` into CPU block ``dst``, in every layer (swap out)."""
        src, dst = _split(mappings)
        if not src:
            return
        _check_block_ids("mappings", src, self.num_blocks, "device")
        _check_block_ids("mappings", dst, self.num_cpu_blocks, "CPU")
        src_ids = self._ids(src)
        dst_ids = torch.tensor(dst, dtype=torch.long)
        for device_cache, cpu_cache in self._pools():
            cpu_cache.index_copy_(0, dst_ids, device_cache.index_select(0, src_ids).cpu())

    def swap_in(self, mappings: Iterable[SwapMapping]) -> None:
        """Copy CPU block ``src`` into device block ``dst``, in every layer (swap in)."""
        src, dst = _split(mappings)
        if not src:
            return
        _check_block_ids("mappings", src, self.num_cpu_blocks, "CPU")
        _check_block_ids("mappings", dst, self.num_blocks, "device")
        src_ids = torch.tensor(src, dtype=torch.long)
        dst_ids = self._ids(dst)
        for device_cache, cpu_cache in self._pools():
            device_cache.index_copy_(0, dst_ids, cpu_cache.index_select(0, src_ids).to(self.device))

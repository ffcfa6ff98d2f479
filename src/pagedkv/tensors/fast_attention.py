"""The fast path of paged decode attention: a compiled C++/OpenMP kernel that reads K/V in place.

Decode (one new token per sequence) is memory-bound: its cost is reading every cached K/V byte
once. The torch path (``attention.paged_attention_gather``) first gathers each sequence's blocks
into a fresh padded tensor, so it writes as many bytes as it reads and page-faults a new
K/V-sized allocation on every call. This kernel (``csrc/paged_decode.cpp``) walks the block
tables instead: one pass per (sequence, run of kv heads) with an online softmax, the kv head's
whole group of query heads together (GQA), parallel over the batch and the kv heads on
``torch.get_num_threads()`` OpenMP threads, accumulating in float32 for float32 and bfloat16.

No K/V-sized allocation per call, by construction: the Python side allocates the output (the
size of ``q``) and the int32 block table and lengths (one int per block and per sequence); the
kernel's only scratch is per-thread, ``O(heads_per_task * group * head_dim)`` floats. The tests
check the torch-side part with the profiler.

Built at first use by ``_build.build`` (a few seconds, cached per machine). If that fails (no
compiler) ``kernel()`` returns ``None`` after one warning and ``paged_attention`` uses the torch
path. ``PAGEDKV_FAST_ATTENTION=0`` in the environment turns the fast path off.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import warnings
from collections.abc import Sequence

import torch

from pagedkv.tensors import _build

DTYPES = (torch.float32, torch.bfloat16)
_SYMBOL = {torch.float32: "pagedkv_decode_f32", torch.bfloat16: "pagedkv_decode_bf16"}
_ABI_VERSION = 1
_ARGTYPES = [
    ctypes.c_void_p,  # q [batch, heads, head_dim]
    ctypes.c_void_p,  # cache_k [num_blocks, block_size, kv_heads, head_dim]
    ctypes.c_void_p,  # cache_v
    ctypes.c_void_p,  # out, like q
    ctypes.c_void_p,  # block tables, int32 [batch, table_stride]
    ctypes.c_int64,  # table_stride
    ctypes.c_void_p,  # context lengths, int32 [batch]
    ctypes.c_int64,  # batch
    ctypes.c_int64,  # kv_heads
    ctypes.c_int64,  # group (query heads per kv head)
    ctypes.c_int64,  # head_dim
    ctypes.c_int64,  # block_size
    ctypes.c_float,  # scale
    ctypes.c_int64,  # heads_per_task
    ctypes.c_int,  # threads
]


def enabled() -> bool:
    """False when ``PAGEDKV_FAST_ATTENTION=0`` (or ``false``/``no``/``off``) is set."""
    flag = os.environ.get("PAGEDKV_FAST_ATTENTION", "1").strip().lower()
    return flag not in ("0", "false", "no", "off")


@functools.cache
def kernel() -> ctypes.CDLL | None:
    """The compiled kernel library (built on first call), or ``None`` after one warning."""
    try:
        lib = ctypes.CDLL(str(_build.build("paged_decode")))
        if lib.pagedkv_abi_version() != _ABI_VERSION:
            raise _build.BuildError("stale kernel library (ABI version mismatch)")
        for symbol in _SYMBOL.values():
            fn = getattr(lib, symbol)
            fn.argtypes = _ARGTYPES
            fn.restype = None
    except (_build.BuildError, OSError, AttributeError) as exc:
        warnings.warn(
            f"pagedkv: fast paged attention unavailable, using the torch path: {exc}",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    return lib


def applies(
    q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, query_lens: Sequence[int]
) -> bool:
    """Whether ``decode_attention`` can run this (validated) batch: every sequence decodes one
    token, on the CPU, in float32 or bfloat16, over a contiguous cache."""
    return (
        enabled()
        and len(query_lens) > 0
        and all(n == 1 for n in query_lens)
        and q.device.type == "cpu"
        and cache_k.device.type == "cpu"
        and q.dtype in DTYPES
        and cache_k.is_contiguous()
        and cache_v.is_contiguous()
        and kernel() is not None
    )


def heads_per_task(batch: int, kv_heads: int, threads: int) -> int:
    """kv heads per task: all of them whenever the batch alone gives every thread a task, so a
    task streams whole blocks (contiguous); else just enough splitting for every thread to get
    one. Measured here (batch 32, context 2048, one thread): all 32 heads per task read K/V
    about 1.8x faster than 8 per task, whose rows are strided 4 KiB runs."""
    chunks = min(kv_heads, max(1, math.ceil(threads / batch)))
    return math.ceil(kv_heads / chunks)


def decode_attention(
    q: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    tables: Sequence[Sequence[int]],
    context_lens: Sequence[int],
    scale: float,
) -> torch.Tensor:
    """Decode attention through the kernel: ``q`` is ``[batch, heads, head_dim]`` (one token per
    sequence), ``tables[i]`` the first ``ceil(context_lens[i] / block_size)`` blocks of
    sequence ``i``. Callers use ``attention.paged_attention``, which validates everything first
    (with messages naming each argument) and checks ``applies``; the checks here are the few
    that keep the kernel's raw reads inside the cache whatever it is given."""
    lib = kernel()
    if lib is None:
        raise RuntimeError("the fast attention kernel is unavailable; check applies() first")
    batch, heads, head_dim = q.shape
    num_blocks, block_size, kv_heads, _ = cache_k.shape
    if not (cache_k.is_contiguous() and cache_v.is_contiguous()):
        raise ValueError("cache_k/cache_v: the kernel reads contiguous caches only")
    if cache_v.shape != cache_k.shape or cache_k.shape[3] != head_dim or heads % kv_heads:
        raise ValueError(f"q/cache: shapes {list(q.shape)} and {list(cache_k.shape)} disagree")
    if not q.dtype == cache_k.dtype == cache_v.dtype or q.dtype not in DTYPES:
        raise ValueError(f"q/cache: dtypes must be one of {DTYPES}, the same for all three")
    if not len(tables) == len(context_lens) == batch or batch == 0:
        raise ValueError(f"tables/context_lens: need {batch} (>= 1) of each, one per sequence")
    q = q.contiguous()
    out = torch.empty_like(q)
    width = max(len(t) for t in tables)
    table = torch.tensor([list(t) + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    lens = torch.tensor(list(context_lens), dtype=torch.int32)
    needed = (lens + block_size - 1) // block_size
    covered = torch.tensor([len(t) for t in tables]) >= needed
    if table.numel() and not (int(table.min()) >= 0 and int(table.max()) < num_blocks):
        raise ValueError(f"tables: block ids must lie in [0, {num_blocks})")
    if int(lens.min()) < 1 or not bool(covered.all()):
        raise ValueError("context_lens: each must be >= 1 and covered by its table's blocks")
    threads = torch.get_num_threads()
    getattr(lib, _SYMBOL[q.dtype])(
        q.data_ptr(),
        cache_k.data_ptr(),
        cache_v.data_ptr(),
        out.data_ptr(),
        table.data_ptr(),
        width,
        lens.data_ptr(),
        batch,
        kv_heads,
        heads // kv_heads,
        head_dim,
        block_size,
        scale,
        heads_per_task(batch, kv_heads, threads),
        threads,
    )
    return out

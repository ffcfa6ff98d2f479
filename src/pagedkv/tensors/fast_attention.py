"""The fast path of paged attention: a compiled C++/OpenMP kernel that reads K/V in place.

Decode (one new token per sequence) is memory-bound: its cost is reading every cached K/V byte
once. The torch path (``attention.paged_attention_gather``) first gathers each sequence's blocks
into a fresh padded tensor, so it writes as many bytes as it reads and page-faults a new
K/V-sized allocation on every call. This kernel (``csrc/paged_decode.cpp``) walks the block
tables instead: one pass per (sequence, run of kv heads, tile of query tokens) with an online
softmax, the kv head's whole group of query heads together (GQA), parallel over the tasks on
``torch.get_num_threads()`` OpenMP threads, accumulating in float32 for float32 and bfloat16.
Prefill and chunked-prefill sequences (several query tokens, causal) run in the same call as
decodes, so a mixed batch needs no K/V copy either. Vectors are 16 float lanes where the
compiler targets AVX-512 (``-march=native``), else 8 (``vector_lanes()`` says which).

No K/V-sized allocation per call, by construction: the Python side allocates the output (the
size of ``q``) and passes the block table, the lengths and the query offsets as int32 arrays
(one int per block and per sequence); the kernel's only scratch is per-thread,
``O(rows_per_task * head_dim)`` floats. The tests check the torch-side part with the profiler.

Built at first use by ``_build.build`` (a few seconds, cached per machine). If that fails (no
compiler) ``kernel()`` returns ``None`` after one warning and ``paged_attention`` uses the torch
path. ``PAGEDKV_FAST_ATTENTION=0`` in the environment turns the fast path off.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import math
import os
import warnings
from array import array
from collections.abc import Callable, Sequence

import numpy as np
import torch

from pagedkv.tensors import _build

DTYPES = (torch.float32, torch.bfloat16)
_SYMBOL = {torch.float32: "pagedkv_attention_f32", torch.bfloat16: "pagedkv_attention_bf16"}
_ABI_VERSION = 4
_ARGTYPES = [
    ctypes.c_void_p,  # q [num_tokens, heads, head_dim]
    ctypes.c_void_p,  # cache_k [num_blocks, block_size, kv_heads, head_dim]
    ctypes.c_void_p,  # cache_v
    ctypes.c_void_p,  # out, like q
    ctypes.c_void_p,  # block tables, int32, concatenated
    ctypes.c_void_p,  # where each sequence's table starts, int32 [batch + 1]
    ctypes.c_void_p,  # context lengths, int32 [batch]
    ctypes.c_void_p,  # query offsets, int32 [batch + 1]
    ctypes.c_int64,  # batch
    ctypes.c_int64,  # num_blocks
    ctypes.c_int64,  # kv_heads
    ctypes.c_int64,  # group (query heads per kv head)
    ctypes.c_int64,  # head_dim
    ctypes.c_int64,  # block_size
    ctypes.c_float,  # scale
    ctypes.c_int64,  # sliding window (keys p - window < k <= p), >= 1
    ctypes.c_int64,  # kv heads per decode task
    ctypes.c_int,  # threads
]
assert array("i").itemsize == 4, "the kernel takes int32 arrays"
_NO_WINDOW = 1 << 62  # a window longer than any context
# the kernel's return codes (nothing is written unless it returns 0)
_ERRORS = {
    1: "tables: block ids must lie in [0, num_blocks)",
    2: "context_lens: each must be covered by its table's blocks",
    3: "query_lens/sliding_window: need 0 <= query_len <= context_len, a window >= 1",
}


def enabled() -> bool:
    """False when ``PAGEDKV_FAST_ATTENTION=0`` (or ``false``/``no``/``off``) is set."""
    flag = os.environ.get("PAGEDKV_FAST_ATTENTION", "1").strip().lower()
    return flag not in ("0", "false", "no", "off")


def load(path: str) -> ctypes.CDLL:
    """The kernel library at ``path`` with its entry points typed; ``BuildError`` if its ABI is
    not this module's (a stale build)."""
    lib = ctypes.CDLL(path)
    if lib.pagedkv_abi_version() != _ABI_VERSION:
        raise _build.BuildError("stale kernel library (ABI version mismatch)")
    for symbol in _SYMBOL.values():
        fn = getattr(lib, symbol)
        fn.argtypes = _ARGTYPES
        fn.restype = ctypes.c_int
    return lib


@functools.cache
def kernel() -> ctypes.CDLL | None:
    """The compiled kernel library (built on first call), or ``None`` after one warning."""
    try:
        lib = load(str(_build.build("paged_decode")))
    except (_build.BuildError, OSError, AttributeError) as exc:
        warnings.warn(
            f"pagedkv: fast paged attention unavailable, using the torch path: {exc}",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    return lib


def vector_lanes() -> int:
    """Float lanes per vector in the built kernel: 16 with AVX-512, 8 otherwise; 0 if unbuilt."""
    lib = kernel()
    return int(lib.pagedkv_vector_lanes()) if lib is not None else 0


def applies(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor) -> bool:
    """Whether ``attention`` can run this (validated) batch: on the CPU, in float32 or bfloat16,
    over a contiguous cache. Any mix of decode, prefill and chunked prefill."""
    return (
        q.device.type == "cpu"
        and cache_k.device.type == "cpu"
        and q.dtype in DTYPES
        and cache_k.is_contiguous()
        and cache_v.is_contiguous()
        and enabled()
        and kernel() is not None
    )


def heads_per_task(batch: int, kv_heads: int, threads: int) -> int:
    """kv heads per decode task: all of them whenever the batch alone gives every thread a
    task, so a task streams whole blocks (contiguous); else just enough splitting for every
    thread to get one. Measured here (batch 32, context 2048, one thread): all 32 heads per task
    read K/V about 1.8x faster than 8 per task, whose rows are strided 4 KiB runs. (Prefill
    tasks are sized by the kernel: a tile of query tokens by a few kv heads.)"""
    chunks = min(kv_heads, max(1, math.ceil(threads / batch)))
    return math.ceil(kv_heads / chunks)


def attention(
    q: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    tables: Sequence[Sequence[int]],
    context_lens: Sequence[int],
    query_lens: Sequence[int],
    scale: float,
    *,
    sliding_window: int | None = None,
    ids: np.ndarray | None = None,
) -> torch.Tensor:
    """Paged attention through the kernel: ``q`` is ``[sum(query_lens), heads, head_dim]``, the
    sequences' new tokens concatenated (each at the end of its context, causal), ``tables[i]``
    at least the first ``ceil(context_lens[i] / block_size)`` blocks of sequence ``i``. Callers
    use ``attention.paged_attention``, which validates everything first (with messages naming
    each argument) and checks ``applies``; the checks here (and the kernel's own, before it
    reads anything) are the few that keep the kernel's raw reads inside the cache and its
    writes inside the output whatever it is given. ``sliding_window`` limits each query to the
    latest keys as in ``attention.paged_attention``. ``ids``, the tables concatenated as an
    integer array, saves converting them again when the caller has it."""
    return prepare(
        q, cache_k, cache_v, tables, context_lens, query_lens, scale,
        sliding_window=sliding_window, ids=ids,
    )()  # fmt: skip


def prepare(
    q: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    tables: Sequence[Sequence[int]],
    context_lens: Sequence[int],
    query_lens: Sequence[int],
    scale: float,
    *,
    sliding_window: int | None = None,
    ids: np.ndarray | None = None,
) -> Callable[[], torch.Tensor]:
    """``attention``'s checks and conversions, done once: the returned function runs the kernel
    on these tensors' current contents into one output tensor, which it returns (the same
    tensor on every call). For timing the kernel alone (``benchmarks/bench_attention.py``)."""
    lib = kernel()
    if lib is None:
        raise RuntimeError("the fast attention kernel is unavailable; check applies() first")
    num_tokens, heads, head_dim = q.shape
    num_blocks, block_size, kv_heads, _ = cache_k.shape
    if not (cache_k.is_contiguous() and cache_v.is_contiguous()):
        raise ValueError("cache_k/cache_v: the kernel reads contiguous caches only")
    if cache_v.shape != cache_k.shape or cache_k.shape[3] != head_dim or heads % kv_heads:
        raise ValueError(f"q/cache: shapes {list(q.shape)} and {list(cache_k.shape)} disagree")
    if not q.dtype == cache_k.dtype == cache_v.dtype or q.dtype not in DTYPES:
        raise ValueError(f"q/cache: dtypes must be one of {DTYPES}, the same for all three")
    batch = len(tables)
    if not len(context_lens) == len(query_lens) == batch or batch == 0:
        raise ValueError(f"tables/context_lens/query_lens: need {batch} (>= 1) of each")
    starts = array("i", itertools.accumulate(query_lens, initial=0))
    if starts[-1] != num_tokens:
        raise ValueError(f"q: has {num_tokens} tokens but sum(query_lens) = {starts[-1]}")
    if ids is None:
        ids = np.array(list(itertools.chain.from_iterable(tables)), dtype=np.int64)
    if ids.size and not (int(ids.min()) >= 0 and int(ids.max()) < num_blocks):
        raise ValueError(_ERRORS[1])  # here, before the narrowing to int32 could wrap one
    flat = np.ascontiguousarray(ids, dtype=np.int32)
    table_starts = array("i", itertools.accumulate(map(len, tables), initial=0))
    lens = array("i", context_lens)
    q = q.contiguous()
    out = torch.empty_like(q)
    threads = torch.get_num_threads()
    fn = getattr(lib, _SYMBOL[q.dtype])
    args = (
        q.data_ptr(),
        cache_k.data_ptr(),
        cache_v.data_ptr(),
        out.data_ptr(),
        flat.ctypes.data,
        table_starts.buffer_info()[0],
        lens.buffer_info()[0],
        starts.buffer_info()[0],
        batch,
        num_blocks,
        kv_heads,
        heads // kv_heads,
        head_dim,
        block_size,
        scale,
        _NO_WINDOW if sliding_window is None else sliding_window,
        heads_per_task(batch, kv_heads, threads),
        threads,
    )
    keep = (q, cache_k, cache_v, flat, table_starts, lens, starts)  # alive while fn may run

    def run() -> torch.Tensor:
        code = fn(*args)
        if code:
            raise ValueError(_ERRORS.get(code, f"the kernel refused its input (code {code})"))
        assert keep
        return out

    return run

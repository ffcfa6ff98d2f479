"""Paged attention over the paged KV cache, with grouped-query attention (GQA).

One form covers every step of a sequence: its ``query_lens[i]`` new tokens sit at the END of its
``context_lens[i]`` tokens (whose K/V, the new tokens' included, are already written in the
cache), and each new token attends causally to every token up to and including itself. So:

* prefill with nothing cached:   ``query_len == context_len``
* chunked prefill / prefix hit:  ``0 < query_len < context_len``
* decode:                        ``query_len == 1``

Shapes (``T = sum(query_lens)``, ``H`` query heads, ``KVH`` kv heads, ``H % KVH == 0``; query
head ``h`` reads kv head ``h // (H // KVH)``)::

    q                 [T, H, head_dim]      the sequences' new tokens, concatenated in order
    cache_k, cache_v  [num_blocks, block_size, KVH, head_dim]   one layer of a PagedKVCache
    block_tables      one list of physical block ids per sequence (or a padded 2-D tensor;
                      only the first ceil(context_len / block_size) entries of a row are read)
    context_lens, query_lens   one int per sequence (lists or 1-D tensors)
    returns           [T, H, head_dim]

Three implementations, same signature and same result:

* ``paged_attention_reference``: a plain loop over sequences, in float32 (float64 for float64
  inputs) with an explicit softmax. Slow, obviously right.
* ``paged_attention_gather``: plain torch, vectorised: one ``index_select`` of every needed block
  into a padded ``[batch, max_blocks * block_size, KVH, head_dim]`` tensor, one boolean mask
  (causality and padding), GQA by folding each kv head's group of query heads into the query
  axis (K/V are never repeated), and one ``scaled_dot_product_attention`` call in the input
  dtype. Any device, any dtype, any mix of prefill and decode; but it copies K/V on every call.
* ``paged_attention``: what callers use. A batch on the CPU in float32 or bfloat16, any mix of
  decode, prefill and chunked prefill, goes to the compiled kernel of ``fast_attention`` (reads
  K/V in place, one pass, online softmax, float32 accumulation, no K/V-sized copy); everything
  else, or a machine where the kernel cannot be built, goes to ``paged_attention_gather``.

``sliding_window = w`` (Mistral) limits each query to the latest ``w`` keys, itself included
(key position > query position - w, as transformers' sliding-window mask), in every
implementation, the kernel's included (it reads only the window's blocks). The memory books
keep every block of a windowed sequence (the blocks that slid out are not freed early).

Tolerance (tested with Hypothesis against dense ``scaled_dot_product_attention`` on the same K/V,
contiguous, causal with the offset ``context_len - query_len``, random inputs in [-1, 1)):
float32 ``atol = rtol = 1e-5``; float64 ``1e-10``; bfloat16 ``atol = rtol = 1e-2`` (bfloat16
keeps 8 significant bits: 1e-2 is about 2.5 ulps at 0.5..1; the kernels round in different
places). Observed worst cases over 300 random batches: float32 2e-7, float64 4e-16, bfloat16
3.9e-3 (one ulp). The fast path is held to the same tolerances.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import NamedTuple, TypeAlias

import numpy as np
import torch
import torch.nn.functional as F

from pagedkv.tensors import fast_attention

BlockTables: TypeAlias = Sequence[Sequence[int]] | torch.Tensor
Lengths: TypeAlias = Sequence[int] | torch.Tensor


class _Batch(NamedTuple):
    tables: list[list[int]]  # the needed prefix of each block table
    context_lens: list[int]
    query_lens: list[int]
    scale: float
    group: int  # query heads per kv head
    ids: np.ndarray  # the tables concatenated, integers


def _int_list(name: str, values: Lengths) -> list[int]:
    if isinstance(values, torch.Tensor):
        if values.dim() != 1:
            raise ValueError(f"{name}: expected a 1-D tensor, got shape {list(values.shape)}")
        return [int(x) for x in values.tolist()]
    return [int(x) for x in values]


def _check_batch(
    q: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    block_tables: BlockTables,
    context_lens: Lengths,
    query_lens: Lengths,
    scale: float | None,
) -> _Batch:
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise ValueError("q: expected a tensor [num_tokens, num_heads, head_dim]")
    if not isinstance(cache_k, torch.Tensor) or cache_k.dim() != 4:
        raise ValueError(
            "cache_k: expected a tensor [num_blocks, block_size, num_kv_heads, head_dim]"
        )
    if not isinstance(cache_v, torch.Tensor) or cache_v.shape != cache_k.shape:
        got = list(cache_v.shape) if isinstance(cache_v, torch.Tensor) else type(cache_v).__name__
        raise ValueError(f"cache_v: expected the shape of cache_k {list(cache_k.shape)}, got {got}")
    num_tokens, num_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, kv_head_dim = cache_k.shape
    if head_dim != kv_head_dim:
        raise ValueError(f"q: head_dim {head_dim} differs from the cache's head_dim {kv_head_dim}")
    if num_heads % num_kv_heads != 0:
        raise ValueError(
            f"q: num_heads {num_heads} is not a multiple of the cache's num_kv_heads {num_kv_heads}"
        )
    for name, t in (("cache_k", cache_k), ("cache_v", cache_v)):
        if t.dtype != q.dtype:
            raise ValueError(f"{name}: dtype {t.dtype} differs from q's dtype {q.dtype}")
    if isinstance(block_tables, torch.Tensor):
        if block_tables.dim() != 2:
            raise ValueError(
                f"block_tables: expected a 2-D tensor, got shape {list(block_tables.shape)}"
            )
        rows: list[list[int]] = block_tables.tolist()
    else:
        rows = [row if isinstance(row, list) else list(row) for row in block_tables]
    ctx = _int_list("context_lens", context_lens)
    qlens = _int_list("query_lens", query_lens)
    if not len(rows) == len(ctx) == len(qlens):
        raise ValueError(
            f"block_tables/context_lens/query_lens: one entry per sequence each, got "
            f"{len(rows)}, {len(ctx)}, {len(qlens)}"
        )
    needed = [-(-c // block_size) for c in ctx]
    tables = [row[:n] for row, n in zip(rows, needed, strict=True)]
    ids = np.array(list(itertools.chain.from_iterable(tables)))
    if ids.size and ids.dtype.kind != "i":  # not all integers: as int() makes them, slowly
        rows = [list(map(int, row)) for row in rows]
        tables = [row[:n] for row, n in zip(rows, needed, strict=True)]
        ids = np.array(list(itertools.chain.from_iterable(tables)), dtype=np.int64)
    valid = (  # the whole batch at C speed; on a failure _explain names the first culprit
        all(0 <= ql <= c for ql, c in zip(qlens, ctx, strict=True))
        and all(len(t) == n for t, n in zip(tables, needed, strict=True))
        and (not ids.size or (int(ids.min()) >= 0 and int(ids.max()) < num_blocks))
    )
    if not valid:
        _explain(rows, ctx, qlens, block_size, num_blocks)
    if sum(qlens) != num_tokens:
        raise ValueError(f"q: has {num_tokens} tokens but sum(query_lens) = {sum(qlens)}")
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    return _Batch(tables, ctx, qlens, float(scale), num_heads // num_kv_heads, ids)


def _explain(
    rows: list[list[int]], ctx: list[int], qlens: list[int], block_size: int, num_blocks: int
) -> None:
    """Raise the error of the first invalid sequence of a batch known to hold one."""
    for i, (row, c, ql) in enumerate(zip(rows, ctx, qlens, strict=True)):
        if c < 0:
            raise ValueError(f"context_lens: context_lens[{i}] = {c} is negative")
        if not 0 <= ql <= c:
            raise ValueError(
                f"query_lens: need 0 <= query_lens[{i}] <= context_lens[{i}], got {ql} and {c}"
            )
        needed = -(-c // block_size)
        if len(row) < needed:
            raise ValueError(
                f"block_tables: block_tables[{i}] has {len(row)} blocks; context_lens[{i}] = {c} "
                f"needs {needed} blocks of {block_size}"
            )
        for b in row[:needed]:
            if not 0 <= b < num_blocks:
                raise ValueError(
                    f"block_tables: block_tables[{i}] holds block {b}, out of range for "
                    f"{num_blocks} blocks"
                )
    raise AssertionError("_explain found nothing wrong")  # pragma: no cover


def paged_attention_reference(
    q: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    block_tables: BlockTables,
    context_lens: Lengths,
    query_lens: Lengths,
    scale: float | None = None,
    *,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Paged attention, one sequence at a time (see the module docstring for the shapes).

    ``scale`` defaults to ``1 / sqrt(head_dim)``. Computes in float32 (float64 for float64
    inputs) and returns ``q``'s dtype.
    """
    batch = _check_batch(q, cache_k, cache_v, block_tables, context_lens, query_lens, scale)
    _, block_size, num_kv_heads, head_dim = cache_k.shape
    window = ctx_window(sliding_window)
    compute = torch.promote_types(q.dtype, torch.float32)
    out = torch.empty_like(q)
    start = 0
    for table, ctx, qlen in zip(batch.tables, batch.context_lens, batch.query_lens, strict=True):
        if qlen == 0:
            continue
        index = torch.tensor(table, dtype=torch.long, device=cache_k.device)
        shape = (len(table) * block_size, num_kv_heads, head_dim)
        k = cache_k.index_select(0, index).reshape(shape)[:ctx]
        v = cache_v.index_select(0, index).reshape(shape)[:ctx]
        k = k.repeat_interleave(batch.group, dim=1).to(compute)  # [ctx, H, head_dim]
        v = v.repeat_interleave(batch.group, dim=1).to(compute)
        qs = q[start : start + qlen].to(compute)  # [qlen, H, head_dim]
        scores = torch.einsum("qhd,khd->hqk", qs, k) * batch.scale
        query_pos = torch.arange(ctx - qlen, ctx, device=q.device)
        key_pos = torch.arange(ctx, device=q.device)
        causal = key_pos[None, :] <= query_pos[:, None]  # [qlen, ctx]
        causal &= key_pos[None, :] > query_pos[:, None] - window
        scores = scores.masked_fill(~causal, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[start : start + qlen] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
        start += qlen
    return out


def paged_attention(
    q: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    block_tables: BlockTables,
    context_lens: Lengths,
    query_lens: Lengths,
    scale: float | None = None,
    *,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Paged attention, the fast path where it applies (see the module docstring for the shapes
    and the tolerance against the reference).

    A batch on the CPU in float32 or bfloat16 (decodes, prefills and chunks alike) runs the
    compiled kernel of ``fast_attention`` (no K/V copy), with or without a sliding window;
    anything else runs ``paged_attention_gather``.
    """
    batch = _check_batch(q, cache_k, cache_v, block_tables, context_lens, query_lens, scale)
    window = ctx_window(sliding_window)
    if fast_attention.applies(q, cache_k, cache_v):
        return fast_attention.attention(
            q,
            cache_k,
            cache_v,
            batch.tables,
            batch.context_lens,
            batch.query_lens,
            batch.scale,
            sliding_window=window,
            ids=batch.ids,
        )
    return _gather_attention(q, cache_k, cache_v, batch, window)


def paged_attention_gather(
    q: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    block_tables: BlockTables,
    context_lens: Lengths,
    query_lens: Lengths,
    scale: float | None = None,
    *,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Paged attention in plain torch, vectorised over the batch (gather, then SDPA): the
    fallback of ``paged_attention``, for every device, dtype and batch.

    Pads every sequence to the batch's longest context (in whole blocks) and longest query, so a
    batch mixing one long prefill with many decodes computes ``batch * max_query_len`` query rows;
    the scheduler's token budget bounds that.
    """
    batch = _check_batch(q, cache_k, cache_v, block_tables, context_lens, query_lens, scale)
    return _gather_attention(q, cache_k, cache_v, batch, ctx_window(sliding_window))


def ctx_window(sliding_window: int | None) -> int:
    """How many of the latest keys (itself included) a query sees: all, or the window."""
    if sliding_window is None:
        return 1 << 62
    if (
        isinstance(sliding_window, bool)
        or not isinstance(sliding_window, int)
        or sliding_window < 1
    ):
        raise ValueError(f"sliding_window: expected None or an int >= 1, got {sliding_window!r}")
    return sliding_window


def _gather_attention(
    q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, batch: _Batch, window: int
) -> torch.Tensor:
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = cache_k.shape
    if num_tokens == 0:
        return torch.empty_like(q)
    device = q.device
    group = batch.group
    num_seqs = len(batch.tables)
    max_blocks = max(len(t) for t in batch.tables)
    max_q = max(batch.query_lens)
    kv_len = max_blocks * block_size

    # every needed block of the batch in one gather; padding reads block 0 and is masked out
    padded = [t + [0] * (max_blocks - len(t)) for t in batch.tables]
    index = torch.tensor(padded, dtype=torch.long, device=device).flatten()
    kv_shape = (num_seqs, kv_len, num_kv_heads, head_dim)
    k = cache_k.index_select(0, index).view(kv_shape).transpose(1, 2)  # [B, KVH, L, D]
    v = cache_v.index_select(0, index).view(kv_shape).transpose(1, 2)

    # scatter the concatenated queries into [B, max_q, H, D]
    qlens = torch.tensor(batch.query_lens, dtype=torch.long, device=device)
    ctx = torch.tensor(batch.context_lens, dtype=torch.long, device=device)
    seq_of_token = torch.repeat_interleave(torch.arange(num_seqs, device=device), qlens)
    first_token = torch.cumsum(qlens, 0) - qlens
    pos_in_query = torch.arange(num_tokens, device=device) - first_token[seq_of_token]
    q_padded = q.new_zeros((num_seqs, max_q, num_heads, head_dim))
    q_padded[seq_of_token, pos_in_query] = q
    # GQA: fold each kv head's group of query heads into the query axis -> [B, KVH, G*max_q, D]
    q_padded = (
        q_padded.view(num_seqs, max_q, num_kv_heads, group, head_dim)
        .permute(0, 2, 3, 1, 4)
        .reshape(num_seqs, num_kv_heads, group * max_q, head_dim)
    )

    # query j of sequence i sits at position ctx_i - qlen_i + j and sees keys up to it (which
    # excludes the padded keys); padded query rows see everything (no all -inf row, no NaN)
    j = torch.arange(max_q, device=device)
    query_pos = (ctx - qlens)[:, None] + j[None, :]  # [B, max_q]
    key_pos = torch.arange(kv_len, device=device)
    mask = key_pos[None, None, :] <= query_pos[:, :, None]  # [B, max_q, L]
    if window < kv_len:
        mask &= key_pos[None, None, :] > query_pos[:, :, None] - window
    mask |= (j[None, :] >= qlens[:, None])[:, :, None]
    mask = (
        mask[:, None, None]
        .expand(num_seqs, 1, group, max_q, kv_len)
        .reshape(num_seqs, 1, group * max_q, kv_len)
    )

    out = F.scaled_dot_product_attention(q_padded, k, v, attn_mask=mask, scale=batch.scale)
    out = (
        out.view(num_seqs, num_kv_heads, group, max_q, head_dim)
        .permute(0, 3, 1, 2, 4)
        .reshape(num_seqs, max_q, num_heads, head_dim)
    )
    return out[seq_of_token, pos_in_query]

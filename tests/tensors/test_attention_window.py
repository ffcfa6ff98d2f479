"""Sliding-window paged attention (Mistral): every implementation equals dense SDPA whose mask
lets a query at position p see the keys at positions p - window < k <= p, on random batches
of decodes, prefills and chunks; a window no shorter than the context changes nothing."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from pagedkv.tensors.kv_cache import PagedKVCache, slot_mapping
from tests.tensors.test_attention import (
    IMPLEMENTATIONS,
    SETTINGS,
    TOLERANCE,
    Attention,
    Batch,
    _uniform,
    batches,
)


def windowed_dense(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int, window: int
) -> torch.Tensor:
    qlen, ctx = q.shape[0], k.shape[0]
    query_pos = torch.arange(ctx - qlen, ctx)[:, None]
    key_pos = torch.arange(ctx)[None, :]
    mask = (key_pos <= query_pos) & (key_pos > query_pos - window)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.repeat_interleave(group, dim=1).transpose(0, 1),
        v.repeat_interleave(group, dim=1).transpose(0, 1),
        attn_mask=mask,
    )
    return out.transpose(0, 1)


def _setup(b: Batch, window: int) -> tuple[torch.Tensor, PagedKVCache, torch.Tensor]:
    g = torch.Generator().manual_seed(b.seed)
    cache = PagedKVCache(1, b.num_blocks, b.block_size, b.num_kv_heads, b.head_dim, dtype=b.dtype)
    for t in (cache.k_caches[0], cache.v_caches[0]):
        t.copy_(100 * _uniform(g, *t.shape, dtype=b.dtype))
    q = _uniform(g, sum(b.query_lens), b.num_heads, b.head_dim, dtype=b.dtype)
    expected, start = [], 0
    for ctx, qlen, table in zip(b.context_lens, b.query_lens, b.block_tables, strict=True):
        k = _uniform(g, ctx, b.num_kv_heads, b.head_dim, dtype=b.dtype)
        v = _uniform(g, ctx, b.num_kv_heads, b.head_dim, dtype=b.dtype)
        cache.write(0, slot_mapping(table, 0, ctx, b.block_size), k, v)
        expected.append(windowed_dense(q[start : start + qlen], k, v, b.group, window))
        start += qlen
    return q, cache, torch.cat(expected)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda f: f.__name__)
@SETTINGS
@given(b=batches(), window=st.integers(1, 60))
def test_sliding_window_equals_masked_dense_sdpa(impl: Attention, b: Batch, window: int) -> None:
    q, cache, expected = _setup(b, window)
    out = impl(
        q,
        cache.k_caches[0],
        cache.v_caches[0],
        b.block_tables,
        b.context_lens,
        b.query_lens,
        sliding_window=window,
    )
    atol, rtol = TOLERANCE[b.dtype]
    torch.testing.assert_close(out, expected, atol=atol, rtol=rtol)
    if window >= max(b.context_lens):
        plain = impl(
            q, cache.k_caches[0], cache.v_caches[0], b.block_tables, b.context_lens, b.query_lens
        )
        torch.testing.assert_close(out, plain, atol=atol, rtol=rtol)


@pytest.mark.parametrize("window", [0, -1, True, 2.5])
def test_a_bad_window_is_refused(window: object) -> None:
    from pagedkv.tensors.attention import paged_attention

    cache = PagedKVCache(1, 1, 4, 1, 8)
    with pytest.raises(ValueError, match="sliding_window"):
        paged_attention(
            torch.zeros(1, 1, 8),
            cache.k_caches[0],
            cache.v_caches[0],
            [[0]],
            [1],
            [1],
            sliding_window=window,  # type: ignore[arg-type]
        )

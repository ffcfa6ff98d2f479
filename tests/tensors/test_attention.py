"""Paged attention (reference loop, torch gather path, the dispatching ``paged_attention``)
equals dense SDPA on the same K/V. The compiled kernel: ``test_attention_fast.py``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

pytest.importorskip("torch")

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.tensors.attention import (
    paged_attention,
    paged_attention_gather,
    paged_attention_reference,
)
from pagedkv.tensors.kv_cache import PagedKVCache, slot_mapping

SETTINGS = settings(max_examples=50, deadline=None)
TOLERANCE = {  # (atol, rtol) against dense SDPA
    torch.float32: (1e-5, 1e-5),
    torch.float64: (1e-10, 1e-10),
    torch.bfloat16: (1e-2, 1e-2),
}
Attention = Callable[..., torch.Tensor]
IMPLEMENTATIONS: list[Attention] = [
    paged_attention_reference,
    paged_attention_gather,
    paged_attention,
]


@dataclass
class Batch:
    block_size: int
    num_kv_heads: int
    group: int
    head_dim: int
    dtype: torch.dtype
    context_lens: list[int]
    query_lens: list[int]
    block_tables: list[list[int]]
    num_blocks: int
    seed: int

    @property
    def num_heads(self) -> int:
        return self.num_kv_heads * self.group


@st.composite
def batches(
    draw: st.DrawFn,
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float64),
    kinds: tuple[str, ...] = ("decode", "prefill", "chunked"),
    block_sizes: tuple[int, ...] = (1, 16, 7),
    head_dims: tuple[int, ...] = (8, 16),
    max_group: int = 3,
    max_context: int = 48,
) -> Batch:
    block_size = draw(st.sampled_from(block_sizes))
    context_lens, query_lens = [], []
    for _ in range(draw(st.integers(1, 4))):
        ctx = draw(st.integers(1, max_context))
        kind = draw(st.sampled_from(kinds))
        if kind == "decode":
            qlen = 1
        elif kind == "prefill":
            qlen = ctx
        else:  # a later chunk of a prefill, or a prompt whose prefix is cached
            qlen = draw(st.integers(1, max(1, ctx - 1)))
        context_lens.append(ctx)
        query_lens.append(qlen)
    needed = [-(-c // block_size) for c in context_lens]
    num_blocks = sum(needed) + draw(st.integers(0, 3))
    perm = draw(st.permutations(range(num_blocks)))  # scattered, non-contiguous blocks
    tables, at = [], 0
    for n in needed:
        tables.append(list(perm[at : at + n]))
        at += n
    return Batch(
        block_size=block_size,
        num_kv_heads=draw(st.integers(1, 2)),
        group=draw(st.integers(1, max_group)),
        head_dim=draw(st.sampled_from(head_dims)),
        dtype=draw(st.sampled_from(dtypes)),
        context_lens=context_lens,
        query_lens=query_lens,
        block_tables=tables,
        num_blocks=num_blocks,
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def _uniform(g: torch.Generator, *shape: int, dtype: torch.dtype) -> torch.Tensor:
    return (2 * torch.rand(shape, generator=g, dtype=torch.float64) - 1).to(dtype)


def setup(b: Batch) -> tuple[torch.Tensor, PagedKVCache, torch.Tensor]:
    """(q, a cache holding every sequence's K/V amid garbage, the dense expected output)."""
    g = torch.Generator().manual_seed(b.seed)
    cache = PagedKVCache(1, b.num_blocks, b.block_size, b.num_kv_heads, b.head_dim, dtype=b.dtype)
    for t in (cache.k_caches[0], cache.v_caches[0]):  # garbage in the unused slots
        t.copy_(100 * _uniform(g, *t.shape, dtype=b.dtype))
    q = _uniform(g, sum(b.query_lens), b.num_heads, b.head_dim, dtype=b.dtype)
    expected, start = [], 0
    for ctx, qlen, table in zip(b.context_lens, b.query_lens, b.block_tables, strict=True):
        k = _uniform(g, ctx, b.num_kv_heads, b.head_dim, dtype=b.dtype)
        v = _uniform(g, ctx, b.num_kv_heads, b.head_dim, dtype=b.dtype)
        cache.write(0, slot_mapping(table, 0, ctx, b.block_size), k, v)
        expected.append(dense_attention(q[start : start + qlen], k, v, b.group))
        start += qlen
    return q, cache, torch.cat(expected)


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int) -> torch.Tensor:
    """SDPA on contiguous K/V: the ``len(q)`` queries are the last of the ``len(k)`` tokens."""
    qlen, ctx = q.shape[0], k.shape[0]
    mask = torch.ones(qlen, ctx, dtype=torch.bool).tril(diagonal=ctx - qlen)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.repeat_interleave(group, dim=1).transpose(0, 1),
        v.repeat_interleave(group, dim=1).transpose(0, 1),
        attn_mask=mask,
    )
    return out.transpose(0, 1)


def run(impl: Attention, b: Batch, q: torch.Tensor, cache: PagedKVCache) -> torch.Tensor:
    return impl(
        q, cache.k_caches[0], cache.v_caches[0], b.block_tables, b.context_lens, b.query_lens
    )


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda f: f.__name__)
@SETTINGS
@given(b=batches())
def test_paged_attention_equals_dense_sdpa(impl: Attention, b: Batch) -> None:
    q, cache, expected = setup(b)
    out = run(impl, b, q, cache)
    assert out.shape == q.shape
    assert out.dtype == q.dtype
    atol, rtol = TOLERANCE[b.dtype]
    torch.testing.assert_close(out, expected, atol=atol, rtol=rtol)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda f: f.__name__)
@settings(max_examples=20, deadline=None)
@given(b=batches(dtypes=(torch.bfloat16,)))
def test_paged_attention_bfloat16(impl: Attention, b: Batch) -> None:
    q, cache, expected = setup(b)
    atol, rtol = TOLERANCE[torch.bfloat16]
    torch.testing.assert_close(run(impl, b, q, cache), expected, atol=atol, rtol=rtol)


def test_every_path_takes_tensors_and_padded_block_tables() -> None:
    b = Batch(7, 2, 2, 8, torch.float64, [9, 20, 3], [9, 1, 2], [[4, 0], [1, 5, 2], [3]], 6, 11)
    q, cache, expected = setup(b)
    padded = torch.tensor([[4, 0, -1], [1, 5, 2], [3, -1, -1]])  # -1: never read
    for fn in IMPLEMENTATIONS:
        out = fn(
            q,
            cache.k_caches[0],
            cache.v_caches[0],
            padded,
            torch.tensor(b.context_lens),
            torch.tensor(b.query_lens),
        )
        torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-10)


def test_scale_is_passed_through() -> None:
    b = Batch(16, 1, 1, 8, torch.float64, [5], [5], [[0]], 1, 3)
    q, cache, _ = setup(b)
    args = (cache.k_caches[0], cache.v_caches[0], b.block_tables, b.context_lens, b.query_lens)
    for fn in IMPLEMENTATIONS:
        default = fn(q, *args)
        torch.testing.assert_close(fn(q, *args, 8**-0.5), default, atol=1e-12, rtol=0)
        assert not torch.allclose(fn(q, *args, 2.0), default)


def test_a_sequence_with_no_new_tokens_is_skipped() -> None:
    b = Batch(4, 1, 2, 8, torch.float64, [6, 5], [0, 2], [[2, 1], [0, 3]], 4, 5)
    q, cache, expected = setup(b)
    for fn in IMPLEMENTATIONS:
        out = fn(q, cache.k_caches[0], cache.v_caches[0], b.block_tables, [6, 5], [0, 2])
        torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-10)
    empty = q[:0]
    for fn in IMPLEMENTATIONS:
        assert fn(empty, cache.k_caches[0], cache.v_caches[0], [[0]], [3], [0]).shape == (0, 2, 8)


@pytest.mark.parametrize("fn", IMPLEMENTATIONS, ids=lambda f: f.__name__)
def test_bad_arguments_raise_value_errors_naming_them(fn: Attention) -> None:
    ck = torch.zeros(4, 4, 2, 8)
    q = torch.zeros(3, 4, 8)
    ok = ([[0, 1]], [5], [3])

    def raises(match: str, *args: object) -> None:
        with pytest.raises(ValueError, match=match):
            fn(*args)

    raises(r"^q:", torch.zeros(3, 4), ck, ck, *ok)
    raises(r"^q: head_dim", torch.zeros(3, 4, 16), ck, ck, *ok)
    raises(r"^q: num_heads", torch.zeros(3, 3, 8), ck, ck, *ok)
    raises(r"^q: has 3 tokens", q, ck, ck, [[0, 1]], [5], [2])
    raises(r"^cache_k:", q, torch.zeros(4, 4, 16), ck, *ok)
    raises(r"^cache_v:", q, ck, torch.zeros(4, 4, 1, 8), *ok)
    raises(r"^cache_k: dtype", q, ck.double(), ck, *ok)
    raises(r"^block_tables/context_lens/query_lens", q, ck, ck, [[0, 1]], [5, 1], [3])
    raises(r"^query_lens", q, ck, ck, [[0, 1]], [2], [3])
    raises(r"^context_lens", q, ck, ck, [[0, 1]], [-1], [3])
    raises(r"^block_tables: block_tables\[0\] has 1", q, ck, ck, [[0]], [5], [3])
    raises(r"^block_tables: block_tables\[0\] holds block 4", q, ck, ck, [[0, 4]], [5], [3])
    raises(r"^block_tables: expected a 2-D", q, ck, ck, torch.tensor([0, 1]), [5], [3])
    raises(r"^context_lens: expected a 1-D", q, ck, ck, [[0, 1]], torch.tensor([[5]]), [3])
    # several faults: the first sequence's is named (a valid one before it)
    two = ([[0, 1], [9], [0]], [5, 3, -1], [2, 1, 0])
    raises(r"^block_tables: block_tables\[1\] holds block 9", q, ck, ck, *two)
    raises(r"^block_tables: block_tables\[1\] has 0", q, ck, ck, [[0, 1], []], [5, 3], [2, 1])

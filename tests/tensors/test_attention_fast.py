"""The compiled decode kernel (``fast_attention``): equal to dense SDPA and to the reference on
decode batches, chosen by ``paged_attention`` exactly when it applies, replaced by the torch path
when it cannot be built, and free of K/V-sized allocations."""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("torch")

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.profiler import ProfilerActivity, profile

from pagedkv.tensors import _build, fast_attention
from pagedkv.tensors.attention import paged_attention, paged_attention_reference
from tests.tensors.test_attention import TOLERANCE, Batch, batches, setup

if fast_attention.kernel() is None:  # built here on first use: a few seconds, once per machine
    pytest.skip("the fast path could not be built here (see the warning)", allow_module_level=True)


def decode_batches(dtypes: tuple[torch.dtype, ...]) -> st.SearchStrategy[Batch]:
    """Decode batches shaped to reach every branch of the kernel: head_dim 12 (a scalar tail),
    40 (8-lane steps past the 32-lane loop) and 64; blocks below, at and above its 16-token
    chunk; contexts of several chunks; GQA groups up to 4."""
    return batches(
        dtypes=dtypes,
        kinds=("decode",),
        block_sizes=(1, 7, 16, 40),
        head_dims=(12, 40, 64),
        max_group=4,
        max_context=120,
    )


def fast(b: Batch, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return fast_attention.decode_attention(
        q, k, v, b.block_tables, b.context_lens, b.head_dim**-0.5
    )


@settings(max_examples=60, deadline=None)
@given(b=decode_batches((torch.float32, torch.bfloat16)))
def test_kernel_equals_dense_sdpa_and_the_reference(b: Batch) -> None:
    q, cache, expected = setup(b)
    k, v = cache.k_caches[0], cache.v_caches[0]
    out = fast(b, q, k, v)
    assert out.shape == q.shape
    assert out.dtype == q.dtype
    atol, rtol = TOLERANCE[b.dtype]
    torch.testing.assert_close(out, expected, atol=atol, rtol=rtol)
    ref = paged_attention_reference(q, k, v, b.block_tables, b.context_lens, b.query_lens)
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)


@settings(max_examples=10, deadline=None)
@given(b=decode_batches((torch.float32, torch.bfloat16)))
def test_kernel_result_does_not_depend_on_the_thread_count(b: Batch) -> None:
    # each (sequence, query head) row is computed by one thread in a fixed order: bitwise equal
    q, cache, _ = setup(b)
    k, v = cache.k_caches[0], cache.v_caches[0]
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append(fast(b, q, k, v))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_kernel_takes_a_non_contiguous_query() -> None:
    b = Batch(
        16, 2, 2, 64, torch.float32, [33, 5, 70], [1, 1, 1], [[3, 0, 4], [1], [2, 5, 6, 7, 8]], 9, 1
    )
    q, cache, expected = setup(b)
    q_strided = q.transpose(0, 1).contiguous().transpose(0, 1)  # same values, other strides
    assert not q_strided.is_contiguous()
    out = fast(b, q_strided, cache.k_caches[0], cache.v_caches[0])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the calls ``paged_attention`` makes to the kernel."""
    calls: list[int] = []
    real = fast_attention.decode_attention

    def counting(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(fast_attention, "decode_attention", counting)
    return calls


def _run(b: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    q, cache, expected = setup(b)
    k, v = cache.k_caches[0], cache.v_caches[0]
    return paged_attention(q, k, v, b.block_tables, b.context_lens, b.query_lens), expected


DECODE_BATCH = Batch(4, 2, 2, 16, torch.float32, [9, 3], [1, 1], [[2, 0, 1], [3]], 5, 7)


def test_paged_attention_dispatches_decode_batches_to_the_kernel(spy: list[int]) -> None:
    out, expected = _run(DECODE_BATCH)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert len(spy) == 1


@pytest.mark.parametrize(
    "b",
    [
        Batch(4, 2, 2, 16, torch.float32, [9, 3], [2, 1], [[2, 0, 1], [3]], 5, 7),  # a prefill
        Batch(4, 2, 2, 16, torch.float64, [9, 3], [1, 1], [[2, 0, 1], [3]], 5, 7),  # float64
    ],
    ids=["mixed-prefill", "float64"],
)
def test_other_batches_take_the_torch_path(spy: list[int], b: Batch) -> None:
    out, expected = _run(b)
    atol, rtol = TOLERANCE[b.dtype]
    torch.testing.assert_close(out, expected, atol=atol, rtol=rtol)
    assert spy == []


def test_the_environment_switch_turns_the_kernel_off(
    spy: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PAGEDKV_FAST_ATTENTION", "0")
    out, expected = _run(DECODE_BATCH)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert spy == []


def test_a_failed_build_warns_once_and_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_compiler(name: str) -> None:
        raise _build.BuildError("no C++ compiler found")

    monkeypatch.setattr(_build, "build", no_compiler)
    fast_attention.kernel.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="using the torch path: no C\\+\\+ compiler"):
            out, expected = _run(DECODE_BATCH)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        with warnings.catch_warnings(record=True) as later:  # cached: no second warning
            warnings.simplefilter("always")
            _run(DECODE_BATCH)
        assert not [w for w in later if issubclass(w.category, RuntimeWarning)]
    finally:
        fast_attention.kernel.cache_clear()  # the next caller loads the real library again


def test_a_broken_compiler_raises_a_build_error(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PAGEDKV_BUILD_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # exists on every POSIX system, and always fails
    with pytest.raises(_build.BuildError, match=r"false failed on paged_decode\.cpp"):
        _build.build("paged_decode")


def test_the_kernel_allocates_nothing_kv_sized() -> None:
    # 4 sequences x 512 tokens of K/V (4 MiB): the torch-side allocations of a call must be the
    # output (q's size), the int32 block table and a few vectors of one entry per sequence. (The
    # kernel's own scratch is per thread and sized by heads x head_dim: csrc/paged_decode.cpp.)
    batch, ctx, kv_heads, head_dim, block_size = 4, 512, 4, 64, 16
    per_seq = ctx // block_size
    k = torch.randn(batch * per_seq, block_size, kv_heads, head_dim)
    v = torch.randn_like(k)
    q = torch.randn(batch, kv_heads, head_dim)
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(batch)]
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        paged_attention(q, k, v, tables, [ctx] * batch, [1] * batch)
    allocated = sum(max(0, e.self_cpu_memory_usage) for e in prof.events())
    per_sequence_vectors = 8 * 8 * batch  # lengths and table checks: at most 8 B x 8 vectors
    assert q.nbytes + 4 * batch * per_seq <= allocated
    assert allocated <= q.nbytes + 4 * batch * per_seq + per_sequence_vectors + 512
    assert allocated < k.nbytes // 100


def test_the_kernel_refuses_what_would_read_outside_the_cache() -> None:
    k = torch.zeros(4, 8, 2, 16)
    q = torch.zeros(1, 4, 16)
    run = fast_attention.decode_attention
    with pytest.raises(ValueError, match=r"^tables: block ids"):
        run(q, k, k, [[4]], [5], 0.25)
    with pytest.raises(ValueError, match=r"^context_lens: each"):
        run(q, k, k, [[1]], [9], 0.25)
    with pytest.raises(ValueError, match=r"^cache_k/cache_v: the kernel reads contiguous"):
        run(q, k, k.transpose(0, 1), [[1]], [5], 0.25)
    with pytest.raises(ValueError, match=r"^q/cache: dtypes"):
        run(q.double(), k.double(), k.double(), [[1]], [5], 0.25)


@pytest.mark.parametrize(
    ("batch", "kv_heads", "threads"), [(1, 32, 2), (32, 32, 2), (3, 8, 4), (2, 3, 16)]
)
def test_heads_per_task_covers_every_kv_head(batch: int, kv_heads: int, threads: int) -> None:
    per_task = fast_attention.heads_per_task(batch, kv_heads, threads)
    assert 1 <= per_task <= kv_heads
    tasks = batch * -(-kv_heads // per_task)
    assert tasks >= min(batch * kv_heads, threads)  # a task for every thread
    if batch >= threads:
        assert per_task == kv_heads  # whole blocks, streamed contiguously

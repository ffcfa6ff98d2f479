"""The compiled kernel (``fast_attention``): equal to dense SDPA, to the torch gather path and to
the reference on decode, prefill, chunked and mixed batches, with or without a sliding window;
chosen by ``paged_attention`` exactly when it applies; replaced by the torch path when it cannot
be built; equal again when built without AVX-512; and free of K/V-sized allocations."""

from __future__ import annotations

import platform
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest

pytest.importorskip("torch")

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.profiler import ProfilerActivity, profile

from pagedkv.tensors import _build, fast_attention
from pagedkv.tensors.attention import (
    paged_attention,
    paged_attention_gather,
    paged_attention_reference,
)
from tests.tensors.test_attention import TOLERANCE, Batch, batches, setup

if fast_attention.kernel() is None:  # built here on first use: a few seconds, once per machine
    pytest.skip("the fast path could not be built here (see the warning)", allow_module_level=True)


def kernel_batches(
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16),
) -> st.SearchStrategy[Batch]:
    """Batches shaped to reach every branch of the kernel: decodes, prefills and chunks mixed;
    head_dim 12 (no whole vector), 40 (a scalar tail after whole vectors), 64 and 128; blocks
    of 1, 5, 16 (its chunk) and 40 tokens; contexts of several chunks; MHA and GQA groups up to
    4 (the rows sharing one load of V)."""
    return batches(
        dtypes=dtypes,
        kinds=("decode", "prefill", "chunked"),
        block_sizes=(1, 5, 16, 40),
        head_dims=(12, 40, 64, 128),
        max_group=4,
        max_context=120,
    )


def fast(b: Batch, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return fast_attention.attention(
        q, k, v, b.block_tables, b.context_lens, b.query_lens, b.head_dim**-0.5
    )


def check(b: Batch, out: torch.Tensor, q: torch.Tensor, expected: torch.Tensor) -> None:
    assert out.shape == q.shape
    assert out.dtype == q.dtype
    atol, rtol = TOLERANCE[b.dtype]
    torch.testing.assert_close(out, expected, atol=atol, rtol=rtol)


@settings(max_examples=80, deadline=None)
@given(b=kernel_batches())
def test_kernel_equals_dense_sdpa_the_gather_path_and_the_reference(b: Batch) -> None:
    q, cache, expected = setup(b)
    k, v = cache.k_caches[0], cache.v_caches[0]
    out = fast(b, q, k, v)
    check(b, out, q, expected)
    args = (q, k, v, b.block_tables, b.context_lens, b.query_lens)
    check(b, out, q, paged_attention_reference(*args))
    check(b, out, q, paged_attention_gather(*args))


@settings(max_examples=10, deadline=None)
@given(b=kernel_batches())
def test_kernel_result_does_not_depend_on_the_thread_count(b: Batch) -> None:
    # each query row is computed by one task in a fixed order: bitwise equal
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
        16, 2, 2, 64, torch.float32, [33, 5, 70], [1, 5, 3], [[3, 0, 4], [1], [2, 5, 6, 7, 8]], 9, 1
    )
    q, cache, expected = setup(b)
    q_strided = q.transpose(0, 1).contiguous().transpose(0, 1)  # same values, other strides
    assert not q_strided.is_contiguous()
    out = fast(b, q_strided, cache.k_caches[0], cache.v_caches[0])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_sequence_without_new_tokens_is_skipped(dtype: torch.dtype) -> None:
    # query_len 0 (a sequence in the batch with nothing to compute this step) has no output
    # rows; its neighbours' rows are where they belong
    k = (torch.arange(6 * 4 * 2 * 16, dtype=torch.float32).reshape(6, 4, 2, 16) % 7 / 7).to(dtype)
    v = k.flip(-1).contiguous()
    q = torch.rand(3, 4, 16, generator=torch.Generator().manual_seed(3)).to(dtype)
    tables, ctx, qlens = [[0, 1], [2], [3, 4, 5]], [6, 3, 10], [2, 0, 1]
    out = fast_attention.attention(q, k, v, tables, ctx, qlens, 0.25)
    ref = paged_attention_reference(q, k, v, tables, ctx, qlens, 0.25)
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)


def test_a_prepared_call_reruns_the_kernel_on_the_current_contents() -> None:
    b = MIXED_BATCH
    q, cache, expected = setup(b)
    k, v = cache.k_caches[0], cache.v_caches[0]
    run = fast_attention.prepare(
        q, k, v, b.block_tables, b.context_lens, b.query_lens, b.head_dim**-0.5
    )
    out = run()
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    first = out.clone()
    q.mul_(2)  # new contents, same tensors: the next call sees them
    again = run()
    assert again is out
    torch.testing.assert_close(again, fast(b, q, k, v), atol=0, rtol=0)
    assert not torch.equal(again, first)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the calls ``paged_attention`` makes to the kernel."""
    calls: list[int] = []
    real = fast_attention.attention

    def counting(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(fast_attention, "attention", counting)
    return calls


def _run(b: Batch, window: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    q, cache, expected = setup(b)
    k, v = cache.k_caches[0], cache.v_caches[0]
    out = paged_attention(
        q, k, v, b.block_tables, b.context_lens, b.query_lens, sliding_window=window
    )
    return out, expected


DECODE_BATCH = Batch(4, 2, 2, 16, torch.float32, [9, 3], [1, 1], [[2, 0, 1], [3]], 5, 7)
MIXED_BATCH = Batch(4, 2, 2, 16, torch.float32, [9, 3], [4, 1], [[2, 0, 1], [3]], 5, 7)


@pytest.mark.parametrize("b", [DECODE_BATCH, MIXED_BATCH], ids=["decode", "mixed-prefill"])
def test_paged_attention_dispatches_cpu_batches_to_the_kernel(spy: list[int], b: Batch) -> None:
    out, expected = _run(b)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert len(spy) == 1


def test_float64_takes_the_torch_path(spy: list[int]) -> None:
    b = Batch(4, 2, 2, 16, torch.float64, [9, 3], [1, 1], [[2, 0, 1], [3]], 5, 7)
    out, expected = _run(b)
    atol, rtol = TOLERANCE[b.dtype]
    torch.testing.assert_close(out, expected, atol=atol, rtol=rtol)
    assert spy == []


def test_a_windowed_batch_runs_in_the_kernel(spy: list[int]) -> None:
    out, _ = _run(MIXED_BATCH, window=4)  # the result under a window: the tests below
    assert spy == [1]
    plain, expected = _run(MIXED_BATCH, window=9)  # no context longer than the window
    torch.testing.assert_close(plain, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out, plain)


@settings(max_examples=40, deadline=None)
@given(b=kernel_batches(), window=st.integers(1, 130))
def test_a_sliding_window_equals_the_reference_and_the_gather_path(b: Batch, window: int) -> None:
    q, cache, _ = setup(b)
    args = (q, cache.k_caches[0], cache.v_caches[0], b.block_tables, b.context_lens, b.query_lens)
    out = fast_attention.attention(*args, b.head_dim**-0.5, sliding_window=window)
    check(b, out, q, paged_attention_reference(*args, sliding_window=window))
    check(b, out, q, paged_attention_gather(*args, sliding_window=window))


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
            out, expected = _run(MIXED_BATCH)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        assert fast_attention.vector_lanes() == 0
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


def test_the_kernel_uses_the_widest_vectors_of_this_cpu() -> None:
    flags = _build._cpu_flags().split()
    x86 = platform.machine() in ("x86_64", "AMD64")
    assert fast_attention.vector_lanes() == (16 if x86 and "avx512f" in flags else 8)


@pytest.mark.skipif(
    platform.machine() != "x86_64" or shutil.which("g++") is None, reason="needs x86-64 and g++"
)
@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64"])  # AVX2 + FMA; plain SSE2
def test_a_build_without_avx512_gives_the_same_results(
    march: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if march == "x86-64-v3" and "avx2" not in _build._cpu_flags().split():
        pytest.skip("this CPU has no AVX2")
    flags = [f"-march={march}" if f == "-march=native" else f for f in _build.FLAGS]
    lib_path = tmp_path / f"paged_decode-{march}.so"
    source = _build.CSRC / "paged_decode.cpp"
    subprocess.run(["g++", *flags, str(source), "-o", str(lib_path)], check=True, timeout=300)
    lib = fast_attention.load(str(lib_path))
    assert lib.pagedkv_vector_lanes() == 8
    monkeypatch.setattr(fast_attention, "kernel", lambda: lib)
    for seed, dtype in enumerate((torch.float32, torch.bfloat16)):
        b = Batch(
            5, 2, 3, 40, dtype, [33, 5, 70, 17], [1, 5, 3, 17],
            [[3, 0, 4, 9, 10, 11, 12], [1], [2, 5, 6, 7, 8, 13, 14, 15, 16, 17, 18, 19, 20, 21],
             [22, 23, 24, 25]], 26, seed,
        )  # fmt: skip
        q, cache, expected = setup(b)
        check(b, fast(b, q, cache.k_caches[0], cache.v_caches[0]), q, expected)


@pytest.mark.parametrize("qlen", [1, 64], ids=["decode", "mixed-prefill"])
def test_the_kernel_allocates_nothing_kv_sized(qlen: int) -> None:
    # 4 sequences x 512 tokens of K/V (4 MiB): the only torch-side allocation of a call is the
    # output (q's size); the tables and lengths go to the kernel as int32 arrays (one entry per
    # block and per sequence), and its own scratch is per thread, sized by heads x head_dim.
    batch, ctx, kv_heads, head_dim, block_size = 4, 512, 4, 64, 16
    per_seq = ctx // block_size
    k = torch.randn(batch * per_seq, block_size, kv_heads, head_dim)
    v = torch.randn_like(k)
    qlens = [qlen] + [1] * (batch - 1)
    q = torch.randn(sum(qlens), kv_heads, head_dim)
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(batch)]
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        paged_attention(q, k, v, tables, [ctx] * batch, qlens)
    allocated = sum(max(0, e.self_cpu_memory_usage) for e in prof.events())
    assert q.nbytes <= allocated <= q.nbytes + 512
    assert allocated < k.nbytes // 20  # K alone is 2 MiB, the copy of the torch path 4 MiB


def test_the_kernel_refuses_what_would_read_outside_the_cache() -> None:
    k = torch.zeros(4, 8, 2, 16)
    q = torch.zeros(1, 4, 16)
    run = fast_attention.attention
    with pytest.raises(ValueError, match=r"^tables: block ids"):
        run(q, k, k, [[4]], [5], [1], 0.25)
    with pytest.raises(ValueError, match=r"^tables: block ids"):
        run(q, k, k, [[-1]], [5], [1], 0.25)
    with pytest.raises(ValueError, match=r"^context_lens: each"):
        run(q, k, k, [[1]], [9], [1], 0.25)
    with pytest.raises(ValueError, match=r"^query_lens/sliding_window: need"):
        run(torch.zeros(6, 4, 16), k, k, [[1]], [5], [6], 0.25)
    with pytest.raises(ValueError, match=r"^query_lens/sliding_window: need"):
        run(q, k, k, [[1]], [5], [1], 0.25, sliding_window=0)
    with pytest.raises(ValueError, match=r"^q: has 1 tokens but sum\(query_lens\) = 2"):
        run(q, k, k, [[1]], [5], [2], 0.25)
    with pytest.raises(ValueError, match=r"^cache_k/cache_v: the kernel reads contiguous"):
        run(q, k, k.transpose(0, 1), [[1]], [5], [1], 0.25)
    with pytest.raises(ValueError, match=r"^q/cache: dtypes"):
        run(q.double(), k.double(), k.double(), [[1]], [5], [1], 0.25)


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

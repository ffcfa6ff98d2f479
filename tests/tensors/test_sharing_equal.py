"""Differential: sharing changes where K/V lives, never what a model generates.

The real engine (``Engine`` + vllm ``Scheduler`` + ``TorchExecutor``, float64, the tiny GPT-2
and Llama-GQA models of ``hf_reference``) runs prompts that share prefixes (whole blocks, and a
shared part that ends mid-block), exact duplicates, and requests of n = 2, 3 parallel samples,
with prefix caching on. Every greedy output must equal, token for token, the same prompts run
with no sharing at all (caching off, one request per sample). Each run also asserts that the
sharing really happened: prefix-hit tokens > 0, copy-on-write copies > 0, and in the small
pools preemptions, evictions and a preempted request hitting its own cached blocks again.

The engine runs on a unit clock (every step lasts 1), so the schedule does not depend on how
fast this machine is.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch

from pagedkv.engine.config import SchedulerConfig
from pagedkv.engine.engine import Engine, EngineRun
from pagedkv.engine.policies import SCHEDULERS
from pagedkv.memory.config import CacheConfig
from pagedkv.memory.manager import KVCacheManager
from pagedkv.tensors.executor import TorchExecutor
from pagedkv.tensors.kv_cache import PagedKVCache
from pagedkv.workloads.spec import RequestSpec
from tests.tensors.hf_reference import MAX_POSITION, VOCAB, decoder

NUM_NEW = 6
ARCHS = ("gpt2", "llama")


def _tokens(n: int, seed: int) -> tuple[int, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(int(t) for t in torch.randint(0, VOCAB, (n,), generator=g))


P1 = _tokens(34, 101)  # two full blocks of 16 and 2 tokens: shared whole blocks at bs 16
P2 = _tokens(21, 102)  # ends mid-block for every block size tested but 1


def _sharing_workload() -> list[RequestSpec]:
    """(prompt, n, arrival step): prefixes P1 and P2 with short own suffixes, duplicates, a
    request that shares only P1's first 20 tokens (the shared part ends mid-block), and a
    private prompt; later arrivals find the earlier ones' blocks cached."""
    rows: list[tuple[tuple[int, ...], int, float]] = [
        (P1 + _tokens(3, 1), 1, 0.0),
        (P1 + _tokens(5, 2), 2, 0.0),
        (P2 + _tokens(2, 3), 1, 1.0),
        (_tokens(9, 4), 3, 2.0),
        (P1 + _tokens(3, 1), 1, 3.0),  # a duplicate of request 0
        (P2 + _tokens(7, 5), 2, 3.0),
        (P1[:20] + _tokens(4, 6), 1, 4.0),
        (P2 + _tokens(2, 3), 3, 6.0),  # a duplicate of request 2, three samples
    ]
    return [
        RequestSpec(i, len(p), NUM_NEW, t, token_ids=p, n=n) for i, (p, n, t) in enumerate(rows)
    ]


@dataclass
class Run:
    run: EngineRun
    kv: KVCacheManager
    rehits: int  # prefix-hit tokens of requests admitted again after a preemption


def run_real(
    arch: str,
    specs: list[RequestSpec],
    *,
    block_size: int,
    num_blocks: int,
    caching: bool,
    options: dict[str, Any] | None = None,
    num_cpu_blocks: int = 64,
) -> Run:
    """The real engine with prefix caching on or off (``build_real_engine`` with a
    ``CacheConfig`` of our own) on a unit clock; the books are checked after every step."""
    model = decoder(arch)
    sched = SchedulerConfig(**{"max_model_len": MAX_POSITION, **(options or {})})
    cache_cfg = CacheConfig(
        num_gpu_blocks=num_blocks,
        block_size=block_size,
        num_cpu_blocks=num_cpu_blocks,
        watermark=0.0,
        enable_prefix_caching=caching,
    )
    policy = SCHEDULERS[sched.scheduler]
    kv = policy.make_allocator(cache_cfg, sched)
    assert isinstance(kv, KVCacheManager)
    c = model.config
    cache = PagedKVCache(
        c.num_layers,
        num_blocks,
        block_size,
        c.num_kv_heads,
        c.head_dim,
        dtype=model.dtype,
        num_cpu_blocks=num_cpu_blocks,
    )
    ticks = itertools.count()
    executor = TorchExecutor(model, cache, kv, clock=lambda: float(next(ticks)))  # each step: 1
    rehits = 0
    allocate = kv.allocate
    by_seq = {s.request_id: s for s in specs}
    engine = Engine(policy(sched, kv), executor, specs, check_integrity=True)
    requests = {r.request_id: r for r in engine.requests}

    def counting(seq_id: object, num_tokens: int, **kwargs: Any) -> int | None:
        nonlocal rehits
        got = allocate(seq_id, num_tokens, **kwargs)
        if got and isinstance(seq_id, int) and seq_id in by_seq:
            rehits += got if requests[seq_id].num_preemptions else 0
        return got

    kv.allocate = counting  # type: ignore[method-assign]
    run = engine.run()
    assert not run.deadlocked
    assert all(r.num_output_tokens == r.output_len for r in run.requests)
    return Run(run, kv, rehits)


@functools.cache
def unshared(
    arch: str, prompts: tuple[tuple[int, ...], ...], num_new: int
) -> dict[tuple[int, ...], tuple[int, ...]]:
    """Greedy outputs with no sharing: caching off, one request (n = 1) per distinct prompt."""
    specs = [RequestSpec(i, len(p), num_new, token_ids=p) for i, p in enumerate(prompts)]
    done = run_real(arch, specs, block_size=16, num_blocks=64, caching=False)
    assert done.kv.stats.prefix_hit_tokens == 0
    assert done.kv.stats.cow_copies == 0
    return {p: tuple(r.output_token_ids) for p, r in zip(prompts, done.run.requests, strict=True)}


def assert_equal_to_unshared(arch: str, done: Run) -> None:
    """Every sample of every request equals its prompt's unshared greedy output (greedy
    outputs of different lengths: the shorter is the start of the longer)."""
    reqs = done.run.requests
    prompts = tuple(dict.fromkeys(tuple(r.token_ids) for r in reqs if r.token_ids is not None))
    expected = unshared(arch, prompts, max(r.output_len for r in reqs))
    for req in reqs:
        assert req.token_ids is not None
        assert len(req.seq_ids) == req.n
        for seq_id in req.seq_ids:
            got = tuple(req.outputs_of(seq_id))
            assert got == expected[tuple(req.token_ids)][: req.output_len], (req.request_id, seq_id)


# name -> (block_size, num_gpu_blocks, scheduler options, small pool: preempts and evicts)
SCENARIOS: dict[str, tuple[int, int, dict[str, Any], bool]] = {
    "bs16": (16, 64, {}, False),
    "bs1": (1, 600, {}, False),
    "bs3-divides-no-prefix": (3, 160, {}, False),
    "small-pool-recompute": (4, 20, {"preemption_mode": "recompute"}, True),
    "small-pool-swap": (4, 20, {"preemption_mode": "swap"}, True),
    "small-pool-chunked-swap": (
        3,
        20,
        {
            "preemption_mode": "swap",
            "enable_chunked_prefill": True,
            "max_num_batched_tokens": 8,
            "max_num_seqs": 4,
        },
        True,
    ),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("arch", ARCHS)
def test_shared_outputs_equal_unshared(arch: str, scenario: str) -> None:
    block_size, num_blocks, options, small = SCENARIOS[scenario]
    done = run_real(
        arch,
        _sharing_workload(),
        block_size=block_size,
        num_blocks=num_blocks,
        caching=True,
        options=options,
    )
    stats = done.kv.stats
    assert stats.prefix_hit_tokens > 0  # prefix hits happened
    if block_size > 1:  # blocks of 1 are never partial: nothing to copy on write
        assert stats.cow_copies > 0  # forks wrote into a shared partial block: copied first
    if small:
        assert done.run.totals.preemptions > 0
        assert stats.evictions > 0  # cached blocks were evicted
        if options.get("preemption_mode") == "recompute":
            assert done.rehits > 0  # a preempted request hit its own cached blocks again
    assert_equal_to_unshared(arch, done)


@pytest.mark.parametrize("arch", ARCHS)
def test_group_preempted_after_its_copy_on_write_was_scheduled(arch: str) -> None:
    """Chunked prefill schedules decodes first: a group of 3 samples forked and copied its
    shared last block, then an older request's prefill chunk needed room. The scheduler
    once picked the group (the newest) as the victim: its swap-out read the copy's
    destination before the copy was made, and a sample's K/V was lost (the Llama outputs
    differed). Victims are now requests not yet scheduled in the step."""
    rows = [(5, 8, 0.56, 3), (40, 7, 2.0, 1), (5, 4, 2.8, 3)]
    specs = [
        RequestSpec(i, p, o, t, token_ids=_tokens(p, 200 + i), n=n)
        for i, (p, o, t, n) in enumerate(rows)
    ]
    options = {
        "preemption_mode": "recompute",  # groups swap whatever the mode
        "enable_chunked_prefill": True,
        "max_num_batched_tokens": 8,
        "max_num_seqs": 4,
    }
    done = run_real(arch, specs, block_size=3, num_blocks=17, caching=True, options=options)
    assert done.run.totals.preemptions > 0
    assert done.kv.stats.cow_copies > 0
    assert_equal_to_unshared(arch, done)

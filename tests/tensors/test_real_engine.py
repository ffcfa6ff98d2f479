"""Differential: pagedkv's Engine + Scheduler + TorchExecutor on a tiny GPT-2 / Llama (GQA)
against Hugging Face ``generate`` (greedy, dynamic cache), token for token, for eight prompts
of different lengths, over block sizes, forced preemption (recompute and swap), chunked prefill
and a contiguous baseline. Integrity is checked after every iteration, and every cache write is
checked against the block reference counts (``CheckedCache``)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch

from pagedkv.engine.config import PreemptionMode, SchedulerConfig
from pagedkv.engine.engine import EngineRun
from pagedkv.memory.manager import KVCacheManager
from pagedkv.tensors.executor import TorchExecutor, build_real_engine
from tests.tensors.checked_cache import CheckedCache, run_checked
from tests.tensors.hf_reference import (
    MAX_POSITION,
    NUM_NEW_TOKENS,
    decoder,
    hf_greedy,
    prompts,
    specs,
)

ARCHS = ("gpt2", "llama")

# name -> (block_size, num_gpu_blocks, scheduler options); the prompts need 96 + 8 x 5 = 136
# token slots in all, the longest 28
SCENARIOS: dict[str, tuple[int, int, dict[str, Any]]] = {
    "bs16": (16, 64, {}),
    "bs1": (1, 512, {}),
    "bs9-divides-no-prompt": (9, 64, {}),
    "recompute-preemption": (4, 12, {"preemption_mode": "recompute"}),
    "swap-preemption": (4, 12, {"preemption_mode": "swap"}),
    "chunked-prefill": (
        4,
        64,
        {"enable_chunked_prefill": True, "max_num_batched_tokens": 8, "max_num_seqs": 8},
    ),
    "chunked-prefill-swap": (
        3,
        14,
        {
            "enable_chunked_prefill": True,
            "max_num_batched_tokens": 8,
            "max_num_seqs": 8,
            "preemption_mode": "swap",
        },
    ),
    "contiguous-orca-oracle": (1, 64, {"scheduler": "orca-oracle", "max_model_len": 32}),
}


def run_engine(arch: str, block_size: int, num_blocks: int, options: dict[str, Any]) -> EngineRun:
    sched = SchedulerConfig(**{"max_model_len": MAX_POSITION, **options})
    engine = build_real_engine(
        decoder(arch),
        specs(prompts()),
        num_gpu_blocks=num_blocks,
        block_size=block_size,
        num_cpu_blocks=64,
        scheduler=sched,
        check_integrity=True,
        cache_factory=CheckedCache,
    )
    executor = engine.executor
    assert isinstance(executor, TorchExecutor)
    assert isinstance(executor.cache, CheckedCache)
    if isinstance(engine.scheduler.kv, KVCacheManager):
        executor.cache.kv = engine.scheduler.kv
    run = engine.run()
    assert not run.deadlocked
    if executor.cache.kv is not None:
        assert executor.cache.blocks_written > 0  # the write guard did look
    return run


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_equals_hf_generate(arch: str, scenario: str) -> None:
    block_size, num_blocks, options = SCENARIOS[scenario]
    run = run_engine(arch, block_size, num_blocks, options)
    ps = prompts()
    for req in run.requests:
        expected = hf_greedy(arch, ps[req.request_id], NUM_NEW_TOKENS)
        assert tuple(req.output_token_ids) == expected, f"request {req.request_id}"
    t = run.totals
    if "preemption" in scenario or scenario == "chunked-prefill-swap":
        assert t.preemptions > 0  # the pool really was too small for the batch
    if "swap" in scenario:
        assert t.swap_outs > 0
        assert t.swapped_blocks > 0
    if scenario == "recompute-preemption":
        assert t.swap_outs == 0
        assert sum(r.num_recomputed_tokens for r in run.requests) > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_weights_from_a_state_dict_and_config_json(arch: str) -> None:
    """``from_hf(state_dict, config=...)`` with the config as a dict (a config.json's contents)
    builds the same decoder as ``from_hf(model)``."""
    from pagedkv.tensors.model import Decoder
    from tests.tensors.hf_reference import hf_model

    model = hf_model(arch)
    loaded = Decoder.from_hf(model.state_dict(), config=model.config.to_dict())
    reference = decoder(arch)
    assert loaded.config == reference.config
    for name, t in reference.weights.items():
        assert torch.equal(loaded.weights[name], t), name
    for mine, theirs in zip(loaded.layers, reference.layers, strict=True):
        assert mine.keys() == theirs.keys()
        assert all(torch.equal(mine[k], theirs[k]) for k in mine)


@pytest.mark.parametrize(
    ("block_size", "num_blocks", "mode"), [(16, 64, "recompute"), (5, 64, "swap"), (4, 20, "swap")]
)
@pytest.mark.parametrize("arch", ARCHS)
def test_parallel_samples_fork_through_the_engine(
    arch: str, block_size: int, num_blocks: int, mode: str
) -> None:
    """Requests of n = 3 greedy samples: each forks after its prefill (the prompt's blocks
    shared, the partial last block copied on write) and every sample equals HF's greedy
    output; with 20 blocks of 4 the groups are also swapped out and back whole."""
    from dataclasses import replace

    workload = [replace(s, n=3) for s in specs(prompts())]
    engine = build_real_engine(
        decoder(arch),
        workload,
        num_gpu_blocks=num_blocks,
        block_size=block_size,
        num_cpu_blocks=64,
        scheduler=SchedulerConfig(max_model_len=MAX_POSITION, preemption_mode=PreemptionMode(mode)),
        check_integrity=True,
        cache_factory=CheckedCache,
    )
    run, copies = run_checked(engine)  # no write into a block others still share
    ps = prompts()
    for req in run.requests:
        expected = hf_greedy(arch, ps[req.request_id], NUM_NEW_TOKENS)
        assert len(req.seq_ids) == 3
        for seq_id in req.seq_ids:
            assert tuple(req.outputs_of(seq_id)) == expected, (req.request_id, seq_id)
    assert copies > 0  # copy-on-write did happen (a prompt length not a multiple of bs)
    if num_blocks == 20:
        assert run.totals.swap_outs > 0


@pytest.mark.parametrize(
    ("num_new", "num_blocks"),
    [(1, 64), (2, 12)],
    ids=["one-output-token", "recompute-before-fork"],
)
@pytest.mark.parametrize("arch", ARCHS)
def test_parallel_samples_lose_no_sample(arch: str, num_new: int, num_blocks: int) -> None:
    """n = 2 greedy samples finish as two sequences equal to HF's output: with one output
    token (the prefill's, every sample's: no fork comes before the finish), and in 12 blocks
    of 4 where recompute preempts groups between their first token and their fork (issue 17,
    defect 8; the simulated engine's tests make the same cases)."""
    from dataclasses import replace

    workload = [replace(s, n=2) for s in specs(prompts(), num_new)]
    engine = build_real_engine(
        decoder(arch),
        workload,
        num_gpu_blocks=num_blocks,
        block_size=4,
        num_cpu_blocks=64,
        scheduler=SchedulerConfig(
            max_model_len=MAX_POSITION, preemption_mode=PreemptionMode.RECOMPUTE
        ),
        check_integrity=True,
        cache_factory=CheckedCache,
    )
    run, _ = run_checked(engine)
    ps = prompts()
    for req in run.requests:
        expected = hf_greedy(arch, ps[req.request_id], num_new)
        assert len(req.seq_ids) == 2
        for seq_id in req.seq_ids:
            assert tuple(req.outputs_of(seq_id)) == expected, (req.request_id, seq_id)
    if num_new == 2:
        assert run.totals.preemptions > 0

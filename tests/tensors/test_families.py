"""Differential: every supported family, loaded from a real checkpoint directory
(``save_pretrained`` of a random-init transformers model, ``checkpoints.py``), equals
transformers' ``generate`` token for token (greedy, float64) through the engine under swap and
recompute preemption (a pool too small for the batch), chunked prefill, and prefix caching with
shared prefixes in a small pool; and in beam search. Each family's distinguishing feature is
shown to matter: the same weights with the feature switched off give other logits, so equality
is not vacuous."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch

from pagedkv.engine.config import PreemptionMode, SchedulerConfig
from pagedkv.engine.engine import EngineRun
from pagedkv.tensors.checkpoint import load_checkpoint
from pagedkv.tensors.executor import build_real_engine
from pagedkv.tensors.model import Decoder, ModelInput
from tests.tensors.checked_cache import CheckedCache
from tests.tensors.checkpoints import FAMILIES, MAX_POSITION, hf_from_dir, hf_generate
from tests.tensors.hf_reference import prompts, specs

NUM_NEW = 6


def shared_prefix_prompts() -> list[tuple[int, ...]]:
    """Prompts that share whole blocks of 4 (a 12-token stem, suffixes, a duplicate) next to
    unrelated ones: prefix caching hits, and the small pool evicts and preempts."""
    stem, *others = prompts((12, 3, 5, 2, 7, 19), seed=3)
    return [stem + others[0], stem + others[1], stem, stem + others[0], others[2], others[3]]


# name -> (block_size, num_gpu_blocks, scheduler options, prefix caching, prompts)
SCENARIOS: dict[str, tuple[int, int, dict[str, Any], bool, Callable[[], list[tuple[int, ...]]]]] = {
    "swap": (4, 12, {"preemption_mode": "swap"}, False, prompts),
    "recompute": (4, 12, {"preemption_mode": "recompute"}, False, prompts),
    "chunked": (
        3,
        16,
        {"enable_chunked_prefill": True, "max_num_batched_tokens": 8, "max_num_seqs": 8},
        False,
        prompts,
    ),
    "prefix-caching": (4, 14, {"preemption_mode": "recompute"}, True, shared_prefix_prompts),
}


def run(decoder: Decoder, scenario: str) -> tuple[EngineRun, list[tuple[int, ...]], int]:
    """The run, its prompts, and its prefix-cache hit tokens."""
    block_size, num_blocks, options, caching, make = SCENARIOS[scenario]
    ps = make()
    engine = build_real_engine(
        decoder,
        specs(ps, NUM_NEW),
        num_gpu_blocks=num_blocks,
        block_size=block_size,
        num_cpu_blocks=64,
        scheduler=SchedulerConfig(max_model_len=MAX_POSITION, **options),
        check_integrity=True,
        cache_factory=CheckedCache,
        enable_prefix_caching=caching,
    )
    out = engine.run()
    assert not out.deadlocked
    hits = engine.scheduler.kv.stats.prefix_hit_tokens  # type: ignore[attr-defined]
    return out, ps, int(hits)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_equals_hf_generate(
    family: str, scenario: str, checkpoint_dir: Callable[..., Path]
) -> None:
    path = checkpoint_dir(family)
    out, ps, hits = run(load_checkpoint(path).decoder, scenario)
    for req in out.requests:
        expected = hf_generate(path, ps[req.request_id], NUM_NEW)
        assert tuple(req.output_token_ids) == expected, f"request {req.request_id}"
    if scenario in ("swap", "recompute"):
        assert out.totals.preemptions > 0  # the pool really was too small
    if scenario == "prefix-caching":
        assert out.totals.preemptions > 0
        assert hits > 0  # the stem's blocks were found again


# family -> the config change that switches its feature off
FEATURES: dict[str, dict[str, Any]] = {
    "llama-rope-linear": {"rope_type": "default", "rope_scaling": ()},
    "llama-rope-yarn": {"rope_type": "default", "rope_scaling": ()},
    "llama-rope-llama3": {"rope_type": "default", "rope_scaling": ()},
    "llama-rope-longrope": {"rope_type": "default", "rope_scaling": ()},
    "llama-rope-proportional": {"rope_type": "default", "rope_scaling": ()},
    "mistral": {"sliding_window": None},
    "qwen2-sliding": {"sliding_window": None},
    "gpt2-unscaled": {"scale_attn_weights": True},
    "gpt2-inverse-layer": {"scale_attn_by_inverse_layer_idx": False},
    "gemma": {"embed_scale": False},
}


def _logits(decoder: Decoder, ids: tuple[int, ...]) -> torch.Tensor:
    n = len(ids)
    cache = decoder.make_cache(-(-n // 4), 4)
    inp = ModelInput(
        token_ids=torch.tensor(ids),
        positions=torch.arange(n),
        slot_mapping=torch.arange(n),
        block_tables=[list(range(-(-n // 4)))],
        context_lens=[n],
        query_lens=[n],
        logits_indices=torch.arange(n),
    )
    return decoder(inp, cache)


@pytest.mark.parametrize("family", list(FEATURES))
def test_the_feature_matters(family: str, checkpoint_dir: Callable[..., Path]) -> None:
    """Our logits equal transformers' forward pass on a long prompt (to 1e-6: RoPE's angles
    are float32 in both); with the family's feature switched off they are at least 10 times
    further off."""
    path = checkpoint_dir(family)
    mine = load_checkpoint(path).decoder
    ids = prompts((23,), seed=5)[0]
    with torch.inference_mode():
        theirs = hf_from_dir(path)(torch.tensor([ids])).logits[0]
    on = float((_logits(mine, ids) - theirs).abs().max())
    off = Decoder(dataclasses.replace(mine.config, **FEATURES[family]), mine.weights, mine.layers)
    assert on < 1e-6
    assert float((_logits(off, ids) - theirs).abs().max()) > 10 * max(on, 1e-12)


@pytest.mark.parametrize(
    ("family", "k"), [(f, 3 if f in ("mistral", "gpt2") else 2) for f in FAMILIES]
)
def test_beam_search_equals_hf(family: str, k: int, checkpoint_dir: Callable[..., Path]) -> None:
    """The best of k beams equals transformers' beam search (no EOS, no length penalty),
    in a pool that swaps groups out and back."""
    path = checkpoint_dir(family)
    ps = prompts((3, 7, 12, 19))
    workload = [dataclasses.replace(s, beam_width=k) for s in specs(ps, 5)]
    engine = build_real_engine(
        load_checkpoint(path).decoder,
        workload,
        num_gpu_blocks=10 * k,
        block_size=4,
        num_cpu_blocks=64,
        scheduler=SchedulerConfig(max_model_len=MAX_POSITION, preemption_mode=PreemptionMode.SWAP),
        check_integrity=True,
    )
    for req in engine.run().requests:
        assert tuple(req.output_token_ids) == hf_generate(path, ps[req.request_id], 5, num_beams=k)

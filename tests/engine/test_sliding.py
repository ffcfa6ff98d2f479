"""Sliding-window attention: the clipped counts against a token-by-token count, the roofline's
windowed price, and simulated runs of a sliding-window model."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.engine.batch_shape import BatchShape
from pagedkv.engine.cost_model import RooflineConfig, RooflineCost
from pagedkv.engine.sliding import clipped_sum, needs_window_pricing, windowed_shape
from pagedkv.errors import ConfigError
from pagedkv.models.gpus import GPUS
from pagedkv.models.models import MODELS
from pagedkv.simulation import SimulationConfig, simulate

CHUNKS = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 120)), max_size=6)


def _by_token(chunks: list[tuple[int, int]], window: int) -> tuple[int, int]:
    """Pairs and reads counted one token at a time: position p sees max(0, p-W+1) .. p."""
    pairs = reads = 0
    for n, c in chunks:
        seen: set[int] = set()
        for p in range(c, c + n):
            span = range(max(0, p - window + 1), p + 1)
            pairs += len(span)
            seen.update(span)
        reads += len(seen)
    return pairs, reads


@settings(max_examples=200, deadline=None)
@given(CHUNKS, st.integers(1, 150))
def test_windowed_counts_equal_a_token_by_token_count(
    chunks: list[tuple[int, int]], window: int
) -> None:
    shape = windowed_shape(chunks, window)
    assert (shape.attn_pairs, shape.kv_read_tokens) == _by_token(chunks, window)
    full = BatchShape.from_chunks(chunks)
    assert (shape.num_tokens, shape.num_seqs) == (full.num_tokens, full.num_seqs)
    if all(c + n <= window for n, c in chunks):
        assert shape == full  # a window nobody outgrows clips nothing


@given(st.integers(0, 50), st.integers(-1, 60), st.integers(1, 40))
def test_clipped_sum(first: int, last: int, window: int) -> None:
    assert clipped_sum(first, last, window) == sum(min(q, window) for q in range(first, last + 1))


def test_clipped_sum_by_hand() -> None:
    # q = 3..8 with W = 5: 3 + 4 + 5 + 5 + 5 + 5
    assert clipped_sum(3, 8, 5) == 27
    # one decode after 9 cached tokens, W = 4: 4 pairs, reads positions 6..9
    assert windowed_shape([(1, 9)], 4) == BatchShape(1, 1, 4, 4)
    with pytest.raises(ConfigError, match="sliding_window"):
        windowed_shape([(1, 1)], 0)


MISTRAL_WINDOWED = dataclasses.replace(
    MODELS["Mistral-7B"], sliding_window=4096, num_sliding_layers=32
)
GEMMA2_LIKE = dataclasses.replace(  # half the layers slide
    MODELS["Mistral-7B"], sliding_window=4096, num_sliding_layers=16
)


def test_a_decode_past_the_window_costs_a_decode_at_the_window() -> None:
    cost = RooflineCost(GPUS["H100-SXM"], MISTRAL_WINDOWED)
    long = BatchShape.decode(8, 20_000)
    clipped = windowed_shape([(1, 20_000)] * 8, 4096)
    assert clipped == BatchShape(8, 8, 8 * 4096, 8 * 4096)
    at_window = cost.step_time(BatchShape.decode(8, 4095))  # each attends to 4096 positions
    assert cost.windowed_step_time(long, clipped) == pytest.approx(at_window, rel=1e-12)
    assert cost.windowed_step_time(long, clipped) < cost.step_time(long)


def test_only_sliding_layers_are_clipped() -> None:
    cfg = RooflineConfig(step_overhead_s=0.0, per_sequence_s=0.0)
    full = RooflineCost(GPUS["H100-SXM"], MODELS["Mistral-7B"], config=cfg)
    half = RooflineCost(GPUS["H100-SXM"], GEMMA2_LIKE, config=cfg)
    allw = RooflineCost(GPUS["H100-SXM"], MISTRAL_WINDOWED, config=cfg)
    shape = BatchShape.decode(64, 20_000)
    clipped = windowed_shape([(1, 20_000)] * 64, 4096)
    # K/V reads dominate this decode: the memory term, read over 16 of 32 layers less (their
    # bytes and, at block size 16, the paged kernel's per-block share of them)
    read_saving = (
        (shape.kv_read_tokens - clipped.kv_read_tokens)
        * half.model.kv_bytes_per_layer_per_gpu()
        * (1 + cfg.paged_block_overhead)
    )
    byte_s = GPUS["H100-SXM"].mem_bandwidth * cfg.memory_efficiency
    assert full.memory_time(shape) > full.compute_time(shape)
    expected_half = full.memory_time(shape) - 16 * read_saving / byte_s
    assert half.windowed_step_time(shape, clipped) == pytest.approx(expected_half, rel=1e-12)
    expected_all = full.memory_time(shape) - 32 * read_saving / byte_s
    assert allw.windowed_step_time(shape, clipped) == pytest.approx(expected_all, rel=1e-12)
    assert half.windowed_step_time(shape, shape) == half.step_time(shape)  # nothing clipped


def test_window_pricing_only_when_a_sequence_can_outgrow_it() -> None:
    assert needs_window_pricing(MISTRAL_WINDOWED, 8192)
    assert not needs_window_pricing(MISTRAL_WINDOWED, 4096)
    assert not needs_window_pricing(MODELS["Mistral-7B"], 32768)


def _config_json(tmp_path: Path, window: int | None) -> str:
    raw = {
        "model_type": "mistral",
        "hidden_size": 1024,
        "intermediate_size": 2816,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "num_hidden_layers": 8,
        "max_position_embeddings": 2048,
        "sliding_window": window,
        "vocab_size": 32000,
    }
    path = tmp_path / f"w{window}" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(raw))
    return str(path)


def _run(model: str, **extra: object) -> dict[str, Any]:
    flat = {
        "model": model,
        "gpu": "L4",
        "workload": "fixed",
        "prompt_len": 600,
        "output_len": 200,
        "num_requests": 12,
        **extra,
    }
    return simulate(SimulationConfig.from_flat(flat)).summary


def test_a_window_the_sequences_outgrow_makes_the_run_faster(tmp_path: Path) -> None:
    plain = _run(_config_json(tmp_path, None))
    windowed = _run(_config_json(tmp_path, 128))
    assert windowed["finished"] == plain["finished"] == 12
    assert windowed["sim_time"] < plain["sim_time"]
    assert windowed["num_gpu_blocks"] == plain["num_gpu_blocks"]  # the pool keeps every token


def test_a_window_nobody_outgrows_changes_nothing(tmp_path: Path) -> None:
    # window 1024 > 800 tokens per request, < max_model_len 2048: priced window by window,
    # stepping every round, and equal to the windowless model stepped every round
    plain = _run(_config_json(tmp_path, None), reference=True)
    windowed = _run(_config_json(tmp_path, 1024))
    assert windowed == plain

"""``pagedkv generate``: the real path end to end, as a demo.

A decoder with random weights from a seed (a built-in tiny GPT-2 or Llama, or the shape of a
Hugging Face ``config.json``), prompts from a file (one per line, space-separated token ids) or
random ones, and the simulator's Engine and Scheduler driving the ``TorchExecutor``. Every
request generates exactly ``max_new_tokens`` tokens (EOS is not special, as in HF ``generate``
with ``min_new_tokens = max_new_tokens``). With ``num_beams`` > 1 each prompt runs a beam
search through the engine (``pagedkv.engine.beam``) and its output is the best beam.

The result's ``outputs`` (token ids, preemption counts) depend only on the config; the timing
(tokens per second, measured) is reported next to it and left out of the JSON file, so the same
config writes byte-identical JSON.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from pagedkv.engine.config import PreemptionMode, SchedulerConfig
from pagedkv.errors import ConfigError
from pagedkv.footprint import check_memory
from pagedkv.memory.block_table import cdiv
from pagedkv.tensors.executor import SamplingConfig, build_real_engine
from pagedkv.tensors.generate_config import GenerateConfig
from pagedkv.tensors.model import Decoder
from pagedkv.tensors.model_config import DecoderConfig, tiny_config
from pagedkv.validation import check_choice, read_text
from pagedkv.workloads.spec import RequestSpec
from pagedkv.workloads.token_ids import check_ids

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


def load_prompts(path: str | Path, vocab_size: int) -> list[tuple[int, ...]]:
    """One prompt per non-empty line: space-separated token ids in [0, vocab_size)."""
    text = read_text("prompts", path)
    check_ids("prompts", str(path), len(text) // 2 + 1)  # at most one id per two characters
    allowed = f"each line must be space-separated token ids in [0, {vocab_size})"
    out: list[tuple[int, ...]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            ids = tuple(int(t) for t in line.split())
        except ValueError:
            raise ConfigError(f"prompts line {number}", line, allowed) from None
        if not all(0 <= t < vocab_size for t in ids):
            raise ConfigError(f"prompts line {number}", line, allowed)
        out.append(ids)
    if not out:
        raise ConfigError("prompts", str(path), "must hold at least one prompt")
    return out


def weight_count(shape: DecoderConfig) -> int:
    """About how many parameters a decoder of ``shape`` has (embeddings, attention, MLP)."""
    h = shape.hidden_size
    attention = (
        2 * h * shape.num_heads * shape.head_dim + 2 * h * shape.num_kv_heads * shape.head_dim
    )
    mlp = 3 * h * shape.intermediate_size
    embeddings = shape.vocab_size * h * (1 if shape.tie_word_embeddings else 2)
    return embeddings + shape.max_position * h + shape.num_layers * (attention + mlp)


def generate(config: GenerateConfig) -> dict[str, Any]:
    """Run the demo; returns ``{"config", "outputs", "summary", "timing"}`` (see the module
    docstring: everything but ``timing`` is deterministic)."""
    shape = DecoderConfig.from_hf(config.config) if config.config else tiny_config(config.model)
    if config.prompts is not None:
        prompts = load_prompts(config.prompts, shape.vocab_size)
    else:
        g = torch.Generator().manual_seed(config.seed)
        prompts = [
            tuple(
                int(t)
                for t in torch.randint(0, shape.vocab_size, (config.prompt_len,), generator=g)
            )
            for _ in range(config.num_prompts)
        ]
    longest = max(len(p) for p in prompts) + config.max_new_tokens
    if longest > shape.max_position:
        raise ConfigError(
            "max_new_tokens",
            config.max_new_tokens,
            f"prompt + output = {longest} must be <= the model's max_position {shape.max_position}",
        )
    scheduler = SchedulerConfig(
        scheduler=config.scheduler,
        max_model_len=shape.max_position,
        preemption_mode=check_choice("preemption_mode", config.preemption_mode, PreemptionMode),
        enable_chunked_prefill=config.enable_chunked_prefill,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_num_seqs=min(256, config.max_num_batched_tokens or 256),
    )
    num_blocks = config.num_gpu_blocks
    if num_blocks is None:
        num_blocks = config.num_beams * sum(
            cdiv(len(p) + config.max_new_tokens, config.block_size) for p in prompts
        )
    # The weights and the K/V tensors (GPU and CPU pools), checked before they are allocated.
    size = torch.empty((), dtype=DTYPES[config.dtype]).element_size()
    slot_bytes = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * size
    blocks = num_blocks + config.num_cpu_blocks
    weights = size * weight_count(shape)
    check_memory(
        "num_gpu_blocks",
        num_blocks,
        f"{blocks} K/V blocks x {config.block_size} slots x {slot_bytes} B and {weights} B of "
        "weights",
        blocks * config.block_size * slot_bytes + weights,
    )
    model = Decoder.random(shape, seed=config.seed, dtype=DTYPES[config.dtype])
    specs = [
        RequestSpec(i, len(p), config.max_new_tokens, token_ids=p, beam_width=config.num_beams)
        for i, p in enumerate(prompts)
    ]
    engine = build_real_engine(
        model,
        specs,
        num_gpu_blocks=num_blocks,
        block_size=config.block_size,
        num_cpu_blocks=config.num_cpu_blocks,
        scheduler=scheduler,
        sampling=SamplingConfig(config.temperature, config.seed),
    )
    start = time.perf_counter()
    run = engine.run()
    wall = time.perf_counter() - start
    generated = sum(len(r.output_token_ids) for r in run.requests)
    outputs = [
        {
            "request_id": r.request_id,
            "prompt_len": r.prompt_len,
            "status": r.status.value,
            "num_preemptions": r.num_preemptions,
            "output_token_ids": list(r.output_token_ids),
        }
        for r in run.requests
    ]
    summary = {
        "num_requests": len(run.requests),
        "generated_tokens": generated,
        "iterations": run.totals.iterations,
        "preemptions": run.totals.preemptions,
        "swap_outs": run.totals.swap_outs,
        "num_gpu_blocks": num_blocks,
        "deadlocked": run.deadlocked,
    }
    timing = {
        "wall_seconds": wall,
        "step_seconds": run.sim_time,
        "tokens_per_second": generated / wall if wall > 0 else 0.0,
    }
    return {"config": asdict(config), "outputs": outputs, "summary": summary, "timing": timing}

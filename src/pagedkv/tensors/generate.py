"""``pagedkv generate``: the real path end to end.

A decoder: a local Hugging Face checkpoint directory (``pagedkv.tensors.checkpoint``: its
weights, tokenizer and generation defaults), or random weights from a seed (a built-in tiny
GPT-2 or Llama, or the shape of a ``config.json``). Prompts: text (``--prompt``, or a file of
lines, with the checkpoint's tokenizer), token ids (a file of space-separated ids), or random
ids. The simulator's Engine and Scheduler drive the ``TorchExecutor``. A request ends after
``max_new_tokens`` (vLLM's ``max_tokens``) or at its first stop token: the checkpoint's EOS
(unless ``ignore_eos``) or one of ``stop_token_ids``; that token is its last output, and
``finish_reason`` says which ("stop" or "length", vLLM's names). With ``num_beams`` > 1 each
prompt runs a beam search through the engine (``pagedkv.engine.beam``), its full length, and
its output is the best beam. With a tokenizer, each output also comes back as text.

The result's ``outputs`` (token ids, text, preemption counts) depend only on the config; the
timing (tokens per second, measured) is reported next to it and left out of the JSON file, so
the same config writes byte-identical JSON.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from pagedkv.engine.config import PreemptionMode, SchedulerConfig
from pagedkv.engine.engine import Engine
from pagedkv.errors import ConfigError
from pagedkv.footprint import check_memory
from pagedkv.memory.block_table import cdiv
from pagedkv.memory.manager import KVCacheManager
from pagedkv.tensors.checkpoint import GenerationDefaults, load_checkpoint
from pagedkv.tensors.executor import build_real_engine
from pagedkv.tensors.generate_config import GenerateConfig
from pagedkv.tensors.model import Decoder
from pagedkv.tensors.model_config import DecoderConfig, tiny_config
from pagedkv.tensors.sampling import SamplingConfig
from pagedkv.tensors.text import TextTokenizer
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


def _model(
    config: GenerateConfig,
) -> tuple[Decoder, GenerationDefaults, TextTokenizer | None]:
    dtype = None if config.dtype == "auto" else DTYPES[config.dtype]
    if config.is_checkpoint:
        ck = load_checkpoint(config.model, dtype=dtype)
        return ck.decoder, ck.generation, ck.tokenizer
    shape = DecoderConfig.from_hf(config.config) if config.config else tiny_config(config.model)
    size = torch.empty((), dtype=dtype or torch.float32).element_size()
    weights = size * weight_count(shape)  # checked before the random weights are made
    check_memory("config", config.config or config.model, f"{weights} B of weights", weights)
    model = Decoder.random(shape, seed=config.seed, dtype=dtype or torch.float32)
    return model, GenerationDefaults(), None


def _encode(
    texts: list[str], tokenizer: TextTokenizer | None, vocab_size: int, field: str
) -> list[tuple[int, ...]]:
    if tokenizer is None:
        raise ConfigError(field, texts[0], "text prompts need a checkpoint with a tokenizer.json")
    out = []
    for number, text in enumerate(texts, start=1):
        ids = tokenizer.encode(text)
        if not ids:
            raise ConfigError(f"{field} {number}", text, "encodes to no tokens")
        if max(ids) >= vocab_size:
            raise ConfigError(
                f"{field} {number}", text, f"the tokenizer's ids must be < vocab_size {vocab_size}"
            )
        out.append(ids)
    return out


def _prompts(
    config: GenerateConfig, vocab_size: int, tokenizer: TextTokenizer | None
) -> list[tuple[int, ...]]:
    if config.prompt:
        return _encode(list(config.prompt), tokenizer, vocab_size, "prompt")
    if config.prompts is not None:
        as_text = config.prompt_format == "text" or (
            config.prompt_format == "auto" and tokenizer is not None
        )
        if not as_text:
            return load_prompts(config.prompts, vocab_size)
        lines = read_text("prompts", config.prompts).splitlines()
        texts = [line for line in lines if line.strip()]
        if not texts:
            raise ConfigError("prompts", config.prompts, "must hold at least one prompt")
        return _encode(texts, tokenizer, vocab_size, "prompts line")
    g = torch.Generator().manual_seed(config.seed)
    return [
        tuple(int(t) for t in torch.randint(0, vocab_size, (config.prompt_len,), generator=g))
        for _ in range(config.num_prompts)
    ]


def generate(config: GenerateConfig) -> dict[str, Any]:
    """Run the prompts; returns ``{"config", "outputs", "summary", "timing"}`` (see the module
    docstring: everything but ``timing`` is deterministic)."""
    model, defaults, tokenizer = _model(config)
    shape = model.config
    prompts = _prompts(config, shape.vocab_size, tokenizer)
    max_new = config.max_new_tokens or defaults.max_new_tokens or 16
    stops = tuple(config.stop_token_ids) + (() if config.ignore_eos else defaults.eos_token_ids)
    longest = max(len(p) for p in prompts) + max_new
    if longest > shape.max_position:
        raise ConfigError(
            "max_new_tokens",
            max_new,
            f"prompt + output = {longest} must be <= the model's max_position {shape.max_position}",
        )
    max_model_len = config.max_model_len or shape.max_position
    if max_model_len > shape.max_position:
        raise ConfigError(
            "max_model_len",
            max_model_len,
            f"must be <= the model's max_position {shape.max_position}",
        )
    scheduler = SchedulerConfig(
        scheduler=config.scheduler,
        max_model_len=max_model_len,
        preemption_mode=check_choice("preemption_mode", config.preemption_mode, PreemptionMode),
        group_preemption_mode=check_choice(
            "group_preemption_mode", config.group_preemption_mode, PreemptionMode
        ),
        enable_chunked_prefill=config.enable_chunked_prefill,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_num_seqs=config.max_num_seqs or min(256, config.max_num_batched_tokens or 256),
    )
    num_cpu_blocks = config.num_cpu_blocks
    if config.swap_space is not None:  # GiB // one block's K and V over every layer
        itemsize = torch.empty(0, dtype=model.dtype).element_size()
        block_bytes = (
            2
            * shape.num_layers
            * config.block_size
            * shape.num_kv_heads
            * shape.head_dim
            * itemsize
        )
        num_cpu_blocks = int(config.swap_space * 2**30) // block_bytes
    num_blocks = config.num_gpu_blocks
    if num_blocks is None:
        num_blocks = config.num_beams * sum(
            cdiv(len(p) + max_new, config.block_size) for p in prompts
        )
    # The K/V tensors (GPU and CPU pools), checked before they are allocated.
    size = torch.empty((), dtype=model.dtype).element_size()
    slot_bytes = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * size
    blocks = num_blocks + num_cpu_blocks
    check_memory(
        "num_gpu_blocks",
        num_blocks,
        f"{blocks} K/V blocks x {config.block_size} slots x {slot_bytes} B",
        blocks * config.block_size * slot_bytes,
    )
    specs = [
        RequestSpec(i, len(p), max_new, token_ids=p, beam_width=config.num_beams)
        for i, p in enumerate(prompts)
    ]
    engine = build_real_engine(
        model,
        specs,
        num_gpu_blocks=num_blocks,
        block_size=config.block_size,
        num_cpu_blocks=num_cpu_blocks,
        scheduler=scheduler,
        sampling=SamplingConfig(config.temperature, config.seed, stops),
        watermark=config.watermark,
        enable_prefix_caching=config.enable_prefix_caching,
        eviction_policy=config.eviction_policy,
    )
    start = time.perf_counter()
    run = engine.run()
    wall = time.perf_counter() - start
    generated = sum(len(r.output_token_ids) for r in run.requests)
    stop_set = set(stops) if config.num_beams == 1 else set()
    outputs = []
    for r in run.requests:
        ids = list(r.output_token_ids)
        out: dict[str, Any] = {
            "request_id": r.request_id,
            "prompt_len": r.prompt_len,
            "status": r.status.value,
            "finish_reason": "stop" if ids and ids[-1] in stop_set else "length",
            "num_preemptions": r.num_preemptions,
            "output_token_ids": ids,
            "reject_reason": r.reject_reason,
        }
        if tokenizer is not None:
            out["output_text"] = tokenizer.decode(ids)
        outputs.append(out)
    summary = {
        "num_requests": len(run.requests),
        "generated_tokens": generated,
        "iterations": run.totals.iterations,
        "preemptions": run.totals.preemptions,
        "swap_outs": run.totals.swap_outs,
        "prefix_hit_tokens": _prefix_hits(engine),
        "num_gpu_blocks": num_blocks,
        "num_cpu_blocks": num_cpu_blocks,
        "deadlocked": run.deadlocked,
    }
    timing = {
        "wall_seconds": wall,
        "step_seconds": run.sim_time,
        "tokens_per_second": generated / wall if wall > 0 else 0.0,
    }
    return {"config": asdict(config), "outputs": outputs, "summary": summary, "timing": timing}


def _prefix_hits(engine: Engine) -> int:
    kv = engine.scheduler.kv
    return int(kv.stats.prefix_hit_tokens) if isinstance(kv, KVCacheManager) else 0

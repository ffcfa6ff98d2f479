"""The config of ``pagedkv generate`` (torch-free, so the CLI can build its flags and validate
before torch is imported)."""

from __future__ import annotations

from dataclasses import dataclass

from pagedkv.engine.config import MAX_BATCHED_TOKENS, PreemptionMode
from pagedkv.errors import ConfigError
from pagedkv.memory.config import MAX_BLOCK_SIZE, MAX_BLOCKS
from pagedkv.tensors.model_config import ARCHITECTURES
from pagedkv.validation import (
    check_bool,
    check_bounds,
    check_choice,
    check_int,
    float_field,
    help_field,
    int_field,
)
from pagedkv.workloads.config import MAX_SAMPLES
from pagedkv.workloads.token_ids import check_ids

MAX_PROMPTS = 1 << 16
MAX_LEN = 1 << 20
"""Tokens of a prompt or of an output: a real model's positions, far above a demo's."""

DTYPE_NAMES = ("float32", "float64", "bfloat16")


@dataclass(frozen=True)
class GenerateConfig:
    """What ``pagedkv generate`` runs."""

    model: str = help_field("llama", "Built-in tiny model: 'gpt2' or 'llama'.")
    config: str | None = help_field(None, "A Hugging Face config.json (gpt2/llama) instead.")
    prompts: str | None = help_field(None, "File of prompts, one per line: space-separated ids.")
    num_prompts: int = int_field(8, "Random prompts when no file is given.", 1, MAX_PROMPTS)
    prompt_len: int = int_field(32, "Length of each random prompt.", 1, MAX_LEN)
    max_new_tokens: int = int_field(16, "Tokens generated per prompt.", 1, MAX_LEN)
    block_size: int = int_field(16, "Token slots per KV block.", 1, MAX_BLOCK_SIZE)
    num_gpu_blocks: int | None = int_field(
        None, "KV blocks in the pool; default: room for every request at once.", 1, MAX_BLOCKS
    )
    num_cpu_blocks: int = int_field(64, "Blocks of the CPU swap pool.", 0, MAX_BLOCKS)
    scheduler: str = help_field("vllm", "Scheduling policy (see `pagedkv simulate --help`).")
    preemption_mode: str = help_field("recompute", "'recompute' or 'swap'.")
    enable_chunked_prefill: bool = help_field(False, "Chunked prefill (vLLM v1).")
    max_num_batched_tokens: int | None = int_field(
        None, "Token budget of one iteration.", 1, MAX_BATCHED_TOKENS
    )
    temperature: float = float_field(
        0.0, "0: greedy; else seeded sampling at this temperature.", 0.0, 100.0
    )
    num_beams: int = int_field(
        1, "Beam search width per prompt (1: none); the output is the best beam.", 1, MAX_SAMPLES
    )
    dtype: str = help_field("float32", "float32, float64 or bfloat16.")
    seed: int = int_field(
        0, "Seed of the weights, the random prompts and the sampling.", 0, 2**63 - 1
    )

    def __post_init__(self) -> None:
        check_bounds(self)
        if self.prompts is None:  # the random prompts' ids, before any is drawn
            check_ids("num_prompts", self.num_prompts, self.num_prompts * self.prompt_len)
        if self.config is None and self.model not in ARCHITECTURES:
            raise ConfigError("model", self.model, "must be one of " + ", ".join(ARCHITECTURES))
        check_int("num_prompts", self.num_prompts, 1)
        check_int("prompt_len", self.prompt_len, 1)
        check_int("max_new_tokens", self.max_new_tokens, 1)
        check_int("block_size", self.block_size, 1)
        if self.num_gpu_blocks is not None:
            check_int("num_gpu_blocks", self.num_gpu_blocks, 1)
        check_int("num_cpu_blocks", self.num_cpu_blocks, 0)
        check_bool("enable_chunked_prefill", self.enable_chunked_prefill)
        check_choice("preemption_mode", self.preemption_mode, PreemptionMode)
        from pagedkv.engine.policies import SCHEDULERS  # the registry validates the name

        if self.scheduler not in SCHEDULERS:
            raise ConfigError(
                "scheduler", self.scheduler, "must be one of " + ", ".join(sorted(SCHEDULERS))
            )
        if self.dtype not in DTYPE_NAMES:
            raise ConfigError("dtype", self.dtype, "must be one of " + ", ".join(DTYPE_NAMES))
        check_int("seed", self.seed, 0)
        check_int("num_beams", self.num_beams, 1)
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0:
            raise ConfigError("temperature", t, "must be a number >= 0 (0: greedy)")

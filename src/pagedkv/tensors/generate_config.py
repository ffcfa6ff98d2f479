"""The config of ``pagedkv generate`` (torch-free, so the CLI can build its flags and validate
before torch is imported)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pagedkv.engine.config import MAX_BATCHED_TOKENS, MAX_NUM_SEQS, PreemptionMode
from pagedkv.errors import ConfigError
from pagedkv.memory.config import MAX_BLOCK_SIZE, MAX_BLOCKS, EvictionPolicy
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

DTYPE_NAMES = ("auto", "float32", "float64", "bfloat16")
PROMPT_FORMATS = ("auto", "ids", "text")


def _check_ids(field: str, values: object) -> None:
    if not isinstance(values, tuple):
        raise ConfigError(field, values, "must be a tuple")
    for v in values:
        check_int(field, v, 0)


@dataclass(frozen=True)
class GenerateConfig:
    """What ``pagedkv generate`` runs."""

    model: str = help_field(
        "llama",
        "Built-in tiny random model 'gpt2' or 'llama', or a local Hugging Face checkpoint "
        "directory (config.json, safetensors weights, optional tokenizer.json and "
        "generation_config.json).",
    )
    config: str | None = help_field(
        None, "A Hugging Face config.json: its shape, with random weights (built-in model only)."
    )
    prompts: str | None = help_field(
        None, "File of prompts, one per line: space-separated ids, or text (--prompt-format)."
    )
    prompt: tuple[str, ...] = help_field((), "A text prompt (repeatable; needs a tokenizer).")
    prompt_format: str = help_field(
        "auto", "How --prompts lines read: 'ids', 'text', or 'auto' (text with a tokenizer)."
    )
    num_prompts: int = int_field(8, "Random prompts when none is given.", 1, MAX_PROMPTS)
    prompt_len: int = int_field(32, "Length of each random prompt.", 1, MAX_LEN)
    max_new_tokens: int | None = int_field(
        None,
        "Most tokens generated per prompt (vLLM's max_tokens); default: the checkpoint's "
        "generation_config max_new_tokens, else 16.",
        1,
        MAX_LEN,
    )
    stop_token_ids: tuple[int, ...] = help_field(
        (), "Token ids that end a request when sampled, besides the checkpoint's EOS."
    )
    ignore_eos: bool = help_field(False, "Do not stop at the checkpoint's EOS tokens.")
    block_size: int = int_field(16, "Token slots per KV block.", 1, MAX_BLOCK_SIZE)
    num_gpu_blocks: int | None = int_field(
        None, "KV blocks in the pool; default: room for every request at once.", 1, MAX_BLOCKS
    )
    num_cpu_blocks: int = int_field(64, "Blocks of the CPU swap pool.", 0, MAX_BLOCKS)
    swap_space: float | None = float_field(
        None,
        "CPU swap space in GiB instead of num_cpu_blocks (blocks of this model's K/V).",
        0.0,
        1024.0,
    )
    watermark: float = float_field(
        0.01, "Fraction of blocks admission keeps free.", 0.0, 1.0, hi_open=True
    )
    scheduler: str = help_field("vllm", "Scheduling policy (see `pagedkv simulate --help`).")
    max_num_seqs: int | None = int_field(
        None,
        "Most requests running at once; default 256 (at most the token budget).",
        1,
        MAX_NUM_SEQS,
    )
    max_model_len: int | None = int_field(
        None, "Longest request (prompt + output); default: the model's max_position.", 1, MAX_LEN
    )
    preemption_mode: str = help_field("recompute", "'recompute' or 'swap'.")
    group_preemption_mode: str = help_field(
        "swap", "How a beam group is preempted: 'swap' or 'recompute'."
    )
    enable_chunked_prefill: bool = help_field(False, "Chunked prefill (vLLM v1).")
    max_num_batched_tokens: int | None = int_field(
        None, "Token budget of one iteration.", 1, MAX_BATCHED_TOKENS
    )
    enable_prefix_caching: bool = help_field(
        False, "Reuse cached full blocks of equal prefixes (vLLM's automatic prefix caching)."
    )
    eviction_policy: str = help_field(
        "lru", "Which free cached block prefix caching evicts first: 'lru' or 'lfu'."
    )
    temperature: float = float_field(
        0.0, "0: greedy; else seeded sampling at this temperature.", 0.0, 100.0
    )
    num_beams: int = int_field(
        1, "Beam search width per prompt (1: none); the output is the best beam.", 1, MAX_SAMPLES
    )
    dtype: str = help_field(
        "auto", "auto (float32; a checkpoint: as stored), float32, float64 or bfloat16."
    )
    seed: int = int_field(
        0,
        "Seed of random weights and prompts; request i samples with a seed from (seed, i).",
        0,
        2**63 - 1,
    )

    def __post_init__(self) -> None:
        check_bounds(self)
        if self.prompts is None and not self.prompt:  # the random prompts' ids, before drawn
            check_ids("num_prompts", self.num_prompts, self.num_prompts * self.prompt_len)
        if self.config == "":  # (a falsy path would quietly mean the built-in shape)
            raise ConfigError("config", self.config, "an empty path names no config.json")
        if self.model not in ARCHITECTURES:
            if self.config is not None:
                raise ConfigError("config", self.config, "only with a built-in model: gpt2, llama")
            if not Path(self.model).is_dir():
                raise ConfigError(
                    "model",
                    self.model,
                    "must be one of " + ", ".join(ARCHITECTURES) + ", or a checkpoint directory",
                )
        if not isinstance(self.prompt, tuple) or not all(isinstance(p, str) for p in self.prompt):
            raise ConfigError("prompt", self.prompt, "must be a tuple of strings")
        if self.prompt and self.prompts is not None:
            raise ConfigError("prompt", self.prompt, "excludes --prompts: give one or the other")
        if self.prompt_format not in PROMPT_FORMATS:
            raise ConfigError(
                "prompt_format", self.prompt_format, "must be one of " + ", ".join(PROMPT_FORMATS)
            )
        check_int("num_prompts", self.num_prompts, 1)
        check_int("prompt_len", self.prompt_len, 1)
        if self.max_new_tokens is not None:
            check_int("max_new_tokens", self.max_new_tokens, 1)
        _check_ids("stop_token_ids", self.stop_token_ids)
        check_bool("ignore_eos", self.ignore_eos)
        check_int("block_size", self.block_size, 1)
        if self.num_gpu_blocks is not None:
            check_int("num_gpu_blocks", self.num_gpu_blocks, 1)
        check_int("num_cpu_blocks", self.num_cpu_blocks, 0)
        if self.swap_space is not None:
            v = self.swap_space
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ConfigError("swap_space", v, "must be a number of GiB >= 0")
        for name in ("max_num_seqs", "max_model_len"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), 1)
        check_choice("group_preemption_mode", self.group_preemption_mode, PreemptionMode)
        check_choice("eviction_policy", self.eviction_policy, EvictionPolicy)
        check_bool("enable_chunked_prefill", self.enable_chunked_prefill)
        check_bool("enable_prefix_caching", self.enable_prefix_caching)
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

    @property
    def is_checkpoint(self) -> bool:
        """Is ``model`` a checkpoint directory (not a built-in name)?"""
        return self.model not in ARCHITECTURES

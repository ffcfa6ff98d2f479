"""The configs of ``pagedkv profile`` and ``pagedkv fidelity`` (torch-free: the CLI builds its
flags from them and validates before torch is imported)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pagedkv.engine.config import PreemptionMode
from pagedkv.errors import ConfigError
from pagedkv.tensors.model_shapes import resolve_model
from pagedkv.validation import check_bool, check_choice, check_int, help_field

DEVICES = ("cpu", "cuda")


def _check_device(device: object) -> None:
    if device not in DEVICES:
        raise ConfigError("device", device, "must be one of " + ", ".join(DEVICES))


def _check_seconds(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, value, "must be a number of seconds > 0")
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(field, value, "must be a number of seconds > 0")


@dataclass(frozen=True)
class ProfileConfig:
    """What ``pagedkv profile`` measures, and how long it may take."""

    model: str = help_field(
        "tiny-llama",
        "tiny-llama, small-llama, llama-110m, a simulator preset (OPT-13B, ...) or a Hugging "
        "Face config.json (gpt2, llama, opt).",
    )
    device: str = help_field("cpu", "cpu or cuda.")
    dtype: str = help_field("float32", "float32, float64 or bfloat16.")
    block_sizes: tuple[int, ...] = help_field(
        (16,), "Block sizes to measure the paged kernel and swaps at (each >= 1)."
    )
    max_tokens: int = help_field(2048, "Largest batched-token count measured (>= 1).")
    max_seqs: int = help_field(64, "Largest batch of sequences measured (>= 1).")
    budget_s: float = help_field(
        60.0, "Seconds of timing, spread over the measured points (each at least 3 runs)."
    )
    threads: int = help_field(1, "torch threads (>= 1; 1 times with this thread's CPU time).")
    seed: int = help_field(0, "Seed of the random weights and inputs.")

    def __post_init__(self) -> None:
        _check_device(self.device)
        resolve_model(self.model, self.dtype)  # names the model or the dtype if bad
        if not isinstance(self.block_sizes, tuple) or not self.block_sizes:
            raise ConfigError("block_sizes", self.block_sizes, "must be a non-empty tuple")
        for b in self.block_sizes:
            check_int("block_size", b, 1)
        if len(set(self.block_sizes)) != len(self.block_sizes):
            raise ConfigError("block_sizes", list(self.block_sizes), "must not repeat")
        check_int("max_tokens", self.max_tokens, 1)
        check_int("max_seqs", self.max_seqs, 1)
        _check_seconds("budget_s", self.budget_s)
        check_int("threads", self.threads, 1)
        check_int("seed", self.seed, 0)


@dataclass(frozen=True)
class FidelityConfig:
    """One ``pagedkv fidelity`` run: the workload and the engine it runs through, twice."""

    model: str = help_field("tiny-llama", "As for `pagedkv profile`: the profiled model.")
    profile: str = help_field("", "The profile JSON (`pagedkv profile`) of this model.")
    device: str = help_field("cpu", "cpu or cuda (the profile's device).")
    num_requests: int = help_field(24, "Requests in the workload (>= 1).")
    request_rate: float = help_field(0.0, "Poisson arrivals per second; 0: all at t = 0.")
    min_prompt_len: int = help_field(16, "Shortest prompt (>= 1).")
    max_prompt_len: int = help_field(128, "Longest prompt.")
    min_output_len: int = help_field(8, "Shortest output (>= 1).")
    max_output_len: int = help_field(64, "Longest output.")
    shared_prefix_len: int = help_field(
        0, "Tokens of one prefix every prompt starts with (prefix caching hits it)."
    )
    block_size: int = help_field(16, "Token slots per KV block (one the profile measured).")
    num_gpu_blocks: int = help_field(
        256, "KV blocks in the pool (>= 1; enough to hold the longest request)."
    )
    num_cpu_blocks: int = help_field(128, "Blocks of the CPU swap pool (>= 0).")
    scheduler: str = help_field("vllm", "Scheduling policy (see `pagedkv simulate --help`).")
    preemption_mode: str = help_field("recompute", "'recompute' or 'swap'.")
    enable_chunked_prefill: bool = help_field(False, "Chunked prefill (vLLM v1).")
    max_num_batched_tokens: int | None = help_field(None, "Token budget of one iteration.")
    enable_prefix_caching: bool = help_field(False, "Reuse cached full blocks of equal prefixes.")
    seed: int = help_field(1, "Seed of the weights and the workload.")
    repeats: int = help_field(
        3,
        "Timings of each real step, the median its duration (>= 1; before a step that swaps or "
        "copies blocks runs again, the KV cache is put back as it was: its copies are not "
        "idempotent).",
    )
    noise_floor: bool = help_field(
        False,
        "Run the real workload a second time and report its errors against the first under "
        "`noise` (the measurement's own repeatability: the floor of every error).",
    )

    def __post_init__(self) -> None:
        _check_device(self.device)
        if not self.profile:
            raise ConfigError("profile", self.profile, "needs a profile file (`pagedkv profile`)")
        for name in ("num_requests", "min_prompt_len", "min_output_len", "block_size"):
            check_int(name, getattr(self, name), 1)
        check_int("max_prompt_len", self.max_prompt_len, self.min_prompt_len)
        check_int("max_output_len", self.max_output_len, self.min_output_len)
        check_int("shared_prefix_len", self.shared_prefix_len, 0)
        check_int("num_gpu_blocks", self.num_gpu_blocks, 1)
        longest = self.max_prompt_len + self.max_output_len - 1  # K/V tokens it ever holds
        if self.num_gpu_blocks * self.block_size < longest:
            # a request the pool can never hold is rejected, and has no latency to compare
            raise ConfigError(
                "num_gpu_blocks",
                self.num_gpu_blocks,
                f"must hold the longest request ({longest} tokens: "
                f"{-(-longest // self.block_size)} blocks of {self.block_size})",
            )
        check_int("num_cpu_blocks", self.num_cpu_blocks, 0)
        r = self.request_rate
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not r >= 0:
            raise ConfigError("request_rate", r, "must be a number >= 0 (0: all at t = 0)")
        check_choice("preemption_mode", self.preemption_mode, PreemptionMode)
        check_bool("enable_chunked_prefill", self.enable_chunked_prefill)
        check_bool("enable_prefix_caching", self.enable_prefix_caching)
        if self.max_num_batched_tokens is not None:
            check_int("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        check_int("seed", self.seed, 0)
        check_int("repeats", self.repeats, 1)
        check_bool("noise_floor", self.noise_floor)
        from pagedkv.engine.policies import SCHEDULERS

        if self.scheduler not in SCHEDULERS:
            raise ConfigError(
                "scheduler", self.scheduler, "must be one of " + ", ".join(sorted(SCHEDULERS))
            )

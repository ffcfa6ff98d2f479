"""The engine's config: scheduling policy and budgets, one frozen validated dataclass."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pagedkv.errors import ConfigError
from pagedkv.validation import (
    check_bool,
    check_bounds,
    check_choice,
    check_int,
    help_field,
    int_field,
)
from pagedkv.workloads.config import MAX_TOKENS

MAX_NUM_SEQS = 1 << 20
MAX_BATCHED_TOKENS = 1 << 30


class PreemptionMode(enum.Enum):
    RECOMPUTE = "recompute"
    """Free the victim's blocks; its prompt and outputs so far are prefilled again later."""
    SWAP = "swap"
    """Move the victim's blocks to the CPU pool; swap them back in before it resumes."""


@dataclass(frozen=True)
class SchedulerConfig:
    """Which policy schedules, and the budgets of one iteration (vLLM's names)."""

    scheduler: str = help_field(
        "vllm",
        "Scheduling policy: vllm, reserve, orca-max, orca-pow2, orca-oracle, "
        "contiguous-slots, static, greedy-nopreempt.",
    )
    max_num_seqs: int = int_field(
        256, "Most requests running at once (vLLM's default 256).", 1, MAX_NUM_SEQS
    )
    max_num_batched_tokens: int | None = int_field(
        None,
        "Most tokens computed in one iteration; default: max(max_model_len, 2048) "
        "(vLLM v0), or 2048 with chunked prefill.",
        1,
        MAX_BATCHED_TOKENS,
    )
    max_model_len: int = int_field(
        2048, "Longest request (prompt + output) in tokens.", 1, MAX_TOKENS
    )
    preemption_mode: PreemptionMode = help_field(
        PreemptionMode.RECOMPUTE, "How the vllm policy preempts: 'recompute' or 'swap'."
    )
    group_preemption_mode: PreemptionMode = help_field(
        PreemptionMode.SWAP,
        "How the vllm policy preempts a forked group (parallel samples, beams): 'swap' (vLLM "
        "v0's rule; a restart when the CPU pool is full) or 'recompute' (a restart: the group's "
        "blocks are freed and its samples generated again from the prompt).",
    )
    enable_chunked_prefill: bool = help_field(
        False,
        "One token budget per iteration shared by decodes first, then prefill chunks (vLLM v1).",
    )

    def __post_init__(self) -> None:
        from pagedkv.engine.policies import SCHEDULERS  # the registry validates the name

        check_bounds(self)
        if self.scheduler not in SCHEDULERS:
            raise ConfigError(
                "scheduler", self.scheduler, "must be one of " + ", ".join(sorted(SCHEDULERS))
            )
        check_int("max_num_seqs", self.max_num_seqs, 1)
        check_int("max_model_len", self.max_model_len, 1)
        if self.max_num_batched_tokens is not None:
            check_int("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        object.__setattr__(
            self,
            "preemption_mode",
            check_choice("preemption_mode", self.preemption_mode, PreemptionMode),
        )
        object.__setattr__(
            self,
            "group_preemption_mode",
            check_choice("group_preemption_mode", self.group_preemption_mode, PreemptionMode),
        )
        check_bool("enable_chunked_prefill", self.enable_chunked_prefill)
        budget = self.token_budget
        if not self.enable_chunked_prefill and budget < self.max_model_len:
            raise ConfigError(
                "max_num_batched_tokens",
                budget,
                f"must be >= max_model_len ({self.max_model_len}) without chunked prefill, "
                "or a long prompt could never be scheduled",
            )
        if budget < self.max_num_seqs and self.enable_chunked_prefill:
            raise ConfigError(
                "max_num_batched_tokens",
                budget,
                f"must be >= max_num_seqs ({self.max_num_seqs}) so every decode fits a step",
            )

    @property
    def token_budget(self) -> int:
        """max_num_batched_tokens, or its default."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return 2048 if self.enable_chunked_prefill else max(self.max_model_len, 2048)

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


class SchedulingPolicy(enum.Enum):
    """The vllm-v1 policy's queue order (vLLM's ``--scheduling-policy``)."""

    FCFS = "fcfs"
    """First come, first served; the victim is the last admitted running request."""
    PRIORITY = "priority"
    """Lowest (priority, arrival time) first; the victim is the highest (priority, arrival)."""


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
        "Scheduling policy: vllm, vllm-v1, reserve, orca-max, orca-pow2, orca-oracle, "
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
    # vLLM 0.33's v1 scheduler options (the vllm-v1 policy only; the other policies ignore them)
    scheduler_reserve_full_isl: bool = help_field(
        True,
        "vllm-v1: admit a waiting request only if its whole current sequence fits in the free "
        "blocks, not just its first chunk (vLLM's default true).",
    )
    long_prefill_token_threshold: int = int_field(
        0,
        "vllm-v1: most tokens one prefill chunk computes while more than one request is running "
        "or waiting; 0 means no limit (vLLM's default).",
        0,
        MAX_BATCHED_TOKENS,
    )
    async_scheduling: bool = help_field(
        True,
        "vllm-v1: schedule each step before the previous step's outputs are known, so finished "
        "requests free their blocks one step later (vLLM's default true; false: "
        "--no-async-scheduling).",
    )
    max_num_scheduled_tokens: int | None = int_field(
        None,
        "vllm-v1: most tokens one step schedules; default max_num_batched_tokens (vLLM sets it "
        "lower only when the model appends tokens, as speculative decoding does).",
        1,
        MAX_BATCHED_TOKENS,
    )
    max_num_active_seqs: int | None = int_field(
        None,
        "vllm-v1: most requests admitted into running; default max_num_seqs, at most it.",
        1,
        MAX_NUM_SEQS,
    )
    scheduling_policy: SchedulingPolicy = help_field(
        SchedulingPolicy.FCFS,
        "vllm-v1: 'fcfs' or 'priority' (lowest request priority first, then arrival; a "
        "request's priority is a trace's priority column, default 0).",
    )

    def __post_init__(self) -> None:
        from pagedkv.engine.policies import SCHEDULERS  # the registry validates the name

        check_bounds(self)
        if self.scheduler not in SCHEDULERS:
            raise ConfigError(
                "scheduler", self.scheduler, "must be one of " + ", ".join(sorted(SCHEDULERS))
            )
        # The bounds let None pass ("unset"): these three have no unset value.
        check_int("max_num_seqs", self.max_num_seqs, 1)
        check_int("max_model_len", self.max_model_len, 1)
        check_int("long_prefill_token_threshold", self.long_prefill_token_threshold, 0)
        for name in ("enable_chunked_prefill", "scheduler_reserve_full_isl", "async_scheduling"):
            check_bool(name, getattr(self, name))
        for name, kind in (
            ("preemption_mode", PreemptionMode),
            ("group_preemption_mode", PreemptionMode),
            ("scheduling_policy", SchedulingPolicy),
        ):
            object.__setattr__(self, name, check_choice(name, getattr(self, name), kind))
        if self.max_num_active_seqs is not None and self.max_num_active_seqs > self.max_num_seqs:
            raise ConfigError(
                "max_num_active_seqs",
                self.max_num_active_seqs,
                f"must be <= max_num_seqs ({self.max_num_seqs})",
            )
        # vllm-v1 always chunks, as vLLM's v1 scheduler does (kept once: token_budget is hot)
        chunked = self.enable_chunked_prefill or SCHEDULERS[self.scheduler].always_chunked
        object.__setattr__(self, "_chunked", chunked)
        budget = self.token_budget
        if not self.chunked and budget < self.max_model_len:
            raise ConfigError(
                "max_num_batched_tokens",
                budget,
                f"must be >= max_model_len ({self.max_model_len}) without chunked prefill, "
                "or a long prompt could never be scheduled",
            )
        if budget < self.max_num_seqs and self.chunked:
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
        return 2048 if self.__dict__["_chunked"] else max(self.max_model_len, 2048)

    @property
    def chunked(self) -> bool:
        """Is prefill chunked: enable_chunked_prefill, or a policy that always chunks (vllm-v1,
        as vLLM's v1 scheduler does)?"""
        chunked: bool = self.__dict__["_chunked"]
        return chunked

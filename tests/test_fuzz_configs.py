"""Fuzz: whole simulation configurations, drawn as a user could write them (issue 17).

Hypothesis draws flat keys (every registered policy, every workload kind, and the options:
chunked prefill with budgets around the prompt, prefix caching, pinned prefixes, swap and
recompute, contiguous memory, parallel sampling and beams, watermarks, small pools) through
``SimulationConfig.from_flat`` and ``pagedkv.simulate``. Each example is either refused with a
``ConfigError`` (when the config is read, or when the engine is built: issue 17's defect 12
moves those earlier) or it runs with ``check_integrity`` after every iteration, fast-forwarded
and stepped (``reference=True``), and both give the same summary and per-request records. Any
other exception fails, and so does a hang: a Hypothesis deadline per example, and an alarm
that interrupts a loop that never returns. Workloads stay small (at most 30 requests).
"""

from __future__ import annotations

import dataclasses
import json
import signal
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from pagedkv.engine.policies import SCHEDULERS
from pagedkv.errors import ConfigError
from pagedkv.simulation import SimulationConfig, build_engine, simulate
from pagedkv.workloads.config import WorkloadKind
from tests.engine.test_fast_forward import same

PAGED = ("vllm", "reserve", "greedy-nopreempt")
HANG_S = 60  # an example that runs this long is stuck (they take well under a second)
MAX_REQUESTS = 30

Flat = dict[str, Any]


@st.composite
def workload(draw: st.DrawFn, mml: int) -> Flat:
    """The workload keys of one kind, valid more often than not (invalid ones are refused)."""
    kinds = [k for k in WorkloadKind if mml >= 82 or k is not WorkloadKind.TRANSLATION]
    kind = draw(st.sampled_from(kinds))  # (the 1-shot translation prefix is 80 tokens)
    flat: Flat = {"workload": kind.value, "seed": draw(st.integers(0, 3))}
    lengths = st.integers(1, mml)
    if kind not in (WorkloadKind.LESSON, WorkloadKind.CHAT):
        flat["num_requests"] = draw(st.integers(1, MAX_REQUESTS))
    elif kind is WorkloadKind.LESSON:
        flat["num_requests"] = draw(st.none() | st.integers(1, 20))
    if kind is WorkloadKind.FIXED:
        flat["prompt_len"] = draw(lengths)
        # short outputs often: one output token is where groups and chunks end early
        flat["output_len"] = draw(
            st.integers(1, 2) | st.integers(1, max(1, mml - flat["prompt_len"]))
        )
    elif kind is WorkloadKind.UNIFORM:
        lo, hi = sorted(draw(st.lists(lengths, min_size=2, max_size=2)))
        flat.update(min_prompt_len=lo, max_prompt_len=hi, min_output_len=1)
        flat["max_output_len"] = draw(st.integers(1, 2) | st.integers(1, 40))
    elif kind in (WorkloadKind.SHARED_PREFIX, WorkloadKind.CHAT):
        flat["prefix_len"] = draw(st.integers(1, max(1, mml // 2)))
        flat["lengths"] = draw(st.sampled_from(["fixed", "uniform", "alpaca-like"]))
        if flat["lengths"] == "fixed":
            flat.update(prompt_len=draw(st.integers(1, 20)), output_len=draw(st.integers(1, 20)))
        elif flat["lengths"] == "uniform":
            flat.update(min_prompt_len=1, max_prompt_len=20, min_output_len=1, max_output_len=20)
        if kind is WorkloadKind.SHARED_PREFIX:
            flat["num_prefixes"] = draw(st.integers(1, 3))
            flat["share_ratio"] = draw(st.sampled_from([0.0, 0.5, 1.0]))
        else:
            flat["num_sessions"] = draw(st.integers(1, 5))
            flat["chat_turns"] = draw(st.integers(1, 6))
            flat["think_time_mean"] = draw(st.sampled_from([0.0, 1.0]))
    elif kind is WorkloadKind.TRANSLATION:
        flat["share_ratio"] = draw(st.sampled_from([0.5, 1.0]))
    elif kind is WorkloadKind.TRACE:
        rows = draw(
            st.lists(
                st.tuples(
                    st.integers(0, 5), st.integers(1, mml), st.integers(1, 2) | st.integers(1, 30)
                ),
                min_size=1,
                max_size=MAX_REQUESTS,
            )
        )
        flat["trace_rows"] = sorted(rows)  # written to a file by the test
    if draw(st.booleans()):
        flat["arrival"] = draw(st.sampled_from(["poisson", "gamma", "all-at-once"]))
        if flat["arrival"] != "all-at-once":
            flat["request_rate"] = draw(st.sampled_from([0.5, 5.0, 100.0]))
        if flat["arrival"] == "gamma":
            flat["burstiness"] = draw(st.sampled_from([0.25, 4.0]))
    sampling = draw(st.sampled_from(["one", "samples", "beams"]))
    if sampling == "samples":
        flat["num_samples"] = draw(st.integers(2, 3))
    elif sampling == "beams":
        flat["beam_width"] = draw(st.integers(2, 3))
    if sampling != "one" and kind is not WorkloadKind.CHAT and draw(st.booleans()):
        flat["samples_as_requests"] = True
    return flat


@st.composite
def configs(draw: st.DrawFn) -> Flat:
    mml = draw(st.sampled_from([16, 48, 100, 400]))
    flat = draw(workload(mml))
    flat["max_model_len"] = mml
    flat["scheduler"] = policy = draw(st.sampled_from(sorted(SCHEDULERS)))
    bs = draw(st.sampled_from([1, 4, 7, 16]))
    flat["block_size"] = bs
    # Mostly pools that hold one request of max_model_len (contiguous policies need it), some
    # of only a few blocks; never above a few times that (kept small: preemption happens).
    whole = -(-mml // bs)
    small = draw(st.sampled_from([False, False, False, True]))
    flat["num_gpu_blocks"] = draw(st.integers(1, whole) if small else st.integers(whole, 4 * whole))
    flat["swap_space"] = draw(st.sampled_from([0.0, 0.005, 4.0]))  # GiB: none, a few blocks, many
    flat["watermark"] = draw(st.sampled_from([0.0, 0.01, 0.2]))
    flat["cost_model"] = draw(st.sampled_from(["unit", "roofline"]))
    flat["max_num_seqs"] = draw(st.sampled_from([1, 3, 16, 256]))
    flat["preemption_mode"] = draw(st.sampled_from(["recompute", "swap"]))
    flat["group_preemption_mode"] = draw(st.sampled_from(["recompute", "swap"]))
    sharing = draw(st.sampled_from(["none", "caching", "pinned"]))
    if sharing == "pinned" and policy not in PAGED and draw(st.integers(0, 3)):
        sharing = "none"  # (mostly: pinned prefixes need paged memory, refused otherwise)
    if sharing == "caching":
        flat["enable_prefix_caching"] = True
        flat["eviction_policy"] = draw(st.sampled_from(["lru", "lfu"]))
    elif sharing == "pinned":
        flat["enable_pinned_prefixes"] = True
    v1 = policy == "vllm-v1"  # (always chunked: a budget with or without the flag)
    chunked = draw(st.booleans())
    if chunked or (v1 and draw(st.booleans())):
        if chunked:
            flat["enable_chunked_prefill"] = True
        prompt = flat.get("prompt_len", flat.get("max_prompt_len", mml))
        # prompts of budget + 1 and k x budget + 1 tokens among them
        near = [prompt + 1, prompt, max(1, prompt - 1), max(1, (prompt - 1) // 2)]
        budget = draw(st.sampled_from(near) | st.integers(1, 2 * mml))
        flat["max_num_batched_tokens"] = max(budget, flat["max_num_seqs"])
    if v1:  # vLLM v1's own options
        flat["async_scheduling"] = draw(st.booleans())
        flat["scheduling_policy"] = draw(st.sampled_from(["fcfs", "priority"]))
        flat["long_prefill_token_threshold"] = draw(st.sampled_from([0, 0, 4]))
        flat["scheduler_reserve_full_isl"] = draw(st.booleans())
    return flat


@contextmanager
def alarm(seconds: int) -> Iterator[None]:
    """Interrupt the body after ``seconds`` (a hang, which a deadline alone cannot stop)."""

    def hung(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"no result after {seconds} s: a hang")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run_both(flat: Flat) -> tuple[Any, Any] | None:
    """Both runs of ``flat``, or None when it is refused with a ConfigError."""
    flat = dict(flat)
    rows = flat.pop("trace_rows", None)
    with tempfile.TemporaryDirectory() as tmp:
        if rows is not None:
            trace = Path(tmp) / "trace.jsonl"
            lines = [
                json.dumps({"arrival_time": t, "prompt_len": p, "output_len": o})
                for t, p, o in rows
            ]
            trace.write_text("\n".join(lines) + "\n", encoding="utf-8")
            flat["trace_path"] = str(trace)
        try:
            config = SimulationConfig.from_flat(flat)
        except ConfigError:
            event("refused when read")
            return None
        try:
            build_engine(config)
        except ConfigError:
            event("refused when the engine is built")
            return None
        fast = simulate(config, check_integrity=True)
        ref = simulate(dataclasses.replace(config, reference=True), check_integrity=True)
    return fast, ref


def check(flat: Flat) -> None:
    with alarm(HANG_S):
        both = run_both(flat)
    if both is None:
        return
    fast, ref = both
    event(f"ran: {flat['scheduler']}, {flat['workload']}")
    if fast.summary["deadlocked"]:
        event("deadlock reported")
    same(fast.summary, ref.summary)
    same(fast.requests, ref.requests)
    assert len(fast.requests) <= MAX_REQUESTS * 3  # samples_as_requests: n <= 3 each


@settings(
    max_examples=300,
    deadline=timedelta(seconds=HANG_S // 2),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(flat=configs())
# Found by this test: under prefix caching a prompt's chunk appended beside the cohort's
# members settled every grower, so the members' memory stopped growing mid-cohort.
@example(
    flat={
        "workload": "alpaca-like",
        "seed": 0,
        "num_requests": 3,
        "max_model_len": 16,
        "scheduler": "reserve",
        "block_size": 16,
        "num_gpu_blocks": 2,
        "swap_space": 0.0,
        "watermark": 0.0,
        "cost_model": "unit",
        "max_num_seqs": 3,
        "preemption_mode": "recompute",
        "group_preemption_mode": "recompute",
        "enable_prefix_caching": True,
        "eviction_policy": "lru",
        "enable_chunked_prefill": True,
        "max_num_batched_tokens": 17,
    }
)
# Found by this test: with pinned prefixes on (and nothing shared), a swap-in settled every
# growing sequence, so the cohort's members stopped growing.
@example(
    flat={
        "workload": "lesson",
        "seed": 0,
        "num_requests": None,
        "max_model_len": 48,
        "scheduler": "vllm",
        "block_size": 1,
        "num_gpu_blocks": 48,
        "swap_space": 4.0,
        "watermark": 0.0,
        "cost_model": "unit",
        "max_num_seqs": 3,
        "preemption_mode": "swap",
        "group_preemption_mode": "recompute",
        "enable_pinned_prefixes": True,
    }
)
# Found by this test: under prefix caching with no token ids, a swap-in settled every growing
# sequence though nothing could be cached.
@example(
    flat={
        "workload": "alpaca-like",
        "seed": 0,
        "num_requests": 14,
        "max_model_len": 16,
        "scheduler": "vllm",
        "block_size": 1,
        "num_gpu_blocks": 18,
        "swap_space": 4.0,
        "watermark": 0.0,
        "cost_model": "unit",
        "max_num_seqs": 3,
        "preemption_mode": "swap",
        "group_preemption_mode": "recompute",
        "enable_prefix_caching": True,
        "eviction_policy": "lru",
    }
)
def test_a_config_is_refused_or_runs_whole_and_fast_equals_reference(flat: Flat) -> None:
    check(flat)

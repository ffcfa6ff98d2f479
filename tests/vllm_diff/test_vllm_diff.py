"""pagedkv's vllm-v1 policy against vLLM 0.33's own v1 Scheduler and KVCacheManager, step by
step: the scheduled tokens of every request, the preempted requests, the prefix-hit tokens of
each admission and the blocks in use. Needs vLLM (``make test-vllm`` installs it into its own
environment); skipped where vLLM is not importable, so ``make test`` never needs it.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("vllm.v1.core.sched.scheduler")

from tests.vllm_diff.cases import OPTIONS, random_case, with_option
from tests.vllm_diff.drivers import run_paged, run_vllm

NUM_SEEDS = int(os.environ.get("PAGEDKV_VLLM_DIFF_SEEDS", "200"))


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
@pytest.mark.parametrize("option", OPTIONS)
def test_same_schedule_as_vllm(option: str, async_scheduling: bool) -> None:
    """Every seeded workload, at vLLM's defaults and with one option changed, async
    scheduling on (vLLM's default) and off, schedules the same tokens, preempts the same
    requests, hits the same prefix tokens and uses the same blocks in every step as vLLM."""
    mismatches = []
    steps = 0
    for seed in range(NUM_SEEDS):
        case = with_option(random_case(seed), option, async_scheduling)
        theirs, ours = run_vllm(case), run_paged(case)
        steps += len(theirs)
        if theirs != ours:
            at = next(
                (i for i, (a, b) in enumerate(zip(theirs, ours, strict=False)) if a != b), None
            )
            at = min(len(theirs), len(ours)) if at is None else at
            mismatches.append(f"{case.label()}: first difference at step {at}")
    print(f"{NUM_SEEDS} workloads, {steps} steps compared")
    assert not mismatches, "\n".join(mismatches)

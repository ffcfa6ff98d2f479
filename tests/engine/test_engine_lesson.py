"""The course lesson's workload at equal memory (100 blocks of 16), unit clock."""

from __future__ import annotations

import pytest

from pagedkv.engine.engine import EngineRun
from pagedkv.engine.metrics import summarize
from pagedkv.engine.policies import SCHEDULERS
from pagedkv.engine.request import RequestStatus
from pagedkv.workloads.lesson import LESSON, lesson_workload
from tests.factories import make_engine


def run(scheduler: str, **kw: object) -> EngineRun:
    return make_engine(scheduler, lesson_workload(), trace_steps=True, **kw).run()  # type: ignore[arg-type]


def test_contiguous_slots_holds_at_most_its_slots() -> None:
    result = run("contiguous-slots")
    slots = LESSON.capacity // LESSON.max_seq_len
    assert max(s.num_running for s in result.steps) == slots
    assert all(r.status is RequestStatus.FINISHED for r in result.requests)


def test_greedy_deadlocks_promptly_and_names_the_stuck() -> None:
    result = run("greedy-nopreempt")
    assert result.deadlocked
    unfinished = sorted(r.request_id for r in result.requests if not r.is_finished)
    assert result.stuck == unfinished
    assert unfinished
    # Detected as soon as nobody can move, not by a step cap: fewer iterations than the
    # longest request needs to finish on its own.
    assert result.totals.iterations <= max(r.output_len for r in lesson_workload())


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_vllm_finishes_all_and_beats_fixed_slots(mode: str) -> None:
    result = run("vllm", preemption_mode=mode, num_cpu_blocks=100)
    assert not result.deadlocked
    assert all(r.status is RequestStatus.FINISHED for r in result.requests)
    for step in result.steps:
        allocated = step.token_states + step.reservation + step.internal_fragmentation
        assert step.token_states <= allocated
    slots = run("contiguous-slots")
    assert result.totals.iterations < slots.totals.iterations
    assert result.totals.max_running > slots.totals.max_running


@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
def test_every_policy_conserves_requests(scheduler: str) -> None:
    engine = make_engine(scheduler, lesson_workload(), trace_steps=True)
    result = engine.run()
    ended = [r for r in result.requests if r.is_finished]
    if result.deadlocked:
        assert len(ended) + len(result.stuck) == len(result.requests)
    else:
        assert len(ended) == len(result.requests)
    # the fractions are of the pool the policy runs on (vllm-v1's lacks vLLM's null block)
    capacity = engine.scheduler.kv.capacity
    summary = summarize(result.requests, result.totals, result.sim_time, capacity)
    assert summary["finished"] + summary["rejected"] + len(result.stuck) == summary["num_requests"]
    memory = summary["memory"]
    parts = ["token_states", "reservation", "internal_fragmentation", "external_fragmentation"]
    assert sum(memory[k] for k in [*parts, "free"]) == pytest.approx(1.0)

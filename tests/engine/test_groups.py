"""Parallel sampling: a request of n sequences shares its prompt's blocks, forks after the
prefill, advances in lockstep, is preempted whole, and frees everything when it finishes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.engine.executor import batch_shape
from pagedkv.engine.request import Request, RequestStatus
from pagedkv.engine.scheduler import SchedulerOutput
from pagedkv.memory.manager import KVCacheManager
from pagedkv.workloads.spec import RequestSpec
from tests.engine.test_fast_forward import ROOFLINE, run, same
from tests.factories import BLOCK_SIZES, make_engine


def group(i: int, prompt: int, output: int, n: int, t: float = 0.0) -> RequestSpec:
    return RequestSpec(i, prompt, output, t, n=n)


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("n", [2, 4])
def test_group_forks_shares_the_prompt_and_finishes(block_size: int, n: int) -> None:
    engine = make_engine("vllm", [group(0, 40, 20, n)], block_size=block_size, num_gpu_blocks=200)
    seen_shared = []
    sched = engine.scheduler
    kv = sched.kv
    assert isinstance(kv, KVCacheManager)
    req = engine.requests[0]
    while sched.has_unfinished() or engine.pending:
        engine.admit_arrivals()
        batch = sched.schedule()
        if len(req.seq_ids) == n and req.status is RequestStatus.RUNNING:
            tables = [kv.block_ids(s) for s in req.seq_ids]
            full_prompt_blocks = 40 // block_size
            # every sample shares the prompt's full blocks; what follows is its own
            assert all(t[:full_prompt_blocks] == tables[0][:full_prompt_blocks] for t in tables)
            seen_shared.append(kv.blocks_saved_by_sharing)
        engine.step(batch)
    assert req.status is RequestStatus.FINISHED
    assert len(req.seq_ids) == n
    assert seen_shared
    assert min(seen_shared) >= (n - 1) * (40 // block_size)
    assert kv.num_free_blocks == kv.gpu.num_blocks  # every sequence freed


def test_a_group_decode_costs_n_sequences() -> None:
    engine = make_engine("vllm", [group(0, 10, 5, 3)], num_gpu_blocks=50)
    sched = engine.scheduler
    engine.admit_arrivals()
    engine.step(sched.schedule())  # the prefill: one sequence
    decode: SchedulerOutput = sched.schedule()  # forks, then 3 decodes
    shape = batch_shape(decode)
    assert (shape.num_tokens, shape.num_seqs) == (3, 3)
    assert len(decode.copies) == 2  # all but the last sample copy the shared partial block


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_groups_under_memory_pressure_finish_and_match_the_reference(mode: str) -> None:
    workload = [group(i, 30 + 7 * i, 60, 1 + i % 4, 0.05 * i) for i in range(10)]
    kw = {
        "scheduler": "vllm",
        "block_size": 16,
        "num_gpu_blocks": 40,
        "num_cpu_blocks": 40 if mode == "swap" else 0,
        "preemption_mode": mode,
    }
    ref = run(True, workload, ROOFLINE, **kw)
    fast = run(False, workload, ROOFLINE, **kw)
    same(ref[:4], fast[:4])
    summary = ref[0]
    assert summary["finished"] == 10
    assert summary["preemptions"] > 0
    if mode == "recompute":  # no CPU pool: a preempted forked group restarts its samples
        assert summary["recomputed_tokens"] > 0


@pytest.mark.parametrize("group_mode", ["swap", "recompute"])
def test_group_preemption_mode_chooses_swap_or_restart(group_mode: str) -> None:
    """Single requests recompute; forked groups swap by default (vLLM v0's rule), and with
    group_preemption_mode recompute they restart from the prompt: then nothing is swapped."""
    workload = [group(i, 30 + 7 * i, 60, 1 + i % 4, 0.05 * i) for i in range(10)]
    kw = {
        "scheduler": "vllm",
        "block_size": 16,
        "num_gpu_blocks": 40,
        "num_cpu_blocks": 200,
        "preemption_mode": "recompute",
        "group_preemption_mode": group_mode,
    }
    ref = run(True, workload, ROOFLINE, **kw)
    same(ref[:4], run(False, workload, ROOFLINE, **kw)[:4])
    requests = ref[4].requests
    assert all(r.status is RequestStatus.FINISHED for r in requests)
    groups = [r for r in requests if r.n > 1]
    assert sum(r.num_preemptions for r in groups) > 0
    swaps = sum(r.num_swaps for r in groups)
    assert swaps > 0 if group_mode == "swap" else swaps == 0


def test_reserve_admits_a_group_only_when_all_its_samples_fit() -> None:
    workload = [group(i, 20 + 3 * i, 30, 1 + i % 3) for i in range(8)]
    engine = make_engine("reserve", workload, num_gpu_blocks=30)
    result = engine.run()
    assert not result.deadlocked
    assert all(r.status is RequestStatus.FINISHED for r in result.requests)
    assert result.totals.preemptions == 0


@pytest.mark.parametrize("scheduler", ["orca-oracle", "static", "contiguous-slots"])
def test_contiguous_policies_refuse_groups_with_a_reason(scheduler: str) -> None:
    workload = [group(0, 20, 10, 2), group(1, 20, 10, 1)]
    engine = make_engine(scheduler, workload, num_gpu_blocks=60)
    result = engine.run()
    first, second = result.requests
    assert first.status is RequestStatus.REJECTED
    assert first.reject_reason is not None
    assert "parallel samples" in first.reject_reason
    assert second.status is RequestStatus.FINISHED


def samples_of(req: Request) -> list[list[int]]:
    return [req.outputs_of(s) for s in req.seq_ids]


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("scheduler", ["vllm", "reserve"])
def test_a_group_of_one_output_token_finishes_with_n_samples(scheduler: str, n: int) -> None:
    """Its prefill samples its only token, the one every sample starts with: it finishes
    before any fork would come, and still with n sequences (issue 17, defect 8)."""
    workload = [group(0, 10, 1, n), group(1, 17, 1, n, 0.5), group(2, 5, 3, n, 0.5)]
    kw: dict[str, Any] = {"scheduler": scheduler, "block_size": 4, "num_gpu_blocks": 40}
    ref = run(True, workload, ROOFLINE, **kw)
    same(ref[:4], run(False, workload, ROOFLINE, **kw)[:4])
    for req in ref[4].requests:
        assert req.status is RequestStatus.FINISHED
        assert len(req.seq_ids) == n
        assert len(set(req.seq_ids)) == n


def test_a_group_preempted_by_recompute_before_it_forks_finishes_with_n_samples() -> None:
    """Request 2's first token is sampled, then request 1's fork and growth preempt it before
    its own fork; it counts as a group (its first token is every sample's), so its recompute
    restarts it from the prompt as a forked group's does: it forks after its new first token
    and finishes with both samples."""
    workload = [group(0, 1, 2, 1), group(1, 1, 2, 3), group(2, 1, 2, 2)]
    kw: dict[str, Any] = {
        "scheduler": "vllm",
        "block_size": 4,
        "num_gpu_blocks": 4,
        "num_cpu_blocks": 8,
        "preemption_mode": "recompute",
    }
    ref = run(True, workload, ROOFLINE, **kw)
    same(ref[:4], run(False, workload, ROOFLINE, **kw)[:4])
    requests = ref[4].requests
    assert requests[2].num_preemptions > 0  # the case this test is about did happen
    for req in requests:
        assert req.status is RequestStatus.FINISHED
        assert len(req.seq_ids) == req.n


@settings(max_examples=40, deadline=None)
@given(
    specs=st.lists(
        st.tuples(st.integers(1, 30), st.integers(1, 4), st.integers(1, 3), st.integers(0, 3)),
        min_size=1,
        max_size=8,
    ),
    blocks=st.integers(4, 16),
    mode=st.sampled_from(["recompute", "swap"]),
    group_mode=st.sampled_from(["recompute", "swap"]),
)
def test_every_finished_group_has_n_samples(
    specs: list[tuple[int, int, int, int]], blocks: int, mode: str, group_mode: str
) -> None:
    """Under any memory pressure and preemption mode: n sequences each, fast = reference."""
    workload = [group(i, p, o, n, 0.1 * t) for i, (p, o, n, t) in enumerate(specs)]
    kw: dict[str, Any] = {
        "scheduler": "vllm",
        "block_size": 4,
        "num_gpu_blocks": blocks,
        "num_cpu_blocks": 8,
        "preemption_mode": mode,
        "group_preemption_mode": group_mode,
    }
    ref = run(True, workload, ROOFLINE, **kw)
    same(ref[:4], run(False, workload, ROOFLINE, **kw)[:4])
    for req in ref[4].requests:
        if req.status is RequestStatus.FINISHED:
            assert len(req.seq_ids) == req.n

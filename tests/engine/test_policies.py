"""Each scheduling policy does what its docstring promises."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from pagedkv.engine.executor import StepResult
from pagedkv.engine.request import RequestStatus
from pagedkv.engine.scheduler import SchedulerOutput
from pagedkv.workloads.spec import RequestSpec
from tests.engine.test_fast_forward import workloads
from tests.factories import make_engine


def squeeze(n: int = 12, prompt: int = 40, output: int = 120) -> list[RequestSpec]:
    """More requests than fit at once at their final length, all at t = 0."""
    return [RequestSpec(i, prompt, output, 0.0) for i in range(n)]


@pytest.mark.parametrize("bs", [1, 16, 7])
def test_vllm_preempts_the_latest_arrival_by_recompute(bs: int) -> None:
    engine = make_engine(
        "vllm", squeeze(), num_gpu_blocks=600 // bs, block_size=bs, trace_steps=True
    )
    result = engine.run()
    assert result.totals.preemptions > 0
    preempted = [r for r in result.requests if r.num_preemptions]
    spared = [r for r in result.requests if not r.num_preemptions]
    # Victims are the most recently arrived: every preempted request arrived after the first one.
    assert min(r.request_id for r in preempted) > min(r.request_id for r in spared)
    assert sum(r.num_recomputed_tokens for r in result.requests) > 0
    assert all(r.status is RequestStatus.FINISHED for r in result.requests)


def test_vllm_swap_mode_swaps_and_resumes() -> None:
    engine = make_engine(
        "vllm", squeeze(), num_gpu_blocks=38, num_cpu_blocks=200, preemption_mode="swap"
    )
    result = engine.run()
    assert result.totals.swap_outs > 0
    assert result.totals.swapped_blocks > 0
    assert sum(r.num_swaps for r in result.requests) == result.totals.swap_outs
    assert sum(r.num_recomputed_tokens for r in result.requests) == 0
    assert all(r.status is RequestStatus.FINISHED for r in result.requests)


def test_swap_without_cpu_room_falls_back_to_recompute() -> None:
    engine = make_engine(
        "vllm", squeeze(), num_gpu_blocks=38, num_cpu_blocks=0, preemption_mode="swap"
    )
    result = engine.run()
    assert result.totals.preemptions > 0
    assert result.totals.swap_outs == 0
    assert engine.scheduler.num_swap_fallbacks == result.totals.preemptions


@pytest.mark.parametrize(
    "scheduler", ["reserve", "orca-max", "orca-pow2", "orca-oracle", "contiguous-slots", "static"]
)
def test_reserving_policies_never_preempt(scheduler: str) -> None:
    result = make_engine(scheduler, squeeze(), num_gpu_blocks=38).run()
    assert result.totals.preemptions == 0
    assert all(r.status is RequestStatus.FINISHED for r in result.requests)


def test_chunked_prefill_keeps_every_iteration_within_the_budget() -> None:
    workload = [RequestSpec(i, 200, 30, 0.0) for i in range(6)]
    engine = make_engine(
        "vllm",
        workload,
        chunked=True,
        max_num_batched_tokens=256,
        trace_steps=True,
        num_gpu_blocks=200,
    )
    result = engine.run()
    assert max(s.num_batched_tokens for s in result.steps) <= 256
    assert any(s.num_batched_tokens == 256 for s in result.steps)  # the budget is used
    assert all(r.status is RequestStatus.FINISHED for r in result.requests)


def test_static_returns_a_batch_together() -> None:
    workload = [RequestSpec(i, 10, 5 + 10 * i, 0.0) for i in range(4)]
    result = make_engine("static", workload, num_gpu_blocks=16 * 4).run()
    finishes = {r.finish_time for r in result.requests}
    assert len(finishes) == 1  # every request of the batch ends with its longest


def test_requests_that_can_never_fit_are_rejected_with_a_reason() -> None:
    workload = [
        RequestSpec(0, 200, 100, 0.0),  # longer than max_model_len 256
        RequestSpec(1, 10, 10, 0.0),
        RequestSpec(2, 100, 150, 0.0),  # fits the model, not the 8-block cache
    ]
    result = make_engine("vllm", workload, num_gpu_blocks=8, block_size=16).run()
    status = {r.request_id: r for r in result.requests}
    assert status[0].status is RequestStatus.REJECTED
    assert "max_model_len" in (status[0].reject_reason or "")
    assert status[2].status is RequestStatus.REJECTED
    assert "KV cache" in (status[2].reject_reason or "")
    assert status[1].status is RequestStatus.FINISHED


def test_arrivals_in_the_future_wait_for_their_time() -> None:
    workload = [RequestSpec(0, 10, 3, 0.0), RequestSpec(1, 10, 3, 50.0)]
    result = make_engine("vllm", workload).run()
    late = result.requests[1]
    assert late.admitted_time is not None
    assert late.admitted_time >= 50.0
    assert late.first_token_time is not None
    assert late.first_token_time > 50.0


@settings(max_examples=40, deadline=None)
@given(
    workload=workloads(),
    block_size=st.sampled_from([1, 4, 16]),
    blocks_tokens=st.integers(290, 700),
    chunked=st.booleans(),
)
def test_a_resumed_request_is_never_swapped_straight_back_out(
    workload: list[RequestSpec], block_size: int, blocks_tokens: int, chunked: bool
) -> None:
    """Swap-in leaves room for the request's next step: no iteration both brings a block in
    and sends it back out (which would move it twice for nothing)."""
    engine = make_engine(
        "vllm",
        workload,
        block_size=block_size,
        num_gpu_blocks=blocks_tokens // block_size,
        num_cpu_blocks=256,
        preemption_mode="swap",
        chunked=chunked,
        max_num_batched_tokens=512 if chunked else None,
        reference=True,
    )
    execute = engine.executor.execute
    bounced = 0

    def watching(batch: SchedulerOutput) -> StepResult:
        nonlocal bounced
        came_in = {m.dst for m in batch.swap_in}
        bounced += len(came_in & {m.src for m in batch.swap_out})
        return execute(batch)

    engine.executor.execute = watching  # type: ignore[method-assign]
    result = engine.run()
    assert not result.deadlocked
    assert bounced == 0

"""A request that a real model stops early (its executor reports a stop token, EOS) finishes in
that step and frees its blocks, shorter than its output_len. Differential, on random workloads
under the vllm policy with preemption (recompute and swap) and chunked prefill: a run where
request r stops after k tokens is the run where r's output_len is k, step for step (the policy
never reads output_len to schedule); and every metric counts the k tokens."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.engine.clock import TICKS_PER_SECOND
from pagedkv.engine.engine import EngineRun
from pagedkv.engine.executor import StepResult
from pagedkv.engine.scheduler import SchedulerOutput
from pagedkv.workloads.spec import RequestSpec
from tests.factories import make_engine


class StopAt:
    """A unit-clock executor that reports request r stopped when it samples its k-th token."""

    def __init__(self, stop_at: dict[int, int]) -> None:
        self.stop_at = stop_at

    def execute(self, batch: SchedulerOutput) -> StepResult:
        stopped = frozenset(
            c.request.request_id
            for c in batch.chunks
            if c.num_cached_tokens + c.num_new_tokens == c.request.num_tokens
            and self.stop_at.get(c.request.request_id) == c.request.num_output_tokens + 1
        )
        return StepResult(TICKS_PER_SECOND, None, stopped)  # the unit clock's step


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[RequestSpec], dict[int, int], dict[str, Any]]:
    n = draw(st.integers(1, 8))
    specs = [
        RequestSpec(
            i,
            draw(st.integers(1, 20)),
            draw(st.integers(1, 12)),
            arrival_time=float(draw(st.integers(0, 5))),
        )
        for i in range(n)
    ]
    stop_at = {
        s.request_id: draw(st.integers(1, s.output_len)) for s in specs if draw(st.booleans())
    }
    options: dict[str, Any] = {
        "num_gpu_blocks": draw(st.integers(8, 24)),
        "block_size": 4,
        "num_cpu_blocks": 64,
        "preemption_mode": draw(st.sampled_from(["recompute", "swap"])),
        "watermark": 0.0,
    }
    if draw(st.booleans()):
        options.update(chunked=True, max_num_batched_tokens=8, max_num_seqs=8)
    return specs, stop_at, options


def _run(specs: list[RequestSpec], stop_at: dict[int, int], options: dict[str, Any]) -> EngineRun:
    engine = make_engine("vllm", specs, reference=True, **options)
    engine.executor = StopAt(stop_at)
    return engine.run()


@settings(max_examples=60, deadline=None)
@given(case=cases())
def test_stopping_early_is_running_a_shorter_request(
    case: tuple[list[RequestSpec], dict[int, int], dict[str, Any]],
) -> None:
    specs, stop_at, options = case
    stopped = _run(specs, stop_at, options)
    shorter = [replace(s, output_len=stop_at.get(s.request_id, s.output_len)) for s in specs]
    planned = _run(shorter, {}, options)
    assert not stopped.deadlocked
    assert stopped.totals.iterations == planned.totals.iterations
    for a, b in zip(stopped.requests, planned.requests, strict=True):
        assert a.request_id == b.request_id
        assert a.num_output_tokens == a.output_len == b.output_len
        assert (a.first_token_time, a.finish_time) == (b.first_token_time, b.finish_time)
        assert a.num_preemptions == b.num_preemptions


def test_without_stops_nothing_changes() -> None:
    specs = [RequestSpec(i, 5 + i, 4) for i in range(4)]
    run = _run(specs, {}, {"num_gpu_blocks": 16, "block_size": 4})
    assert [r.num_output_tokens for r in run.requests] == [4, 4, 4, 4]

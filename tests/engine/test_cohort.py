"""The decode cohort: runs through finishes and arrivals, equal to stepping every round."""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
from hypothesis import given, settings

from pagedkv.engine.batch_shape import BatchShape
from pagedkv.engine.clock import TICKS_PER_SECOND
from pagedkv.engine.cost_model import CostModel
from pagedkv.engine.engine import Engine
from pagedkv.engine.policies import SCHEDULERS
from pagedkv.engine.windows import WindowCurve
from pagedkv.memory.manager import KVCacheManager
from pagedkv.workloads.spec import RequestSpec
from tests.engine.test_fast_forward import ROOFLINE, both_equal, run, same
from tests.factories import make_engine


@st.composite
def loads(
    draw: st.DrawFn, count: tuple[int, int], gaps: list[float], max_prompt: int
) -> list[RequestSpec]:
    """``count`` requests, each ``gaps`` (drawn) after the last, prompts up to ``max_prompt``
    and outputs to 250 tokens in all, some of them done by their prefill (one output token)."""
    n = draw(st.integers(*count))
    t = 0.0
    out = []
    for i in range(n):
        t += draw(st.sampled_from(gaps))
        prompt = draw(st.integers(1, max_prompt))
        output = draw(st.one_of(st.just(1), st.integers(1, 250 - prompt)))
        out.append(RequestSpec(i, prompt, output, t))
    return out


def staggered_loads() -> st.SearchStrategy[list[RequestSpec]]:
    """Requests that arrive and finish at many different rounds while others decode."""
    return loads((2, 20), [0.0, 0.0, 0.02, 0.2, 1.0, 4.0], 100)


@settings(max_examples=80, deadline=None)
@given(
    workload=staggered_loads(),
    scheduler=st.sampled_from([s for s in sorted(SCHEDULERS) if not s.startswith(("orca", "f"))]),
    block_size=st.sampled_from([1, 16, 5]),
    blocks_tokens=st.integers(300, 3000),
    mode=st.sampled_from(["recompute", "swap"]),
    max_num_seqs=st.sampled_from([None, None, 3]),
    watermark=st.sampled_from([0.0, 0.01, 0.2]),
)
def test_cohorts_equal_the_reference(
    workload: list[RequestSpec],
    scheduler: str,
    block_size: int,
    blocks_tokens: int,
    mode: str,
    max_num_seqs: int | None,
    watermark: float,
) -> None:
    """Tight memory (cohorts end at the round whose blocks do not fit), a cap on running
    requests and a watermark (admission inside a cohort refused: it ends), one-token outputs
    (done at their prefill): the whole run, every request's record, equals the reference."""
    both_equal(
        workload,
        ROOFLINE,
        scheduler,
        block_size,
        blocks_tokens,
        mode,
        max_model_len=256,
        max_num_seqs=max_num_seqs,
        watermark=watermark,
    )


def count_schedules(engine: Engine) -> list[int]:
    """Count the scheduler's own rounds (``schedule`` calls) of a run to come."""
    calls = [0]
    schedule = engine.scheduler.schedule

    def counted() -> Any:
        calls[0] += 1
        return schedule()

    engine.scheduler.schedule = counted  # type: ignore[method-assign]
    return calls


def test_one_cohort_runs_through_every_arrival_and_finish() -> None:
    """Staggered arrivals in ample memory, with an idle gap: the scheduler runs only the first
    admission round; every later arrival is admitted inside the cohort (through
    ``plan_round``), and the run equals the reference."""
    workload = [RequestSpec(i, 30, 100 + 37 * i, 0.4 * i) for i in range(10)]
    workload.append(RequestSpec(10, 30, 50, 1000.0))  # long after every other has finished
    kw: dict[str, Any] = {"num_gpu_blocks": 400, "max_model_len": 512}
    engine = make_engine("vllm", workload, cost=ROOFLINE, **kw)
    calls = count_schedules(engine)
    result = engine.run()
    assert calls[0] == 1
    assert all(r.num_preemptions == 0 for r in result.requests)
    ref = run(True, workload, ROOFLINE, scheduler="vllm", **kw)
    same(ref[:4], run(False, workload, ROOFLINE, scheduler="vllm", **kw)[:4])


def test_cost_grows_with_events_not_tokens() -> None:
    """Ten times longer outputs: ten times the rounds, the same number of windows (one ends at
    each arrival and each finish)."""
    windows, rounds = [], []
    for scale in (1, 10):
        workload = [RequestSpec(i, 20, 100 * scale + 13 * i, 0.05 * i) for i in range(8)]
        engine = make_engine(
            "vllm", workload, num_gpu_blocks=2000, max_model_len=4096, cost=ROOFLINE
        )
        engine.run()
        ff = engine.fast_forward
        assert ff is not None
        windows.append(ff.windows)
        rounds.append(ff.rounds)
    assert rounds[1] > 4 * rounds[0]
    assert windows[0] == windows[1] <= 2 * 8


def test_memory_freed_by_a_finish_lets_the_cohort_go_on() -> None:
    """15 blocks of 16: the long request's growth (14 blocks) and the short one's (2) only fit
    because the short one finishes first and frees its blocks: no preemption, one scheduler
    round (the admission), and the run equals the reference."""
    workload = [RequestSpec(0, 16, 16, 0.0), RequestSpec(1, 16, 200, 0.0)]
    kw: dict[str, Any] = {"scheduler": "vllm", "num_gpu_blocks": 15, "watermark": 0.0}
    engine = make_engine("vllm", workload, num_gpu_blocks=15, watermark=0.0, cost=ROOFLINE)
    calls = count_schedules(engine)
    result = engine.run()
    assert all(r.num_preemptions == 0 for r in result.requests)
    assert calls[0] == 1
    same(run(True, workload, ROOFLINE, **kw)[:4], run(False, workload, ROOFLINE, **kw)[:4])


def test_a_cohort_stops_before_the_round_that_needs_a_preemption() -> None:
    """Two long requests in too little memory: the cohort ends just before the round whose new
    block does not fit, the scheduler preempts (recompute), and the run equals the
    reference."""
    workload = [RequestSpec(0, 16, 200, 0.0), RequestSpec(1, 16, 200, 0.0)]
    kw: dict[str, Any] = {"scheduler": "vllm", "num_gpu_blocks": 16, "watermark": 0.0}
    ref = run(True, workload, ROOFLINE, **kw)
    fast = run(False, workload, ROOFLINE, **kw)
    assert ref[0]["preemptions"] >= 1
    same(ref[:4], fast[:4])


class CrossingCost(CostModel):
    """Step time max(1 s, 2 ms x K/V tokens read), in ticks: the two lines cross at 500
    tokens, so windows that grow past it hold the switch (``WindowCurve.split``) that the
    closed forms handle apart."""

    lines = ((TICKS_PER_SECOND, 0), (0, TICKS_PER_SECOND // 500))

    def step_ticks(self, shape: BatchShape) -> int:
        return max(a + b * shape.kv_read_tokens for a, b in self.lines)

    def swap_ticks(self, num_blocks: int) -> int:
        return 0

    def curve(self, base: BatchShape, delta: BatchShape) -> WindowCurve:
        f, g = ((a + b * base.kv_read_tokens, b * delta.kv_read_tokens) for a, b in self.lines)
        return WindowCurve(*f, *g, 0, 0)


@settings(max_examples=40, deadline=None)
@given(workload=staggered_loads(), block_size=st.sampled_from([1, 16, 5]))
def test_cohorts_equal_the_reference_across_a_switch_of_lines(
    workload: list[RequestSpec], block_size: int
) -> None:
    kw: dict[str, Any] = {
        "scheduler": "vllm",
        "block_size": block_size,
        "num_gpu_blocks": 1500 // block_size,
        "max_model_len": 256,
    }
    cost = CrossingCost()
    assert isinstance(cost, CostModel)
    same(run(True, workload, cost, **kw)[:4], run(False, workload, cost, **kw)[:4])


def test_the_books_hold_at_every_event_of_a_cohort() -> None:
    """The engine's integrity hook checks the memory at every window's end, admission and
    finish of a cohort (the Hypothesis runs above go through it); the books are exact there,
    growth included: the free blocks are what the pool holds beyond what growth took."""
    workload = [RequestSpec(i, 30, 60 + 29 * i, 0.3 * i) for i in range(8)]
    engine = make_engine("vllm", workload, cost=ROOFLINE, num_gpu_blocks=300, max_model_len=512)
    kv = engine.scheduler.kv
    assert isinstance(kv, KVCacheManager)
    seen: list[tuple[int, int]] = []
    check = kv.check_integrity

    def checked() -> None:
        check()
        seen.append((kv.num_free_blocks, kv.gpu.num_free))

    kv.check_integrity = checked  # type: ignore[method-assign]
    engine.run()
    ff = engine.fast_forward
    assert ff is not None
    assert ff.windows > 0
    assert len(seen) >= ff.windows + len(workload)  # every window, and every finish
    assert any(exact < pool for exact, pool in seen)  # growth held blocks not chosen yet

"""Windows through finishes: the timeline's sums, and the engine against stepping every round."""

from __future__ import annotations

import math
from typing import Any

import hypothesis.strategies as st
from hypothesis import given, settings

from pagedkv.engine import through_finishes
from pagedkv.engine.batch_shape import BatchShape
from pagedkv.engine.policies import SCHEDULERS
from pagedkv.workloads.spec import RequestSpec
from tests.engine.test_fast_forward import ROOFLINE, run, same


@settings(max_examples=60, deadline=None)
@given(
    segments=st.lists(
        st.tuples(st.integers(1, 40), st.integers(1, 30), st.integers(0, 5000)),
        min_size=1,
        max_size=5,
    ),
    data=st.data(),
)
def test_timeline_sums_equal_round_by_round_sums(
    segments: list[tuple[int, int, int]], data: st.DataObject
) -> None:
    """T(x), M(x) and the start time of a round, summed in closed form per segment, equal the
    sums of the step times one round at a time."""
    timeline = through_finishes.Timeline()
    durations: list[float] = []  # d_i of round i = 1..
    start = 0
    for length, alive, context in segments:
        curve = ROOFLINE.curve(
            BatchShape(alive, alive, context + alive, context + alive),
            BatchShape.decode_growth(alive),
        )
        timeline.add(start, length, curve, alive)
        durations += [curve.sums(j + 1)[0] - curve.sums(j)[0] for j in range(length)]
        start += length
    assert math.isclose(timeline.end_time, sum(durations), rel_tol=1e-12)
    moment = sum((i + 1) * d for i, d in enumerate(durations))
    assert math.isclose(timeline.m0[-1], moment, rel_tol=1e-12)
    rounds = data.draw(st.lists(st.integers(1, start), max_size=30))
    weights = data.draw(st.lists(st.integers(1, 9), min_size=len(rounds), max_size=len(rounds)))
    befores = [sum(durations[: i - 1]) for i in rounds]
    got = timeline.sum_times_before(rounds)
    assert math.isclose(got, sum(befores), rel_tol=1e-9, abs_tol=1e-12)
    got = timeline.sum_times_before(rounds, weights)
    want = sum(w * t for w, t in zip(weights, befores, strict=True))
    assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)


@st.composite
def finishing_loads(draw: st.DrawFn) -> list[RequestSpec]:
    """Requests that finish at many different rounds while others decode."""
    n = draw(st.integers(2, 20))
    t = 0.0
    out = []
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.2, 1.0, 4.0]))
        prompt = draw(st.integers(1, 100))
        out.append(RequestSpec(i, prompt, draw(st.integers(1, 250 - prompt)), t))
    return out


@settings(max_examples=60, deadline=None)
@given(
    workload=finishing_loads(),
    scheduler=st.sampled_from([s for s in sorted(SCHEDULERS) if not s.startswith(("orca", "f"))]),
    block_size=st.sampled_from([1, 16, 5]),
    blocks_tokens=st.integers(300, 3000),
    mode=st.sampled_from(["recompute", "swap"]),
)
def test_windows_through_finishes_equal_the_reference(
    workload: list[RequestSpec], scheduler: str, block_size: int, blocks_tokens: int, mode: str
) -> None:
    kw: dict[str, Any] = {
        "scheduler": scheduler,
        "block_size": block_size,
        "num_gpu_blocks": blocks_tokens // block_size,
        "num_cpu_blocks": 64,
        "preemption_mode": mode,
        "max_model_len": 256,
    }
    ref = run(True, workload, ROOFLINE, **kw)
    fast = run(False, workload, ROOFLINE, **kw)
    same(ref[:4], fast[:4])


def test_one_window_runs_through_every_finish() -> None:
    """Eight requests at once with different lengths: after the admission round a single window
    finishes all of them (eight finishes, one window), and the run equals the reference."""
    workload = [RequestSpec(i, 20, 40 + 17 * i, 0.0) for i in range(8)]
    kw: dict[str, Any] = {"scheduler": "vllm", "num_gpu_blocks": 200, "max_model_len": 256}
    fast = run(False, workload, ROOFLINE, **kw)
    ff = fast[4].fast_forward
    assert ff is not None
    assert ff.windows == 1
    same(run(True, workload, ROOFLINE, **kw)[:4], fast[:4])


def test_memory_freed_by_a_finish_lets_the_window_go_on() -> None:
    """15 blocks of 16: the long request's growth (14 blocks) and the short one's (2) only fit
    because the short one finishes first and frees its blocks. One window, no preemption, and
    the run equals the reference."""
    workload = [RequestSpec(0, 16, 16, 0.0), RequestSpec(1, 16, 200, 0.0)]
    kw: dict[str, Any] = {"scheduler": "vllm", "num_gpu_blocks": 15, "watermark": 0.0}
    fast = run(False, workload, ROOFLINE, **kw)
    requests, engine = fast[4].requests, fast[4]
    assert all(r.num_preemptions == 0 for r in requests)
    assert engine.fast_forward is not None
    assert engine.fast_forward.windows == 1
    same(run(True, workload, ROOFLINE, **kw)[:4], fast[:4])

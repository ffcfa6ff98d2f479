"""The profile's timer: round-robin passes over every point, each point's median over them
(a synthetic clock: no timing assertions, the times are the clock's own)."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from pagedkv.tensors.profile_ops import MAX_PASSES, MIN_PASSES, Timer


class DriftingClock:
    """A clock each registered call advances by its cost, times ``slow`` for the calls whose
    index falls in ``window`` (a minute in which the machine runs slow)."""

    def __init__(self, window: range, slow: float) -> None:
        self.now, self.calls, self.window, self.slow = 0.0, 0, window, slow

    def __call__(self) -> float:
        return self.now

    def run(self, cost: float) -> None:
        factor = self.slow if self.calls in self.window else 1.0
        self.now += cost * factor
        self.calls += 1


@settings(max_examples=80, deadline=None)
@given(
    costs=st.lists(st.floats(1e-6, 1e-3), min_size=1, max_size=12),
    budget=st.floats(1e-5, 1.0),
    start=st.integers(0, 400),
    length=st.integers(0, 12),
    slow=st.floats(1.5, 10.0),
)
def test_a_slow_spell_shorter_than_a_pass_moves_no_median(
    costs: list[float], budget: float, start: int, length: int, slow: float
) -> None:
    """A spell of slow calls no longer than one pass falls on each point at most once, and
    every point has at least 3 timed passes: each median is its cost, as if the machine had
    not slowed. (Timed one point at a time, a spell of 3 calls would move a point's median.)"""
    length = min(length, len(costs))
    clock = DriftingClock(range(start, start + length), slow)
    totals: list[int] = []
    timer = Timer(clock, budget, per_point_s=10.0, tick=totals.append, flush=lambda: None)
    points = [timer(lambda c=c: clock.run(c), "term") for c in costs]  # type: ignore[misc]
    passes = timer.run()
    assert MIN_PASSES <= passes <= MAX_PASSES
    assert len(totals) == totals[-1] == len(costs) * (1 + passes)
    for point, cost in zip(points, costs, strict=True):
        assert len(point.samples) == passes
        # the warm-up pass is not a sample; the spell may fall on it
        assert point.value == pytest.approx(cost, rel=1e-6)  # the float clock's rounding
    spreads = timer.spreads()["term"]
    assert spreads["runs"] == [passes] * len(costs)
    assert all(s >= 0 for s in spreads["spread"])


def test_the_passes_fill_the_budget_and_a_costly_point_runs_once() -> None:
    clock = DriftingClock(range(0), 1.0)
    cost = 2.0**-7  # binary fractions: the float clock's sums are exact
    timer = Timer(clock, 100 * cost, per_point_s=0.05, tick=lambda total: None, flush=lambda: None)
    cheap = [timer(lambda: clock.run(cost), "a") for _ in range(10)]
    costly = timer(lambda: clock.run(0.5), "b")
    passes = timer.run()
    assert passes == 10  # the budget over the cheap points' timed 10 x cost a pass
    assert [len(p.samples) for p in cheap] == [10] * 10
    assert costly.samples == [0.5]  # its warm-up spent its share: its only timing
    assert timer.spreads()["b"] == {"runs": [1], "spread": [0.0]}


def test_each_timing_follows_a_lead_run_of_its_point_then_the_flush() -> None:
    """A real step follows a step of its own kind: every timed run comes after an untimed run
    of the same point and then the flush (the warm-up pass: the flush alone)."""
    events: list[str] = []
    now = [0.0]

    def run(name: str, cost: float) -> None:
        events.append(name)
        now[0] += cost

    timer = Timer(lambda: now[0], 1.0, 10.0, lambda total: None, lambda: events.append("flush"))
    a = timer(lambda: run("a", 0.1), "t")
    timer(lambda: run("b", 0.2), "t")
    assert timer.run() == 3  # 1 s over the timed 0.3 s a pass
    assert events[:4] == ["flush", "a", "flush", "b"]
    assert events[4:] == ["a", "flush", "a", "b", "flush", "b"] * 3
    assert a.samples == pytest.approx([0.1] * 3)  # the lead runs are not timed


def test_each_point_runs_its_own_shape() -> None:
    """Points are registered in a loop and run later: each must run the shape it was
    registered at (a closure over the loop's variables would run them all at the last)."""
    import torch

    from pagedkv.tensors.profile_config import ProfileConfig
    from pagedkv.tensors.profile_ops import OperatorBench, _dense_grid, whole_step_tokens

    cfg = ProfileConfig(model="tiny-llama", budget_s=0.1, max_tokens=40, max_seqs=6)
    bench = OperatorBench(cfg, torch.device("cpu"), lambda: 0.0, lambda total: None)
    bench.linear_and_embedding()
    bench.lm_head()
    bench.whole_steps()
    rows: dict[str, list[int]] = {}
    for p in bench.timer.points:
        out = p.fn()
        assert isinstance(out, torch.Tensor)
        rows.setdefault(p.group, []).append(out.shape[0])
    assert rows["linear"] == _dense_grid(40)
    assert rows["lm_head"] == _dense_grid(6)
    decodes, prefills = whole_step_tokens(cfg, bench.max_len)
    assert rows["whole_steps"] == [*decodes, *[1] * len(prefills)]  # a prefill's last row

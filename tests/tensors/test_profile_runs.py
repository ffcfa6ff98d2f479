"""The real runs ``profile`` and ``fidelity`` share: ``Repeated`` times a step again without
changing what it computes (differential against a single run, token for token), reports the
median of its timings, and runs a step that swaps or copies blocks once."""

from __future__ import annotations

import itertools
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from pagedkv.engine.clock import to_ticks
from pagedkv.engine.config import SchedulerConfig
from pagedkv.engine.executor import StepResult
from pagedkv.engine.scheduler import SchedulerOutput
from pagedkv.tensors.executor import TorchExecutor, build_real_engine
from pagedkv.tensors.model import Decoder
from pagedkv.tensors.model_shapes import resolve_model
from pagedkv.tensors.profile_runs import Recorder, Repeated, workload

MODEL = Decoder.random(resolve_model("tiny-llama", "float32")[0], seed=0)


def _run(repeats: int, preemption: str, blocks: int, chunked: bool) -> tuple[Any, list[Any]]:
    specs = workload(6, MODEL.config.vocab_size, (8, 24), (16, 24), 0.0, seed=3)
    sched = SchedulerConfig(
        max_model_len=MODEL.config.max_position,
        preemption_mode=preemption,  # type: ignore[arg-type]
        enable_chunked_prefill=chunked,
        max_num_batched_tokens=32 if chunked else None,
        max_num_seqs=8,
    )
    engine = build_real_engine(
        MODEL, specs, num_gpu_blocks=blocks, block_size=4, num_cpu_blocks=64, scheduler=sched
    )
    assert isinstance(engine.executor, TorchExecutor)
    recorder = Recorder(Repeated(engine.executor, repeats))
    engine.executor = recorder
    run = engine.run()
    outputs = [[r.outputs_of(s) for s in r.seq_ids] for r in run.requests]
    return outputs, [(shape, swapped) for shape, swapped, _ in recorder.steps]


@pytest.mark.parametrize(
    ("preemption", "blocks", "chunked"),
    [("recompute", 64, False), ("recompute", 14, False), ("swap", 14, False), ("swap", 14, True)],
)
def test_repeated_steps_compute_what_one_run_computes(
    preemption: str, blocks: int, chunked: bool
) -> None:
    once = _run(1, preemption, blocks, chunked)
    if preemption == "swap":  # the memory binds: some steps swap (and run once)
        assert any(swapped for _, swapped in once[1])
    assert _run(3, preemption, blocks, chunked) == once


class _Counting:
    """A fake executor whose step i of a batch takes the next of ``durations``."""

    def __init__(self, durations: list[float]) -> None:
        self.durations = itertools.cycle(durations)
        self.calls = 0

    def execute(self, batch: SchedulerOutput) -> StepResult:
        self.calls += 1
        return StepResult.measured(next(self.durations), {self.calls: 0})


@settings(max_examples=50, deadline=None)
@given(
    durations=st.lists(st.floats(1e-6, 1.0), min_size=1, max_size=7),
    swaps=st.booleans(),
)
def test_repeated_reports_the_median_and_the_first_result(
    durations: list[float], swaps: bool
) -> None:
    from pagedkv.memory.interface import SwapMapping

    inner = _Counting(durations)
    batch = SchedulerOutput(swap_out=[SwapMapping(0, 0)] if swaps else [])
    result = Repeated(inner, len(durations)).execute(batch)
    assert result.sampled == {1: 0}  # the first run's result
    ticks = [to_ticks(d) for d in durations]  # each measured duration, rounded once
    if swaps:  # its copies are not rerun
        assert inner.calls == 1
        assert result.ticks == ticks[0]
    else:
        assert inner.calls == len(durations)
        # a median: at most half of the runs on either side of it
        assert sum(t < result.ticks for t in ticks) <= len(ticks) // 2
        assert sum(t > result.ticks for t in ticks) <= len(ticks) // 2

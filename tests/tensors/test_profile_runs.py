"""The real runs ``profile`` and ``fidelity`` share: ``Repeated`` times a step again without
changing what it computes (differential against a single run, token for token), reports the
median of its timings, and times a step that swaps or copies blocks as often, its cache put back
between the runs (differential: a preempting run with swaps, repeated, computes what one run
does)."""

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
    if preemption == "swap":  # the memory binds: some steps swap (each rerun from a snapshot)
        assert any(swapped for _, swapped in once[1])
    assert _run(3, preemption, blocks, chunked) == once


class _Counting:
    """A fake executor whose step i of a batch takes the next of ``durations``; its cache's
    one block gains 1 at every swap, which ``Repeated`` must undo before a run after the first."""

    def __init__(self, durations: list[float]) -> None:
        from pagedkv.tensors.kv_cache import PagedKVCache

        self.durations = itertools.cycle(durations)
        self.calls = 0
        self.cache = PagedKVCache(1, 1, 1, 1, 1, num_cpu_blocks=1)
        self.seen: list[float] = []  # the block's value as each run found it

    def execute(self, batch: SchedulerOutput) -> StepResult:
        self.calls += 1
        block = self.cache.k_caches[0]
        self.seen.append(float(block.sum()))
        if batch.swap_out:
            block += 1
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
    assert inner.calls == len(durations)  # a step that swaps is timed as often
    # a median: at most half of the runs on either side of it
    assert sum(t < result.ticks for t in ticks) <= len(ticks) // 2
    assert sum(t > result.ticks for t in ticks) <= len(ticks) // 2
    # every run of a swapping step found the cache as the first did; one run's change is kept
    assert inner.seen == [0.0] * len(durations)
    assert float(inner.cache.k_caches[0].sum()) == (1.0 if swaps else 0.0)


def _sim_engine(executor: Any, seed: int, rate: float, bs: int, swap: bool, prefix: bool) -> Any:
    from pagedkv.engine.engine import Engine
    from pagedkv.engine.policies import SCHEDULERS
    from pagedkv.memory.config import CacheConfig

    specs = workload(10, 500, (4, 40), (2, 20), rate, seed, shared_prefix=8 if prefix else 0)
    sched = SchedulerConfig(
        max_model_len=256,
        preemption_mode="swap" if swap else "recompute",  # type: ignore[arg-type]
        enable_chunked_prefill=prefix,
        max_num_batched_tokens=64 if prefix else None,
        max_num_seqs=8,
    )
    cache = CacheConfig(
        num_gpu_blocks=-(-160 // bs), block_size=bs, num_cpu_blocks=64, enable_prefix_caching=prefix
    )
    policy = SCHEDULERS["vllm"]
    return Engine(policy(sched, policy.make_allocator(cache, sched)), executor, specs)


def _roofline(bs: int) -> Any:
    from pagedkv.tensors.profile_runs import roofline_of

    spec = resolve_model("tiny-llama", "float32")[1]
    rates = {"matmul_flops": 1e10, "read_bandwidth": 1e10, "copy_bandwidth": 1e9}
    return roofline_of(rates, spec, bs, 1e-4)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    rate=st.sampled_from([0.0, 50.0, 500.0]),
    bs=st.sampled_from([1, 4, 16]),
    swap=st.booleans(),
    prefix=st.booleans(),
)
def test_replay_of_a_run_reproduces_it_to_the_tick(
    seed: int, rate: float, bs: int, swap: bool, prefix: bool
) -> None:
    """Differential: a run priced by a cost model (each step's time a function of its shape and
    swaps) replayed on the same workload takes every step's recorded ticks, so it schedules and
    finishes every request at the same tick; a replay of nothing is the cost model itself."""
    from pagedkv.engine.executor import SimExecutor
    from pagedkv.tensors.profile_runs import Replay

    cost = _roofline(bs)
    first = Recorder(SimExecutor(cost))
    run = _sim_engine(first, seed, rate, bs, swap, prefix).run()
    replay = Replay(first, cost)
    again = Recorder(replay)
    rerun = _sim_engine(again, seed, rate, bs, swap, prefix).run()
    assert again.ticks == first.ticks
    assert [s[:2] for s in again.steps] == [s[:2] for s in first.steps]
    assert replay.replayed == len(first.steps)
    times = [(r.request_id, r.first_token_time, r.finish_time) for r in run.requests]
    assert [(r.request_id, r.first_token_time, r.finish_time) for r in rerun.requests] == times
    empty = Replay(Recorder(None), cost)
    priced = Recorder(empty)
    _sim_engine(priced, seed, rate, bs, swap, prefix).run()
    assert priced.ticks == first.ticks
    assert empty.replayed == 0


def test_replay_takes_the_median_of_a_shape() -> None:
    from pagedkv.engine.batch_shape import BatchShape
    from pagedkv.engine.request import Request
    from pagedkv.engine.scheduler import ScheduledChunk
    from pagedkv.tensors.profile_runs import Replay

    rec = Recorder(None)
    shape = BatchShape.from_chunks([(5, 0)])
    for ticks in (30, 10, 20, 1000):
        rec.steps.append((shape, 0, 0.0))
        rec.ticks.append(ticks)
    replay = Replay(rec, _roofline(16))
    batch = SchedulerOutput(chunks=[ScheduledChunk(Request(0, 0.0, 5, 3), 5, 0)])
    assert replay.execute(batch).ticks == 25  # the middle two's mean, down

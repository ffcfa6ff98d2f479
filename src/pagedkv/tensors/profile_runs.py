"""Runs of the real executor that ``profile`` and ``fidelity`` share: a seeded workload, an
executor wrapper that records every step, one that replays the recorded times, the calibration
runs, and a roofline of this device (``Profile.rates``: achieved rates, so efficiencies 1)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from pagedkv.engine.batch_shape import BatchShape
from pagedkv.engine.config import SchedulerConfig
from pagedkv.engine.cost_model import CostModel, RooflineConfig, RooflineCost
from pagedkv.engine.executor import StepResult, batch_shape
from pagedkv.engine.scheduler import SchedulerOutput
from pagedkv.models.gpus import GiB, GPUSpec
from pagedkv.models.models import ModelSpec
from pagedkv.tensors.executor import TorchExecutor, build_real_engine
from pagedkv.tensors.model import Decoder
from pagedkv.workloads.spec import RequestSpec


class Recorder:
    """Wraps an executor: each step's shape, swapped blocks and duration; ``before`` runs
    ahead of each step, outside its duration."""

    def __init__(self, inner: Any, before: Callable[[], None] | None = None) -> None:
        self.inner = inner
        self.before = before
        self.steps: list[tuple[BatchShape, int, float]] = []
        self.ticks: list[int] = []  # each step's duration in the clock's ticks, exact
        self.detail: list[dict[str, Any]] = []  # ``step_detail`` of each step

    def execute(self, batch: SchedulerOutput) -> StepResult:
        if self.before is not None:
            self.before()
        result: StepResult = self.inner.execute(batch)
        swapped = len(batch.swap_out) + len(batch.swap_in)
        self.steps.append((batch_shape(batch), swapped, result.duration))
        self.ticks.append(result.ticks)
        self.detail.append(step_detail(batch))
        return result


def step_detail(batch: SchedulerOutput) -> dict[str, Any]:
    """What a step ran beyond its shape, for grouping its error by kind (``fidelity``'s
    ``steps``): its (new, cached) tokens per sequence, its swaps, copies and preemptions, and
    how many of its prefill chunks recompute a preempted request."""
    return {
        "chunks": [[c.num_new_tokens, c.num_cached_tokens] for c in batch.chunks],
        "swap_in": len(batch.swap_in),
        "swap_out": len(batch.swap_out),
        "copies": len(batch.copies),
        "preempted": len(batch.preempted),
        "recomputes": sum(
            1 for c in batch.chunks if c.num_new_tokens > 1 and c.request.num_preemptions > 0
        ),
    }


class Repeated:
    """Wraps a ``TorchExecutor``: runs each step ``repeats`` times and reports the median time
    (the result of the first run). Running a step again recomputes what it wrote (the same K/V
    into the same slots, the same seeded samples). A step that swaps or copies blocks is not
    idempotent (a copy may read a block the step overwrote since), so before its first run the
    cache is copied aside (``PagedKVCache.snapshot``, outside the timed step) and put back before
    each run after: every run starts from the same state, and every step, swaps too, is timed
    as often (a step timed once would carry a cold start its neighbours' medians do not)."""

    def __init__(self, inner: Any, repeats: int) -> None:
        self.inner, self.repeats = inner, repeats

    def execute(self, batch: SchedulerOutput) -> StepResult:
        saved = None
        if self.repeats > 1 and (batch.swap_in or batch.swap_out or batch.copies):
            saved = self.inner.cache.snapshot()
        result: StepResult = self.inner.execute(batch)
        if self.repeats == 1:
            return result
        times = [result.ticks]
        for _ in range(self.repeats - 1):
            if saved is not None:
                self.inner.cache.restore(saved)
            times.append(self.inner.execute(batch).ticks)
        return dataclasses.replace(result, ticks=median_ticks(times))


class Replay:
    """An executor whose steps take what the real run measured: each step the median of the
    real steps of the same shape and swaps (``recorded``, a ``Recorder`` of the real run), a
    step of a shape the real run never ran priced by ``cost``. A simulation on it has the real
    run's clock with the simulator's schedule: what remains of an error is the schedule's
    (arrivals landing on the other side of a step boundary), not the cost model's."""

    def __init__(self, recorded: Recorder, cost: CostModel) -> None:
        by: dict[tuple[BatchShape, int], list[int]] = {}
        for (shape, swapped, _), ticks in zip(recorded.steps, recorded.ticks, strict=True):
            by.setdefault((shape, swapped), []).append(ticks)
        self.ticks = {key: median_ticks(times) for key, times in by.items()}
        self.cost = cost
        self.replayed = 0  # steps that took a measured time

    def execute(self, batch: SchedulerOutput) -> StepResult:
        shape = batch_shape(batch)
        swapped = len(batch.swap_out) + len(batch.swap_in)
        ticks = self.ticks.get((shape, swapped))
        if ticks is None:
            ticks = self.cost.step_ticks(shape) + (self.cost.swap_ticks(swapped) if swapped else 0)
        else:
            self.replayed += 1
        return StepResult(ticks)


def median_ticks(ticks: list[int]) -> int:
    """The median of ``ticks``, to the tick (of an even count: the middle two's mean, down)."""
    s = sorted(ticks)
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) // 2


def workload(
    n: int,
    vocab: int,
    prompt: tuple[int, int],
    output: tuple[int, int],
    rate: float,
    seed: int,
    shared_prefix: int = 0,
) -> list[RequestSpec]:
    """``n`` requests, lengths uniform in the (inclusive) ranges, Poisson arrivals at ``rate``
    (0: all at t = 0), random token ids; each prompt starts with ``shared_prefix`` common ids."""
    rng = np.random.default_rng(seed)
    prefix = tuple(int(t) for t in rng.integers(0, vocab, shared_prefix))
    t, out = 0.0, []
    for i in range(n):
        if rate > 0:
            t += float(rng.exponential(1.0 / rate))
        p = int(rng.integers(prompt[0], prompt[1] + 1))
        o = int(rng.integers(output[0], output[1] + 1))
        body = tuple(int(x) for x in rng.integers(0, vocab, max(p - len(prefix), 0)))
        ids = (prefix + body)[: max(p, 1)]
        out.append(RequestSpec(i, len(ids), o, arrival_time=round(t, 6), token_ids=ids))
    return out


def calibration_steps(
    model: Decoder,
    block_size: int,
    clock: Callable[[], float],
    seed: int,
) -> list[tuple[BatchShape, float]]:
    """(shape, measured seconds) of every step of two short runs on ``model`` (after a warm-up
    run: first calls allocate and build): all arrivals at
    once (prefill batches, then decodes), and chunked prefill under a small token budget (mixed
    batches). Their workloads are seeded apart from any evaluated one (``seed + 1000``)."""
    max_len = model.config.max_position
    prompt = (8, max(8, min(128, max_len // 2)))
    output = (4, max(4, min(32, max_len // 4)))
    runs = [
        SchedulerConfig(max_model_len=max_len),
        SchedulerConfig(
            max_model_len=max_len,
            enable_chunked_prefill=True,
            max_num_batched_tokens=64,
            max_num_seqs=16,
        ),
    ]
    steps: list[tuple[BatchShape, float]] = []
    for i, sched in enumerate([runs[0], *runs]):  # the first run warms up, and is dropped
        n = 4 if i == 0 else 12
        specs = workload(n, model.config.vocab_size, prompt, output, 0.0, seed + 1000 + i)
        need = sum(-(-(s.prompt_len + s.output_len) // block_size) for s in specs)
        engine = build_real_engine(
            model, specs, num_gpu_blocks=need + 1, block_size=block_size, scheduler=sched
        )
        assert isinstance(engine.executor, TorchExecutor)
        engine.executor.clock = clock
        recorder = Recorder(engine.executor)
        engine.executor = recorder
        engine.run()
        if i > 0:
            steps += [(shape, seconds) for shape, _, seconds in recorder.steps]
    return steps


def roofline_of(
    rates: dict[str, float], model: ModelSpec, block_size: int, overhead: float
) -> RooflineCost:
    """Today's roofline on the profiled device: its achieved rates as the peaks."""
    gpu = GPUSpec(
        "profiled-device",
        64 * GiB,
        rates["matmul_flops"],
        rates["read_bandwidth"],
        rates["copy_bandwidth"],
    )
    cfg = RooflineConfig(
        compute_efficiency=1.0,
        memory_efficiency=1.0,
        pcie_efficiency=1.0,
        step_overhead_s=overhead,
        swap_copy_overhead_s=0.0,
        paged_block_overhead=0.0,
        per_sequence_s=0.0,
        block_size=block_size,
    )
    return RooflineCost(gpu, model, 1, cfg)

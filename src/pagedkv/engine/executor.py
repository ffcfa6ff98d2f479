"""The executor interface the engine calls, and the simulated executor.

An executor performs one iteration: the block copies and swaps the memory manager asked for,
then the batch's tokens. The simulated one only says how long that takes, from a cost model;
the real one (``pagedkv.tensors``, torch) runs a model on paged K/V through the same interface.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pagedkv.engine.batch_shape import BatchShape
from pagedkv.engine.clock import to_seconds, to_ticks
from pagedkv.engine.cost_model import CostModel
from pagedkv.engine.scheduler import SchedulerOutput


@dataclass(frozen=True)
class StepResult:
    """How long the iteration took, in the clock's integer ticks (``clock.py``), and, from a
    real executor, the token each sequence sampled (keyed by its ``seq_id``; only sequences
    whose computed tokens caught up with their total sample one), and the ids of the requests
    that sampled a stop token (EOS): they end now, shorter than their output_len."""

    ticks: int
    sampled: Mapping[object, int] | None = None
    stopped: frozenset[int] = frozenset()

    @classmethod
    def measured(
        cls,
        seconds: float,
        sampled: Mapping[object, int] | None = None,
        stopped: frozenset[int] = frozenset(),
    ) -> StepResult:
        """An iteration that took ``seconds`` (a wall clock's), rounded once to ticks."""
        return cls(to_ticks(seconds), sampled, stopped)

    @property
    def duration(self) -> float:
        """``ticks`` in seconds."""
        return to_seconds(self.ticks)


@runtime_checkable
class Executor(Protocol):
    def execute(self, batch: SchedulerOutput) -> StepResult: ...


def sequence_chunks(batch: SchedulerOutput) -> list[tuple[int, int]]:
    """(new, cached tokens) per scheduled sequence (a forked group's chunk stands for each of
    its sequences)."""
    return [
        (c.num_new_tokens, c.num_cached_tokens) for c in batch.chunks for _ in c.request.seq_ids
    ]


def batch_shape(batch: SchedulerOutput) -> BatchShape:
    """The cost model's view of a batch: its ``sequence_chunks``."""
    return BatchShape.from_chunks(sequence_chunks(batch))


class SimExecutor:
    """Durations from a cost model: the step, plus the swaps done before it."""

    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model

    def step_ticks(self, batch: SchedulerOutput) -> int:
        """The step's price, swaps aside."""
        return self.cost_model.step_ticks(batch_shape(batch))

    def execute(self, batch: SchedulerOutput) -> StepResult:
        ticks = self.step_ticks(batch)
        swapped = len(batch.swap_out) + len(batch.swap_in)
        if swapped:
            ticks += self.cost_model.swap_ticks(swapped)
        return StepResult(ticks)

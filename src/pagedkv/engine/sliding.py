"""Sliding-window attention in the simulated clock: each step priced with the window.

A sliding-window layer of window W lets the token at position p attend to positions
max(0, p - W + 1) .. p: min(p + 1, W) of them. Per sequence with n new tokens after c cached
ones, such a layer computes sum_{q=c+1}^{c+n} min(q, W) attention pairs and reads the
min(c + n, n + W - 1) positions any of them attends to (``windowed_shape``); full layers see
``BatchShape.from_chunks``'s counts. The roofline's ``windowed_step_ticks`` prices both.

These clipped counts are not linear in the round number once a sequence outgrows its window,
which the closed-form fast-forward needs, so a run whose sequences can outgrow the window
steps every round (``needs_window_pricing``) with the ``WindowedExecutor``.
"""

from __future__ import annotations

from collections.abc import Iterable

from pagedkv.engine.batch_shape import BatchShape
from pagedkv.engine.cost_model import RooflineCost
from pagedkv.engine.executor import SimExecutor, sequence_chunks
from pagedkv.engine.scheduler import SchedulerOutput
from pagedkv.models.models import ModelSpec
from pagedkv.validation import check_int


def clipped_sum(first: int, last: int, window: int) -> int:
    """sum_{q=first}^{last} min(q, window), for 0 <= first, in O(1) (0 when last < first)."""
    if last < first:
        return 0
    below_hi = min(last, window)  # q in [first, below_hi] count q itself
    below = (first + below_hi) * (below_hi - first + 1) // 2 if below_hi >= first else 0
    above = last - max(first - 1, window)  # q in (window, last] count the window
    return below + max(0, above) * window


def windowed_shape(chunks: Iterable[tuple[int, int]], window: int) -> BatchShape:
    """``BatchShape.from_chunks`` as a layer of window ``window`` sees it: the same tokens and
    sequences, attention pairs and K/V reads clipped at the window."""
    check_int("sliding_window", window, 1)
    tokens = seqs = pairs = reads = 0
    for n, c in chunks:
        if n:
            tokens, seqs = tokens + n, seqs + 1
            pairs += clipped_sum(c + 1, c + n, window)
            reads += min(c + n, n + window - 1)
    return BatchShape(tokens, seqs, pairs, reads)


def needs_window_pricing(model: ModelSpec, max_model_len: int) -> bool:
    """True when some sequence may outgrow the model's window (else the window never clips)."""
    return model.sliding_window is not None and max_model_len > model.sliding_window


class WindowedExecutor(SimExecutor):
    """The simulated executor for a sliding-window model: each step priced with the window."""

    def __init__(self, cost_model: RooflineCost, window: int) -> None:
        super().__init__(cost_model)
        self.roofline = cost_model
        self.window = check_int("sliding_window", window, 1)

    def step_ticks(self, batch: SchedulerOutput) -> int:
        chunks = sequence_chunks(batch)
        shape = BatchShape.from_chunks(chunks)
        return self.roofline.windowed_step_ticks(shape, windowed_shape(chunks, self.window))

"""The ledger: the run's clock and every time-weighted total, with one writer.

Everything a run accounts goes through one ``Ledger``: the clock (``advance``, ``wait_until``),
the per-round sums and time integrals of ``StepTotals`` (``add``, a ``Span`` of rounds) and the
preemption counters (``preempted``). A span is k consecutive busy rounds of known total
duration T::

    reference loop:   one round, each level constant over it        (Span.of_round, k = 1)
    fast path:        k rounds in closed form, levels integrated    (Span(...), k >= 1)

    rounds += k, busy_time += T, sum_running += sum of running, ..., weighted[c] += integral of c

Adding a metric means one field of ``StepTotals`` and one of ``Span``, and one line of ``add``;
both paths then account it (the fast path has to supply its integral over a span, which the
differential tests check against the reference's sum of rounds).

The clock and every total are integers: ticks (``clock.py``), and ticks x slots for the time
integrals. The fast path's closed forms and the reference's round-by-round sums are then the
same integers, and an arrival that ties a round's end falls on the same side of it in both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from pagedkv.engine.clock import to_seconds
from pagedkv.engine.metrics import StepTotals
from pagedkv.engine.request import Request, RequestStatus
from pagedkv.memory.usage import MemoryUsage


class Span(NamedTuple):
    """What ``rounds`` busy rounds of total duration ``time`` (ticks) add to the totals: the
    sums of running and batched sequences over them, the most running at once, and the time
    integrals (ticks x slots) of the five memory categories (``CATEGORIES`` order), of the
    blocks saved by sharing and of the allocator's rounding."""

    rounds: int
    time: int
    running: int
    batched: int
    max_running: int
    weighted: tuple[int, int, int, int, int]
    saved: int
    rounding: int = 0

    @classmethod
    def of_round(
        cls,
        duration: int,
        usage: MemoryUsage,
        num_running: int,
        num_batched: int,
        saved_blocks: int,
    ) -> Span:
        """One round of ``duration`` with the memory ``usage`` throughout it."""
        slots = (
            usage.token_states,
            usage.reservation,
            usage.internal_fragmentation,
            usage.external_fragmentation,
            usage.free,
        )
        return cls.of_slots(
            duration, slots, num_running, num_batched, saved_blocks, usage.allocator_rounding
        )

    @classmethod
    def of_slots(
        cls,
        duration: int,
        slots: tuple[int, int, int, int, int],
        num_running: int,
        num_batched: int,
        saved_blocks: int,
        rounding: int = 0,
    ) -> Span:
        """``of_round`` with the memory as each category's slots (``memory.usage.categories``)."""
        a, b, c, d, e = slots
        weighted = (duration * a, duration * b, duration * c, duration * d, duration * e)
        return _new(
            cls,
            (
                1,
                duration,
                num_running,
                num_batched,
                num_running,
                weighted,
                duration * saved_blocks,
                duration * rounding,
            ),
        )


_new = tuple.__new__  # a NamedTuple's own constructor is Python code (one span per round)


def level_integrals(
    capacity: int, time: int, tokens: int, allocated: int, internal: int, waiting: bool
) -> tuple[int, int, int, int, int]:
    """The five categories' integrals over a span (``CATEGORIES`` order) from those of token
    states, allocated slots and internal fragmentation: reservation is what allocated holds
    beyond the other two, and unallocated slots are external fragmentation while a request
    waits for memory (throughout the span), free otherwise."""
    unallocated = capacity * time - allocated
    reservation = allocated - tokens - internal
    if waiting:
        return tokens, reservation, internal, unallocated, 0
    return tokens, reservation, internal, 0, unallocated


class Ledger:
    """The run's clock (``ticks``) and its ``StepTotals``; the only code that writes either."""

    __slots__ = ("ticks", "totals")

    def __init__(self) -> None:
        self.ticks = 0
        self.totals = StepTotals()

    @property
    def now(self) -> float:
        """The clock in seconds (``clock.to_seconds``: the same float on every path)."""
        return to_seconds(self.ticks)

    def advance(self, duration: int) -> None:
        """The clock moves over busy rounds of ``duration`` ticks in total."""
        self.ticks += duration

    def arrived(self, tick: int) -> bool:
        """Has an arrival at ``tick`` happened by now (at or before the clock)?"""
        return tick <= self.ticks

    def until(self, tick: int) -> int:
        """The busy ticks from now after which an arrival at ``tick`` has happened
        (``arrived``): what the fast path's windows sum step times up to."""
        return tick - self.ticks

    def wait_until(self, tick: int) -> None:
        """Idle until ``tick`` (an arrival), if it is later than now."""
        if tick > self.ticks:
            self.ticks = tick

    def add(self, span: Span) -> None:
        """Account ``span`` (the clock is ``advance``'s: a caller may account a span's rounds
        before or after running them)."""
        t = self.totals
        t.iterations += span.rounds
        t.busy_time += span.time
        if span.max_running > t.max_running:
            t.max_running = span.max_running
        t.sum_running += span.running
        t.sum_batched_seqs += span.batched
        weighted = t.weighted
        a, b, c, d, e = span.weighted
        weighted["token_states"] += a
        weighted["reservation"] += b
        weighted["internal_fragmentation"] += c
        weighted["external_fragmentation"] += d
        weighted["free"] += e
        t.weighted_saved_blocks += span.saved
        t.weighted_rounding += span.rounding

    def preempted(self, victims: Sequence[Request], swapped_blocks: int) -> None:
        """A round preempted ``victims`` (those now swapped went to the CPU) and swapped
        ``swapped_blocks`` blocks out."""
        t = self.totals
        t.preemptions += len(victims)
        t.swap_outs += sum(r.status is RequestStatus.SWAPPED for r in victims)
        t.swapped_blocks += swapped_blocks

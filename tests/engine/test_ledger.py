"""The ledger: a span of k rounds accounts what its k rounds would, one at a time."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given

from pagedkv.engine.clock import TICKS_PER_SECOND as SECOND
from pagedkv.engine.ledger import Ledger, Span, level_integrals
from pagedkv.engine.metrics import CATEGORIES
from pagedkv.engine.request import Request, RequestStatus
from pagedkv.memory.usage import MemoryUsage


@st.composite
def rounds(draw: st.DrawFn) -> list[tuple[int, MemoryUsage, int, int, int]]:
    capacity = draw(st.integers(1, 4000))
    out = []
    for _ in range(draw(st.integers(1, 20))):
        tokens = draw(st.integers(0, capacity))
        internal = draw(st.integers(0, capacity - tokens))
        reservation = draw(st.integers(0, capacity - tokens - internal))
        waiting = draw(st.booleans())
        usage = MemoryUsage.from_books(capacity, tokens, reservation, internal, waiting)
        duration = draw(st.integers(0, 10 * SECOND))
        running = draw(st.integers(0, 64))
        out.append(
            (duration, usage, running, draw(st.integers(0, running)), draw(st.integers(0, 9)))
        )
    return out


@given(rounds(), st.booleans())
def test_one_span_of_integrated_levels_equals_its_rounds(
    steps: list[tuple[int, MemoryUsage, int, int, int]], waiting: bool
) -> None:
    """Rounds one by one against one span whose integrals are the levels' sums (what the fast
    path supplies): the same totals, exactly (integer ticks and tick x slot integrals)."""
    one_by_one = Ledger()
    for duration, usage, running, batched, saved in steps:
        one_by_one.add(Span.of_round(duration, usage, running, batched, saved))
        one_by_one.advance(duration)
    capacity = steps[0][1].capacity
    time = sum(d for d, *_ in steps)
    tokens = sum(d * u.token_states for d, u, *_ in steps)
    alloc = sum(d * u.allocated for d, u, *_ in steps)
    internal = sum(d * u.internal_fragmentation for d, u, *_ in steps)
    weighted = level_integrals(capacity, time, tokens, alloc, internal, waiting)
    span = Span(
        len(steps),
        time,
        sum(s[2] for s in steps),
        sum(s[3] for s in steps),
        max(s[2] for s in steps),
        weighted,
        sum(d * s for d, *_, s in steps),
    )
    whole = Ledger()
    whole.add(span)
    whole.advance(time)
    a, b = one_by_one.totals, whole.totals
    assert (a.iterations, a.max_running, a.sum_running, a.sum_batched_seqs) == (
        b.iterations,
        b.max_running,
        b.sum_running,
        b.sum_batched_seqs,
    )
    assert (one_by_one.ticks, a.busy_time) == (whole.ticks, b.busy_time) == (time, time)
    assert a.weighted_saved_blocks == b.weighted_saved_blocks
    for name in ("token_states", "reservation", "internal_fragmentation"):
        assert a.weighted[name] == b.weighted[name]
    # The span splits the unallocated slots by its one ``waiting``: their sum is the rounds'.
    free = {n: a.weighted[n] for n in ("external_fragmentation", "free")}
    assert sum(free.values()) == b.weighted[CATEGORIES[3 if waiting else 4]]
    assert sum(a.weighted.values()) == sum(b.weighted.values()) == capacity * time


def test_the_clock_waits_only_forward() -> None:
    ledger = Ledger()
    ledger.advance(2 * SECOND)
    ledger.wait_until(SECOND)
    assert (ledger.ticks, ledger.now) == (2 * SECOND, 2.0)
    ledger.wait_until(7 * SECOND // 2)
    assert (ledger.ticks, ledger.now) == (7 * SECOND // 2, 3.5)
    assert ledger.totals.busy_time == 0  # waiting is idle time, not a span


def test_an_arrival_at_the_clock_has_arrived() -> None:
    ledger = Ledger()
    ledger.advance(5)
    assert ledger.arrived(5)
    assert not ledger.arrived(6)
    assert ledger.until(6) == 1


def test_preemptions_are_counted() -> None:
    def victims(*statuses: RequestStatus) -> list[Request]:
        reqs = [Request(i, 0.0, 4, 4) for i in range(len(statuses))]
        for req, status in zip(reqs, statuses, strict=True):
            req.status = status
        return reqs

    swapped, waiting = RequestStatus.SWAPPED, RequestStatus.WAITING
    ledger = Ledger()
    ledger.preempted(victims(waiting, swapped, waiting), 7)
    ledger.preempted(victims(swapped), 2)
    t = ledger.totals
    assert (t.preemptions, t.swap_outs, t.swapped_blocks) == (4, 2, 9)

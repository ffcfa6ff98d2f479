"""ConcurrencyCap, vllm bench serve's --max-concurrency client: send times equal an event-by-
event semaphore's, whatever the order in which releases and arrivals are learnt."""

from __future__ import annotations

import heapq
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.workloads.client import ConcurrencyCap


def semaphore(arrivals: list[int], durations: list[int], limit: int, step: int) -> list[float]:
    """Send times by an event loop: a release at t comes before a send at t, waiters FIFO. As
    in the engine, a request sent at s starts at the first step boundary >= s and ends
    ``duration`` (> 0) after it."""
    events = [(a, 1, i) for i, a in enumerate(arrivals)]  # (time, 0 release / 1 arrival, id)
    heapq.heapify(events)
    free, waiting, sent = limit, [], [math.nan] * len(arrivals)
    while events:
        t, kind, i = heapq.heappop(events)
        if kind == 0:
            free += 1
        else:
            waiting.append(i)
        while free and waiting:
            j = waiting.pop(0)
            free -= 1
            sent[j] = t
            start = -(-t // step) * step
            heapq.heappush(events, (start + durations[j], 0, j))
    return sent


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 100), st.integers(1, 20)), min_size=1, max_size=30),
    st.integers(1, 6),
    st.integers(1, 10),
)
def test_send_times_are_a_semaphores_even_when_learnt_late(
    requests: list[tuple[int, int]], limit: int, step: int
) -> None:
    requests.sort(key=lambda r: r[0])
    arrivals, durations = [a for a, _ in requests], [d for _, d in requests]
    expected = semaphore(arrivals, durations, limit, step)
    # As the engine learns them: at each step boundary, first every end up to it, then every
    # request that arrived by it, while a slot is free; a request handed over runs from there.
    cap, sent = ConcurrencyCap(limit), [math.nan] * len(arrivals)
    ends: list[tuple[int, int]] = []
    pending, now = 0, 0
    while pending < len(arrivals) or ends:
        while ends and ends[0][0] <= now:
            cap.release(heapq.heappop(ends)[0])
        while pending < len(arrivals) and arrivals[pending] <= now and cap.free:
            sent[pending] = cap.send(arrivals[pending])
            assert sent[pending] <= now
            heapq.heappush(ends, (now + durations[pending], pending))
            pending += 1
        now += step
    assert sent == expected


def test_misuse_is_refused() -> None:
    cap = ConcurrencyCap(1)
    with pytest.raises(ValueError, match="released more"):
        cap.release(0.0)
    assert cap.send(2.0) == 2.0
    assert (cap.free, cap.in_flight) == (0, 1)
    with pytest.raises(ValueError, match="no free slot"):
        cap.send(3.0)
    cap.release(5.0)
    assert cap.send(3.0) == 5.0

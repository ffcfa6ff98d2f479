"""The benchmark client's cap on requests in flight: ``vllm bench serve --max-concurrency N``.

vLLM's client (``benchmark`` in ``vllm/benchmarks/serve.py``) creates each request at its
arrival time and sends it once it holds one of N semaphore slots; a slot is released when the
response ends. So request i is sent at max(its arrival, the moment a slot is free for it),
first come first sent, and its TTFT and E2E latency count from that send time.

``ConcurrencyCap`` keeps the N slots as the times they became free: N at t = 0, then each
release's time. A request takes the slot free the longest: its send time is max(arrival, that
time), the earliest moment at which a slot was free for it. This holds whatever the order in
which the engine learns of releases and arrivals, as long as it hands a request over only
after every release up to that moment (the engine does: a step's finishes come first).
"""

from __future__ import annotations

import heapq

from pagedkv.validation import check_int


class ConcurrencyCap:
    """N client slots; ``send`` takes one, ``release`` gives one back."""

    def __init__(self, limit: int) -> None:
        self.limit = check_int("max_concurrency", limit, 1)
        self._idle = self.limit  # slots free since t = 0, never taken
        self._freed: list[float] = []  # a heap: times at which a taken slot was given back

    @property
    def free(self) -> int:
        """Slots free now (0: the next request waits for a release)."""
        return self._idle + len(self._freed)

    @property
    def in_flight(self) -> int:
        return self.limit - self.free

    def send(self, arrival: float) -> float:
        """Take the slot free the longest for a request that arrived at ``arrival``: its send
        time. Needs a free slot."""
        if self._idle:
            self._idle -= 1
            return arrival
        if not self._freed:
            raise ValueError("no free slot: wait for a release")
        return max(arrival, heapq.heappop(self._freed))

    def release(self, time: float) -> None:
        """A request in flight ended (finished, or refused at once) at ``time``."""
        if self.free >= self.limit:
            raise ValueError("released more slots than were taken")
        heapq.heappush(self._freed, time)

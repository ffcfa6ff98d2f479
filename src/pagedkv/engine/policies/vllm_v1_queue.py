"""The vllm-v1 policy's waiting queue: FCFS (a deque) or priority (kept sorted).

FCFS:      arrivals join the tail; a preempted request goes back to the head.
priority:  every request (arrival or preempted) takes its place by (priority, arrival
           time, request id), lowest first: vLLM's priority queue order.
"""

from __future__ import annotations

import bisect
from collections import deque

from pagedkv.engine.config import SchedulerConfig, SchedulingPolicy
from pagedkv.engine.request import Request


def _key(r: Request) -> tuple[int, float, int]:
    return (r.priority, r.arrival_time, r.request_id)


class PriorityQueueMixin:
    """``_enqueue``, ``_head``, ``_pop_head`` and ``_requeue`` over ``self.waiting``."""

    waiting: deque[Request]
    config: SchedulerConfig

    def _by_priority(self) -> bool:
        return self.config.scheduling_policy is SchedulingPolicy.PRIORITY

    def _enqueue(self, req: Request) -> None:
        if self._by_priority():
            self._insert(req)
        else:
            self.waiting.append(req)

    def _requeue(self, req: Request) -> None:
        if self._by_priority():
            self._insert(req)
        else:
            self.waiting.appendleft(req)

    def _head(self) -> Request:
        return self.waiting[0]

    def _pop_head(self) -> Request:
        return self.waiting.popleft()

    def _insert(self, req: Request) -> None:
        at = bisect.bisect(self.waiting, _key(req), key=_key)
        self.waiting.insert(at, req)

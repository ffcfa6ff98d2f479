"""The course lesson's workload and system (``shared/seeds``: "Paged KV Cache Integration &
Benchmarking"): 20 requests at t = 0, request i with a prompt of 20 + 5i tokens and an output of
50 - i tokens, block size 16, maximum sequence length 256, 100 blocks of KV memory.

The lesson gave its contiguous allocator 5 slots of 256 tokens (80 blocks) against paged's 100
blocks; we keep that setting only to show it, and compare at equal memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedkv.workloads.spec import RequestSpec


@dataclass(frozen=True)
class LessonSystem:
    num_requests: int = 20
    block_size: int = 16
    max_seq_len: int = 256
    num_blocks: int = 100
    lesson_contiguous_slots: int = 5
    """What the lesson gave its contiguous allocator: 5 x 256 tokens = 80 blocks, not 100."""

    @property
    def capacity(self) -> int:
        """Token slots of the equal-memory comparison: num_blocks x block_size."""
        return self.num_blocks * self.block_size


LESSON = LessonSystem()


def lesson_workload(num_requests: int = LESSON.num_requests) -> list[RequestSpec]:
    """Request i: prompt 20 + 5i, output 50 - i tokens, all arriving at t = 0."""
    return [RequestSpec(i, 20 + 5 * i, 50 - i) for i in range(num_requests)]

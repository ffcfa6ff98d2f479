"""What each allocator must hold for the course lesson's workload, before any step runs.

All 20 requests arrive at t = 0 and are admitted first-come-first-served until the first one
that does not fit (head-of-line, as the lesson's loop does). Paged memory takes blocks for the
prompts only and grows by a block at a time; each contiguous variant reserves a region per
request up front. Every variant gets the same memory (100 blocks x 16 = 1600 token slots),
except one row that repeats the lesson's own unequal setting (5 slots = 80 blocks).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pagedkv.memory.config import CacheConfig, ContiguousConfig, Placement, Reservation
from pagedkv.memory.contiguous import ContiguousAllocator
from pagedkv.memory.interface import AllocStatus, KVAllocator
from pagedkv.memory.manager import KVCacheManager
from pagedkv.workloads.lesson import LESSON, LessonSystem, lesson_workload
from pagedkv.workloads.spec import RequestSpec


@dataclass(frozen=True)
class CapacityRow:
    """One allocator's admission of the lesson's workload at t = 0."""

    allocator: str
    reserves: str
    memory_blocks: int
    equal_memory: bool
    held_at_once: int
    allocated_slots: int
    token_states: int

    @property
    def token_utilization(self) -> float:
        """token_states / allocated_slots at admission."""
        return self.token_states / self.allocated_slots if self.allocated_slots else 1.0


@dataclass(frozen=True)
class LessonCapacity:
    system: LessonSystem
    paged_blocks_prompts: int
    """Blocks paged memory takes for every prompt."""
    paged_blocks_completion: int
    """Blocks paged memory would take with every request at its final length."""
    rows: tuple[CapacityRow, ...]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for row, d in zip(self.rows, out["rows"], strict=True):
            d["token_utilization"] = row.token_utilization
        return out


def _admit(alloc: KVAllocator, requests: list[RequestSpec], full_length: bool) -> int:
    """Admit FCFS until the first request that does not fit now; return how many got in."""
    held = 0
    for r in requests:
        n = r.final_len if full_length else r.prompt_len
        if alloc.can_allocate(r.request_id, n, final_len=r.final_len) is not AllocStatus.OK:
            break
        if alloc.allocate(r.request_id, n, final_len=r.final_len) is None:
            break
        held += 1
    return held


def _row(
    name: str, reserves: str, alloc: KVAllocator, requests: list[RequestSpec], full: bool, bs: int
) -> CapacityRow:
    held = _admit(alloc, requests, full)
    u = alloc.usage()
    return CapacityRow(
        allocator=name,
        reserves=reserves,
        memory_blocks=alloc.capacity // bs,
        equal_memory=alloc.capacity == LESSON.capacity,
        held_at_once=held,
        allocated_slots=u.allocated,
        token_states=u.token_states,
    )


def lesson_capacity(system: LessonSystem = LESSON) -> LessonCapacity:
    """The table ``pagedkv bench`` prints (and ``make run`` shows)."""
    requests = lesson_workload(system.num_requests)
    bs, max_len = system.block_size, system.max_seq_len

    def paged() -> KVCacheManager:
        return KVCacheManager(CacheConfig(system.num_blocks, bs, watermark=0.0))

    def contiguous(placement: Placement, reservation: Reservation, cap: int) -> ContiguousAllocator:
        return ContiguousAllocator(
            ContiguousConfig(cap, max_len, placement, reservation, block_size=bs)
        )

    prompts = paged()
    rows = [_row("paged", "prompt; +1 block as it grows", prompts, requests, False, bs)]
    rows.append(_row("paged, full length", "final length, up front", paged(), requests, True, bs))
    cap = system.capacity
    rows.append(
        _row(
            "contiguous slots",
            f"{cap // max_len} slots of {max_len}",
            contiguous(Placement.FIRST_FIT, Reservation.SLOTS, cap),
            requests,
            False,
            bs,
        )
    )
    for placement in (Placement.FIRST_FIT, Placement.BUDDY):
        for reservation, what in (
            (Reservation.MAX, f"{max_len} (max length)"),
            (Reservation.POW2, "prompt + pow2 of output"),
            (Reservation.ORACLE, "final length"),
        ):
            alloc = contiguous(placement, reservation, cap)
            rows.append(
                _row(f"{placement.value} {reservation.value}", what, alloc, requests, False, bs)
            )
    lesson_cap = system.lesson_contiguous_slots * max_len
    rows.append(
        _row(
            "lesson's own slots",
            f"{system.lesson_contiguous_slots} slots of {max_len}",
            contiguous(Placement.FIRST_FIT, Reservation.SLOTS, lesson_cap),
            requests,
            False,
            bs,
        )
    )
    return LessonCapacity(
        system=system,
        paged_blocks_prompts=prompts.gpu.num_used,
        paged_blocks_completion=sum(prompts.blocks_for(r.final_len) for r in requests),
        rows=tuple(rows),
    )

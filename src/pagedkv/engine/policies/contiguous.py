"""Continuous batching on contiguous memory: the vLLM paper's Orca baselines and the lesson's
fixed slots.

* ``orca-max``, ``orca-pow2``, ``orca-oracle``: each request reserves a region at admission
  (max length, next power of two of its final length, or exactly its final length), placed by
  a buddy allocator, as in the paper's Orca baselines (Kwon et al. 2023, §6.1).
* ``firstfit-max``, ``firstfit-pow2``, ``firstfit-oracle``: the same reservations placed
  first-fit in one address space (holes coalesce) instead of by buddy.
* ``contiguous-slots``: the course lesson's allocator, C // max_model_len fixed slots.

The iteration structure is the vllm policy's (so a comparison isolates the memory manager);
a reservation always covers the request's final length, so growth never fails and nothing is
preempted. A round's plan reads only the waiting queue, the running count and the address
space (``plan_round``; with chunked prefill ``fill``, which reads the prompts in chunks too), so
the decode cohort runs these policies between events.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import ClassVar

from pagedkv.engine.config import SchedulerConfig
from pagedkv.engine.request import Request
from pagedkv.engine.scheduler import RoundPlan, Scheduler, SchedulerOutput, keeps_rounds
from pagedkv.memory.config import CacheConfig, ContiguousConfig, Placement, Reservation
from pagedkv.memory.contiguous import ContiguousAllocator
from pagedkv.memory.interface import KVAllocator

_new = tuple.__new__  # a NamedTuple's own constructor is Python code (a plan per event)


class ContiguousScheduler(Scheduler):
    """Admit while a region can be placed; decode everything running."""

    placement: ClassVar[Placement]
    reservation: ClassVar[Reservation]
    # A group would need n regions at once; placing them one fork at a time can leave every
    # running group half forked and stuck, so groups are refused (they run as n requests).
    supports_groups = False
    decides_at_events = True  # tested fast against reference (tests/engine)

    def __init__(self, config: SchedulerConfig, kv: KVAllocator) -> None:
        super().__init__(config, kv)
        # Are the rounds those of this class's ``schedule``, which ``plan_round`` restates?
        cls = type(self)
        self._rounds_mirrored = keeps_rounds(cls, ContiguousScheduler, _MIRRORED)
        self.regions = kv if isinstance(kv, ContiguousAllocator) else None
        # The last refused head: (it, running count, its pending tokens, free slots then).
        self._refused: tuple[Request, int, int, int] | None = None

    @classmethod
    def make_allocator(cls, cache: CacheConfig, config: SchedulerConfig) -> ContiguousAllocator:
        return ContiguousAllocator(cls.memory_config(cache, config))

    @classmethod
    def check_memory(cls, cache: CacheConfig, config: SchedulerConfig) -> None:
        cls.memory_config(cache, config)

    @classmethod
    def memory_config(cls, cache: CacheConfig, config: SchedulerConfig) -> ContiguousConfig:
        """The address space: ``cache``'s slots; refused if max_model_len does not fit in it."""
        return ContiguousConfig(
            capacity=cache.capacity,
            max_model_len=config.max_model_len,
            placement=cls.placement,
            reservation=cls.reservation,
            block_size=cache.block_size,
        )

    def plan_round(self) -> RoundPlan | None:
        """Without chunked prefill: ``schedule`` first admits the waiting prompts
        first-come-first-served (allocated now); if any fit, the round is prefill-only, else it
        decodes every running request (inside their regions: none is ever short). The
        admission test reads the running count and the address space's holes, which growth
        inside regions never changes. None for a class whose rounds or admission test are not
        these (``static``'s batches). With chunked prefill: a decode of every running request
        that decodes, then ``fill``'s part.

        A head refused at the last plan is refused again without a test while the running
        count, its pending tokens and the free slots are as then: until the head is admitted
        (first-come-first-served) the space changes only by frees, each of which adds free
        slots, so the same free slots mean the same holes."""
        regions = self.regions
        if regions is None or not self._rounds_mirrored or self.has_beams:
            return None
        out = SchedulerOutput()
        if self.config.enable_chunked_prefill:  # decodes first, then ``fill``'s part
            return _new(RoundPlan, (out, True, False, True))
        if not self.waiting:
            return _new(RoundPlan, (out, True, False, False))
        head = self.waiting[0]
        state = (len(self.running), head.num_pending_tokens, regions.num_free_slots)
        refused = self._refused
        if refused is not None and refused[0] is head and refused[1:] == state:
            return _new(RoundPlan, (out, True, False, False))
        self._admit_waiting(out, self.config.token_budget, chunked=False)
        self._refused = None if out.chunks else (head, *state)
        return _new(RoundPlan, (out, not out.chunks, False, False))

    def fill(
        self,
        out: SchedulerOutput,
        prefilling: Sequence[Request],
        decoded: Collection[Request],
        preempted: bool = False,
    ) -> None:
        """A chunked ``schedule`` after its decodes (``decoded``, one token each, inside their
        regions): prefill chunks of ``prefilling`` (the other running requests, in running
        order), then admissions, in what is left of the budget. It reads no decoded request;
        nothing is ever preempted here (a region holds its request's final length)."""
        budget = self.config.token_budget
        used = len(decoded)
        used += self._prefill_running(out, budget - used, prefilling)
        self._admit_waiting(out, budget - used, chunked=True)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        chunked = self.config.enable_chunked_prefill
        budget = self.config.token_budget
        used = 0
        if chunked:
            used = self._decode_running(out)
            used += self._prefill_running(out, budget - used)
        self._admit_waiting(out, budget - used, chunked=chunked)
        if not chunked and not out.chunks:
            self._decode_running(out)
        return out


class OrcaMax(ContiguousScheduler):
    name = "orca-max"
    placement = Placement.BUDDY
    reservation = Reservation.MAX


class OrcaPow2(ContiguousScheduler):
    name = "orca-pow2"
    placement = Placement.BUDDY
    reservation = Reservation.POW2


class OrcaOracle(ContiguousScheduler):
    name = "orca-oracle"
    placement = Placement.BUDDY
    reservation = Reservation.ORACLE


class ContiguousSlots(ContiguousScheduler):
    name = "contiguous-slots"
    placement = Placement.FIRST_FIT
    reservation = Reservation.SLOTS


class FirstFitMax(ContiguousScheduler):
    name = "firstfit-max"
    placement = Placement.FIRST_FIT
    reservation = Reservation.MAX


class FirstFitPow2(ContiguousScheduler):
    name = "firstfit-pow2"
    placement = Placement.FIRST_FIT
    reservation = Reservation.POW2


class FirstFitOracle(ContiguousScheduler):
    name = "firstfit-oracle"
    placement = Placement.FIRST_FIT
    reservation = Reservation.ORACLE


# What ``plan_round`` restates of a round: a class that changes any of them plans none.
_MIRRORED = (
    "schedule",
    "fill",
    "finish",
    "_can_admit",
    "_admit_waiting",
    "_decode_running",
    "_prefill_running",
)

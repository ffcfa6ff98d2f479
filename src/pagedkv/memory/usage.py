"""Memory accounting: the five categories of a KV capacity, each defined once.

Every token slot of the capacity C is in exactly one category at any moment::

    C = token_states + reservation + internal_fragmentation + external_fragmentation + free

For one live sequence with A allocated slots, T slots holding computed tokens and final
length F (prompt + output, known to a simulator)::

    slot index:  0 ......... T ............ min(A, F) .......... A
                 |  tokens   |  reservation  |  internal frag.   |
                                                  (never filled)

A physical slot shared by several sequences (fork, prefix hit) counts once. Free slots are
external fragmentation while at least one request waits for memory (memory exists, yet no
request can use it) and plain free otherwise (idle, not waste). These are the categories of
Fig. 2 of the vLLM paper (Kwon et al., SOSP 2023).

Two conventions for an allocator's rounding (a buddy allocator holds R slots rounded up to a
power of two, A >= R): the **slot convention** above (the fields) counts every held slot that is
never filled as internal fragmentation, whoever put it there. The **allocator convention** (the
paper's Fig. 2 and §3.1: "external fragmentation from the memory allocator like the buddy
allocator"; its Orca (Oracle), which reserves exactly the final length, shows no internal
fragmentation at all) counts only the reservation beyond the final length as internal, and the
rounding as external fragmentation. ``allocator_rounding`` is that rounding, a part of
``internal_fragmentation``; ``*_allocator_convention`` give the other split (same sums).
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedkv.errors import IntegrityError


@dataclass(frozen=True)
class MemoryUsage:
    """A snapshot of one allocator's books, in token slots."""

    capacity: int
    """C, the KV capacity in token slots."""
    token_states: int
    """Slots holding the K/V of a computed token (a shared physical slot counts once)."""
    reservation: int
    """Slots allocated to a live request that it will fill before it finishes."""
    internal_fragmentation: int
    """Slots allocated to a live request that it will never fill (beyond its final length)."""
    external_fragmentation: int
    """Free slots while at least one request waits for memory."""
    free: int
    """Free slots while nothing waits for memory."""
    allocator_rounding: int = 0
    """Slots of ``internal_fragmentation`` held only because the allocator rounded a reservation
    up (buddy: to a power of two): held beyond both the reservation and the final length. 0 for
    paged memory."""

    def __post_init__(self) -> None:
        parts = (
            self.token_states,
            self.reservation,
            self.internal_fragmentation,
            self.external_fragmentation,
            self.free,
        )
        if min(parts) < 0 or sum(parts) != self.capacity:
            raise IntegrityError(
                f"memory categories {parts} do not sum to capacity {self.capacity}"
            )
        if not 0 <= self.allocator_rounding <= self.internal_fragmentation:
            raise IntegrityError(
                f"allocator rounding {self.allocator_rounding} outside "
                f"[0, internal fragmentation {self.internal_fragmentation}]"
            )

    @property
    def internal_fragmentation_allocator_convention(self) -> int:
        """Internal fragmentation with the allocator's rounding left out (the paper's Fig. 2)."""
        return self.internal_fragmentation - self.allocator_rounding

    @property
    def external_fragmentation_allocator_convention(self) -> int:
        """External fragmentation with the allocator's rounding counted in (the paper's Fig. 2)."""
        return self.external_fragmentation + self.allocator_rounding

    @property
    def allocated(self) -> int:
        """Allocated slots = token_states + reservation + internal_fragmentation."""
        return self.token_states + self.reservation + self.internal_fragmentation

    @property
    def unallocated(self) -> int:
        """Slots not allocated to any live request = external_fragmentation + free."""
        return self.external_fragmentation + self.free

    @property
    def token_utilization(self) -> float:
        """token_states / allocated slots (1.0 when nothing is allocated: nothing is wasted)."""
        return self.token_states / self.allocated if self.allocated else 1.0

    @property
    def pool_occupancy(self) -> float:
        """allocated slots / C."""
        return self.allocated / self.capacity

    def fractions(self) -> dict[str, float]:
        """Each category (and the two ratios) as a fraction of capacity."""
        c = self.capacity
        return {
            "token_states": self.token_states / c,
            "reservation": self.reservation / c,
            "internal_fragmentation": self.internal_fragmentation / c,
            "external_fragmentation": self.external_fragmentation / c,
            "free": self.free / c,
            "token_utilization": self.token_utilization,
            "pool_occupancy": self.pool_occupancy,
        }

    @classmethod
    def from_books(
        cls,
        capacity: int,
        token_states: int,
        reservation: int,
        internal_fragmentation: int,
        waiting_for_memory: bool,
        allocator_rounding: int = 0,
    ) -> MemoryUsage:
        """Unallocated slots are external fragmentation if anyone waits, else free."""
        return cls(
            capacity,
            *categories(
                capacity, token_states, reservation, internal_fragmentation, waiting_for_memory
            ),
            allocator_rounding,
        )


def categories(
    capacity: int,
    token_states: int,
    reservation: int,
    internal_fragmentation: int,
    waiting_for_memory: bool,
) -> tuple[int, int, int, int, int]:
    """The five categories (``MemoryUsage``'s order) from the books, without building one:
    unallocated slots are external fragmentation if anyone waits, else free."""
    unallocated = capacity - token_states - reservation - internal_fragmentation
    if waiting_for_memory:
        return token_states, reservation, internal_fragmentation, unallocated, 0
    return token_states, reservation, internal_fragmentation, 0, unallocated

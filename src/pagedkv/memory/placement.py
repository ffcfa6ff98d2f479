"""Linear address spaces of C token slots: where a contiguous region goes.

The contiguous baselines (Orca in the vLLM paper, the course lesson's fixed slots) give each
sequence one run of adjacent slots. How runs are placed decides the external fragmentation:

* ``FirstFitSpace``: any size, the lowest-addressed hole that is big enough; freed neighbours
  coalesce. Free memory can still be split into holes too small for the next request.
* ``BuddySpace``: power-of-two blocks that split in halves and merge back with their buddy
  (the vLLM paper's Orca baseline). Rounding up to a power of two adds internal fragmentation.
* ``FixedSlotSpace``: C // L equal slots of L; the remainder C % L is never usable.

Pure Python, no torch. "No room" is ``None``; exceptions are for misuse or broken books.
"""

from __future__ import annotations

import abc
import bisect
import heapq

from pagedkv.errors import IntegrityError, UnknownSequenceError
from pagedkv.validation import check_int

Run = tuple[int, int]
"""A run of slots: (start, size)."""


class AddressSpace(abc.ABC):
    """What every placement offers the contiguous allocator."""

    def __init__(self, capacity: int) -> None:
        self.capacity: int = check_int("capacity", capacity, 1)
        self._regions: dict[int, int] = {}  # start -> slots held
        self._free: int = capacity  # slots not held by a region (C - sum of regions)

    @abc.abstractmethod
    def alloc(self, size: int) -> int | None:
        """Place a region of at least ``size`` slots; its start, or ``None`` if no room now."""

    @abc.abstractmethod
    def free(self, start: int) -> None:
        """Release the region that starts at ``start``."""

    @abc.abstractmethod
    def can_ever_fit(self, size: int) -> bool:
        """Whether ``size`` slots could be placed in the empty space."""

    @property
    @abc.abstractmethod
    def largest_free(self) -> int:
        """The largest region that could be placed now (0 if none)."""

    @abc.abstractmethod
    def holes(self) -> list[Run]:
        """The free runs as this space keeps them, sorted by start."""

    def held_size(self, size: int) -> int:
        """Slots a region asked for with ``size`` actually holds (``size`` unless rounded)."""
        return size

    def fits_now(self, size: int) -> bool:
        """Whether ``alloc(size)`` would succeed now (it changes nothing)."""
        return self.can_ever_fit(size) and self.held_size(size) <= self.largest_free

    def allocated_size(self, start: int) -> int:
        """Slots actually held by the region at ``start`` (e.g. the whole buddy block)."""
        return self._held(start)

    @property
    def free_slots(self) -> int:
        """Slots not held by any region (usable or not): C minus the slots held."""
        return self._free

    def regions(self) -> list[Run]:
        """The allocated runs, sorted by start."""
        return sorted(self._regions.items())

    def check_integrity(self) -> None:
        """Regions and holes partition [0, C) without overlap; the free counter agrees."""
        at = 0
        for start, size in sorted(self.regions() + self.holes()):
            if start != at or size < 1:
                raise IntegrityError(f"{type(self).__name__}: gap or overlap at slot {at}")
            at += size
        if at != self.capacity:
            raise IntegrityError(f"{type(self).__name__}: runs cover {at} of {self.capacity} slots")
        if self._free != self.capacity - sum(self._regions.values()):
            raise IntegrityError(f"{type(self).__name__}: free counter {self._free} is stale")

    def _check_size(self, size: int) -> int:
        return check_int("size", size, 1)

    def _held(self, start: int) -> int:
        try:
            return self._regions[start]
        except KeyError:
            raise UnknownSequenceError(f"no allocated region starts at slot {start}") from None


class FirstFitSpace(AddressSpace):
    """Holes kept sorted by start; a region takes the front of the lowest hole with room.

    Freeing merges the region with a hole just before and/or just after it, so no two holes
    are ever adjacent. O(holes) per operation.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._starts: list[int] = [0]  # hole starts, sorted
        self._hole: dict[int, int] = {0: capacity}  # hole start -> size

    def alloc(self, size: int) -> int | None:
        self._check_size(size)
        for i, start in enumerate(self._starts):
            room = self._hole[start]
            if room >= size:
                del self._hole[start]
                if room == size:
                    del self._starts[i]
                else:  # the rest of the hole stays in place: the list stays sorted
                    self._starts[i] = start + size
                    self._hole[start + size] = room - size
                self._regions[start] = size
                self._free -= size
                return start
        return None

    def free(self, start: int) -> None:
        size = self._held(start)
        del self._regions[start]
        self._free += size
        i = bisect.bisect_left(self._starts, start)
        if i < len(self._starts) and self._starts[i] == start + size:  # merge the hole after
            size += self._hole.pop(self._starts.pop(i))
        if i > 0 and (prev := self._starts[i - 1]) + self._hole[prev] == start:  # and before
            self._hole[prev] += size
        else:
            self._starts.insert(i, start)
            self._hole[start] = size

    def can_ever_fit(self, size: int) -> bool:
        return 1 <= size <= self.capacity

    @property
    def largest_free(self) -> int:
        return max(self._hole.values(), default=0)

    def holes(self) -> list[Run]:
        return [(s, self._hole[s]) for s in self._starts]

    def check_integrity(self) -> None:
        super().check_integrity()
        if self._starts != sorted(self._hole):
            raise IntegrityError("FirstFitSpace: hole index out of sync")
        for a, b in zip(self._starts, self._starts[1:], strict=False):
            if a + self._hole[a] == b:
                raise IntegrityError(f"FirstFitSpace: adjacent holes at {a} and {b} not merged")


def _order(size: int) -> int:
    """The smallest k with 2**k >= size."""
    return (size - 1).bit_length()


class BuddySpace(AddressSpace):
    """Buddy allocation over arenas cut from C by its binary decomposition, largest first.

    C = 1600 gives arenas [0, 1024), [1024, 1536), [1536, 1600). A request of ``size`` gets a
    block of 2**ceil(log2(size)) slots: the smallest free block big enough (lowest address among
    equals) is halved until it has that order. A freed block merges with its buddy (its
    address XOR its size, inside its arena) as long as the buddy is free too.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.arenas: list[tuple[int, int]] = []  # (base, order), largest first at address 0
        base = 0
        for k in range(capacity.bit_length() - 1, -1, -1):
            if capacity >> k & 1:
                self.arenas.append((base, k))
                base += 1 << k
        self._bases = [b for b, _ in self.arenas]
        self._free_lists: list[list[int]] = [[] for _ in range(capacity.bit_length())]
        self._free_order: dict[int, int] = {}  # free block start -> order
        for b, k in self.arenas:
            self._push(b, k)

    def block_size_for(self, size: int) -> int:
        """The power of two actually given for a request of ``size`` slots."""
        return 1 << _order(self._check_size(size))

    def held_size(self, size: int) -> int:
        return self.block_size_for(size)

    def largest_block(self) -> int:
        """The largest free block (0 if none)."""
        return max((1 << k for k, fl in enumerate(self._free_lists) if fl), default=0)

    @property
    def largest_free(self) -> int:
        return self.largest_block()

    def can_ever_fit(self, size: int) -> bool:
        return size >= 1 and self.block_size_for(size) <= 1 << self.arenas[0][1]

    def fits_now(self, size: int) -> bool:
        """Some free block has the order ``alloc`` wants, or a larger one (O(log C))."""
        return self.can_ever_fit(size) and any(self._free_lists[_order(size) :])

    def alloc(self, size: int) -> int | None:
        want = _order(self._check_size(size))
        k = next((j for j in range(want, len(self._free_lists)) if self._free_lists[j]), None)
        if k is None:
            return None
        start = self._free_lists[k].pop(0)  # lowest address of the smallest order with room
        del self._free_order[start]
        while k > want:  # keep the lower half, free the upper half
            k -= 1
            self._push(start + (1 << k), k)
        self._regions[start] = 1 << want
        self._free -= 1 << want
        return start

    def free(self, start: int) -> None:
        size = self._held(start)
        del self._regions[start]
        self._free += size
        base, top = self._arena_of(start)
        k, off = _order(size), start - base
        while k < top and self._free_order.get(base + (off ^ (1 << k))) == k:
            buddy = base + (off ^ (1 << k))
            del self._free_order[buddy]
            self._free_lists[k].remove(buddy)
            off &= ~(1 << k)
            k += 1
        self._push(base + off, k)

    def holes(self) -> list[Run]:
        return sorted((s, 1 << k) for s, k in self._free_order.items())

    def check_integrity(self) -> None:
        super().check_integrity()
        listed = {(s, k) for k, fl in enumerate(self._free_lists) for s in fl}
        if listed != set(self._free_order.items()) or any(
            fl != sorted(fl) for fl in self._free_lists
        ):
            raise IntegrityError("BuddySpace: free lists out of sync")
        blocks = [(s, _order(n), False) for s, n in self._regions.items()]
        blocks += [(s, k, True) for s, k in self._free_order.items()]
        for start, k, is_free in blocks:
            base, top = self._arena_of(start)
            if (start - base) % (1 << k) or k > top:
                raise IntegrityError(f"BuddySpace: block ({start}, {1 << k}) misaligned")
            buddy = base + ((start - base) ^ (1 << k))
            if is_free and k < top and self._free_order.get(buddy) == k:
                raise IntegrityError(f"BuddySpace: free buddies {start} and {buddy} not merged")

    def _push(self, start: int, k: int) -> None:
        bisect.insort(self._free_lists[k], start)
        self._free_order[start] = k

    def _arena_of(self, start: int) -> tuple[int, int]:
        return self.arenas[bisect.bisect_right(self._bases, start) - 1]


class FixedSlotSpace(AddressSpace):
    """C // slot_len equal slots; a region takes the lowest free slot, whatever its size.

    The course lesson's layout: every request reserves a whole slot of max_model_len. The tail
    [num_slots * slot_len, C) is never usable (it still counts as free, unallocated memory).
    """

    def __init__(self, capacity: int, slot_len: int) -> None:
        super().__init__(capacity)
        self.slot_len: int = check_int("slot_len", slot_len, 1)
        self.num_slots: int = capacity // slot_len
        self._free_idx: list[int] = list(range(self.num_slots))  # a heap (sorted is a heap)

    def alloc(self, size: int) -> int | None:
        if not self.can_ever_fit(self._check_size(size)) or not self._free_idx:
            return None
        start = heapq.heappop(self._free_idx) * self.slot_len
        self._regions[start] = self.slot_len
        self._free -= self.slot_len
        return start

    def free(self, start: int) -> None:
        self._held(start)
        del self._regions[start]
        self._free += self.slot_len
        heapq.heappush(self._free_idx, start // self.slot_len)

    def held_size(self, size: int) -> int:
        return self.slot_len

    def can_ever_fit(self, size: int) -> bool:
        return 1 <= size <= self.slot_len and self.num_slots > 0

    @property
    def largest_free(self) -> int:
        return self.slot_len if self._free_idx else 0

    def holes(self) -> list[Run]:
        """The free slots, then the unusable tail (if C % slot_len > 0)."""
        runs = sorted((i * self.slot_len, self.slot_len) for i in self._free_idx)
        tail = self.num_slots * self.slot_len
        return runs + ([(tail, self.capacity - tail)] if tail < self.capacity else [])

    def check_integrity(self) -> None:
        super().check_integrity()
        taken = {s // self.slot_len for s in self._regions}
        if any(s % self.slot_len for s in self._regions) or taken & set(self._free_idx):
            raise IntegrityError("FixedSlotSpace: a slot is both free and taken, or misaligned")
        if len(taken) + len(self._free_idx) != self.num_slots:
            raise IntegrityError("FixedSlotSpace: slots lost or duplicated")

"""The one interface the scheduler sees, shared by the paged manager and the contiguous baselines.

can/do pairs: ``can_allocate`` answers OK / LATER / NEVER and never changes state; ``allocate``,
``append_slots`` and ``fork`` return ``None`` when there is no room and then change nothing.
Exceptions are for misuse (unknown sequence id) or broken invariants only.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Sequence
from typing import NamedTuple, Protocol, runtime_checkable

from pagedkv.memory.usage import MemoryUsage

SeqId = Hashable
"""Any hashable sequence id (an int, a string, a (request, index) tuple...)."""


class AllocStatus(enum.Enum):
    """The answer of ``can_allocate``."""

    OK = "ok"
    """Room now."""
    LATER = "later"
    """No room now (or it would eat into the watermark); would fit in an emptier pool."""
    NEVER = "never"
    """Cannot fit even in an empty pool: reject, do not queue."""


class BlockCopy(NamedTuple):
    """Copy the K/V of GPU block ``src`` into GPU block ``dst`` (copy-on-write)."""

    src: int
    dst: int


class SlotCopy(NamedTuple):
    """Copy ``length`` token slots starting at ``src`` to ``dst`` in a linear address space."""

    src: int
    dst: int
    length: int


class SwapMapping(NamedTuple):
    """Copy block ``src`` of one pool into block ``dst`` of the other (GPU->CPU on swap out,
    CPU->GPU on swap in)."""

    src: int
    dst: int


@runtime_checkable
class CopyQueue(Protocol):
    """An allocator whose ``allocate`` may copy blocks (explicit pinned prefixes copy a shared
    partial last block before the prompt writes into it): the scheduler hands what
    ``take_copies`` returns to the executor with the admission's iteration."""

    def take_copies(self) -> list[BlockCopy]:
        """The copies made since the last call (each returned once)."""
        ...


@runtime_checkable
class ExplainsNever(Protocol):
    """An allocator whose NEVER has more than one cause (the paged manager's watermark): it
    says which, for the request's reject reason."""

    def never_reason(
        self,
        num_tokens: int,
        *,
        token_ids: Sequence[int] | None = None,
        final_len: int | None = None,
    ) -> str: ...

    def usable_blocks(self, num_tokens: int, token_ids: Sequence[int] | None = None) -> int:
        """The blocks a sequence whose first tokens are these could ever hold (the paged
        manager's pool less the pinned blocks it does not share)."""
        ...


@runtime_checkable
class KVAllocator(Protocol):
    """What the paged manager and the contiguous allocators both offer."""

    @property
    def capacity(self) -> int:
        """C: KV capacity in token slots."""
        ...

    def can_allocate(
        self,
        seq_id: SeqId,
        num_tokens: int,
        *,
        token_ids: Sequence[int] | None = None,
        final_len: int | None = None,
    ) -> AllocStatus: ...

    def allocate(
        self,
        seq_id: SeqId,
        num_tokens: int,
        *,
        token_ids: Sequence[int] | None = None,
        final_len: int | None = None,
    ) -> int | None:
        """Give ``seq_id`` slots for its first ``num_tokens`` tokens; return how many of them are
        already computed (prefix-cache hits; 0 without caching), or ``None`` if no room."""
        ...

    def append_slots(
        self, seq_id: SeqId, num_tokens: int = 1, *, token_ids: Sequence[int] | None = None
    ) -> list[BlockCopy] | list[SlotCopy] | None:
        """Slots for ``num_tokens`` more tokens; the copies to perform first, or ``None``
        if no room."""
        ...

    def fork(
        self, parent: SeqId, child: SeqId, *, final_len: int | None = None
    ) -> list[BlockCopy] | list[SlotCopy] | None: ...

    def free(self, seq_id: SeqId) -> None: ...

    def has_seq(self, seq_id: SeqId) -> bool: ...

    def num_tokens(self, seq_id: SeqId) -> int: ...

    def room(self, seq_id: SeqId) -> int:
        """Tokens ``seq_id`` can append with no allocation and no copy."""
        ...

    @property
    def blocks_saved_by_sharing(self) -> int:
        """Blocks that sharing saves now (references from sequences - blocks in use)."""
        ...

    def rooms(self, seq_ids: Sequence[SeqId]) -> list[int]:
        """``room`` of each sequence, in one call."""
        ...

    def can_append_all(self, seq_ids: Sequence[SeqId], num_tokens: int) -> bool:
        """Would ``append_slots(s, num_tokens)`` succeed for each sequence, in order?"""
        ...

    def append_slots_all(
        self,
        seq_ids: Sequence[SeqId],
        num_tokens: int,
        token_ids: Sequence[Sequence[int] | None] | None = None,
    ) -> Sequence[BlockCopy | SlotCopy]:
        """``append_slots(s, num_tokens)`` for each sequence, room checked by the caller (a
        decode round, or a fast-forward window, in one call); returns the copies in order and
        raises ``PagedKVError`` if one fails."""
        ...

    @property
    def growth_block_size(self) -> int | None:
        """Slots each allocation adds once room runs out (None: it cannot grow)."""
        ...

    def usage(self, waiting_for_memory: bool = False) -> MemoryUsage: ...

    def check_integrity(self) -> None: ...

"""Explicit (pinned) prefixes: the part of ``KVCacheManager`` that keeps registered prefixes.

A registered prefix (a system prompt, a few-shot example) gets its blocks once, at
registration, and a *pin* on each: one reference in the pool's counts that only
``unregister_prefix`` drops, so a pinned block is never free, never evicted, never reused::

    prefix "p" (10 tokens, block size 4):   [ b0: 4 | b1: 4 | b2: 2 of 4 ]   pin on each
    request "r" = p + 5 tokens of its own:  [ b0    | b1    | c: 2 + 2   | d: 3 ]
                                             shared   shared  copy of b2   own

A request whose prompt starts with a registered prefix (and has at least one token after it:
its logits must be computed) shares *all* the prefix's blocks and starts with the prefix's
tokens computed. Unlike automatic prefix caching (full blocks only), that includes the partial
last block: the request's first write into it (its own prompt, at admission) copies it first
(copy-on-write), so the pinned block keeps exactly the prefix and the copy reaches the executor
through ``take_copies`` (the scheduler adds it to the iteration's ``copies``). The copy costs a
block, as the request's own partial block would; what it saves is the prefill of those tokens.

Books: pinned tokens are token states, counted once however many requests share them; the empty
slots of a pinned partial last block are internal fragmentation (allocated, never filled).
``check_integrity`` counts a pin as one reference (reference count = table references + pins).
Explicit mode and automatic caching exclude each other (``CacheConfig``), so a prefix hit is a
pinned one exactly when prefixes are registered.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from pagedkv.errors import ConfigError, IntegrityError, UnknownSequenceError
from pagedkv.memory.block_table import BlockTable, cdiv
from pagedkv.memory.interface import BlockCopy
from pagedkv.memory.prefix_hash import check_token_ids
from pagedkv.memory.swapping import SwapMixin


@dataclass(frozen=True)
class PinnedPrefix:
    """A registered prefix: its token ids and the pinned GPU blocks that hold them."""

    prefix_id: Hashable
    token_ids: tuple[int, ...]
    blocks: tuple[int, ...]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


class PinnedPrefixMixin(SwapMixin):
    """Registration, matching and books of pinned prefixes (the manager's state, declared in
    ``SwapMixin`` and set up by ``_init_pins``)."""

    block_size: int

    def _init_pins(self) -> None:
        self._pins: dict[Hashable, PinnedPrefix] = {}
        # first token id -> prefixes starting with it: a lookup compares only plausible ones
        self._pins_by_first: dict[int, list[PinnedPrefix]] = {}
        self._num_pinned_blocks = 0
        self._pinned_empty_slots = 0  # empty slots of pinned partial last blocks
        self._pending_copies: list[BlockCopy] = []

    # ----- registration -------------------------------------------------------------------
    def register_prefix(self, prefix_id: Hashable, token_ids: Sequence[int]) -> PinnedPrefix:
        """Allocate and pin blocks for ``token_ids`` (computed once, by whoever registers).

        Raises ``ConfigError`` when explicit mode is off, the id or the same ids are already
        registered, or the blocks would not fit in the free pool above the watermark.
        """
        self._settle()
        if not self.config.enable_pinned_prefixes:
            raise ConfigError(
                "enable_pinned_prefixes", False, "must be True to register pinned prefixes"
            )
        ids = tuple(token_ids)
        check_token_ids("token_ids", ids)
        if not ids:
            raise ConfigError("token_ids", 0, "a pinned prefix needs at least 1 token")
        if prefix_id in self._pins:
            raise ConfigError("prefix_id", prefix_id, "is already registered")
        if any(p.token_ids == ids for p in self._pins_by_first.get(ids[0], ())):
            raise ConfigError("token_ids", f"{len(ids)} ids", "are already registered")
        needed = cdiv(len(ids), self.block_size)
        room = self.gpu.num_free - self.config.watermark_blocks
        if needed > room:
            raise ConfigError(
                "enable_pinned_prefixes",
                f"prefix {prefix_id!r}: {len(ids)} tokens = {needed} blocks",
                f"must fit in the {room} free blocks above the watermark "
                f"({self._num_pinned_blocks} already pinned of {self.gpu.num_blocks})",
            )
        blocks = tuple(self.gpu.allocate() for _ in range(needed))  # reference 1: the pin
        prefix = PinnedPrefix(prefix_id, ids, blocks)
        self._pins[prefix_id] = prefix
        self._pins_by_first.setdefault(ids[0], []).append(prefix)
        self._num_pinned_blocks += needed
        self._token_slots += len(ids)
        self._pinned_empty_slots += needed * self.block_size - len(ids)
        return prefix

    def unregister_prefix(self, prefix_id: Hashable) -> None:
        """Drop the pins; blocks still shared by sequences stay theirs until they free them."""
        self._settle()
        prefix = self._pins.pop(prefix_id, None)
        if prefix is None:
            raise UnknownSequenceError(f"prefix {prefix_id!r} is not registered")
        self._pins_by_first[prefix.token_ids[0]].remove(prefix)
        if not self._pins_by_first[prefix.token_ids[0]]:
            del self._pins_by_first[prefix.token_ids[0]]
        bs = self.block_size
        for j, block in enumerate(prefix.blocks):
            if self.gpu.decref(block):  # no sequence holds it: its tokens leave the books
                self._token_slots -= min(bs, prefix.num_tokens - j * bs)
        self._num_pinned_blocks -= len(prefix.blocks)
        self._pinned_empty_slots -= len(prefix.blocks) * bs - prefix.num_tokens

    # ----- queries ------------------------------------------------------------------------
    def pinned_prefixes(self) -> list[PinnedPrefix]:
        """The registered prefixes, in registration order."""
        return list(self._pins.values())

    @property
    def num_pinned_blocks(self) -> int:
        return self._num_pinned_blocks

    def take_copies(self) -> list[BlockCopy]:
        """Copy-on-write copies made by ``allocate`` (of a pinned partial last block) since the
        last call; the scheduler hands them to the executor before the iteration writes."""
        copies, self._pending_copies = self._pending_copies, []
        return copies

    def match_prefix(
        self, token_ids: Sequence[int], num_tokens: int | None = None
    ) -> PinnedPrefix | None:
        """The longest registered prefix that starts ``token_ids`` and leaves at least one of
        the first ``num_tokens`` (default: all) tokens to compute, or None."""
        if not self._pins_by_first or not token_ids:
            return None
        limit = len(token_ids) if num_tokens is None else min(num_tokens, len(token_ids))
        best: PinnedPrefix | None = None
        for prefix in self._pins_by_first.get(token_ids[0], ()):
            n = prefix.num_tokens
            longer = best is None or n > best.num_tokens
            if n < limit and longer and tuple(token_ids[:n]) == prefix.token_ids:
                best = prefix
        return best

    # ----- hooks the manager calls --------------------------------------------------------
    def _pinned_apart(self, num_computed_tokens: int) -> int:
        """Pinned blocks an allocation whose hit is ``num_computed_tokens`` cannot use: all
        but the full ones it shares (a shared partial one is copied into a block of its own)."""
        if not self._pins:
            return 0
        return self._num_pinned_blocks - num_computed_tokens // self.block_size

    def _cached_gpu_block(self, table: BlockTable, j: int) -> int | None:
        """Swap-in reuses a pinned full block instead of copying the CPU one back."""
        if not self._pins:
            return super()._cached_gpu_block(table, j)
        prefix = self.match_prefix(table.token_ids, table.num_tokens)
        if prefix is not None and j < prefix.num_tokens // self.block_size:
            return prefix.blocks[j]
        return None

    def _add_pin_refs(self, expected_refs: list[int]) -> None:
        """``check_integrity``'s share of the reference counts: one per pin."""
        blocks = 0
        for prefix in self._pins.values():
            for block in prefix.blocks:
                expected_refs[block] += 1
            blocks += len(prefix.blocks)
        if blocks != self._num_pinned_blocks:
            raise IntegrityError(
                f"pinned books: {self._num_pinned_blocks} blocks recorded, prefixes hold {blocks}"
            )

    def _add_pin_slots(self, slots: dict[int, int]) -> None:
        """``check_integrity``'s share of the token slots: pinned tokens count once, and a
        pinned block that a sequence also holds must hold the same tokens in both."""
        bs = self.block_size
        empty = 0
        for prefix in self._pins.values():
            for j, block in enumerate(prefix.blocks):
                fill = min(bs, prefix.num_tokens - j * bs)
                if slots.setdefault(block, fill) != fill:
                    raise IntegrityError(
                        f"pinned block {block} of prefix {prefix.prefix_id!r} holds {fill} "
                        f"tokens, a sequence's table says {slots[block]}"
                    )
                empty += bs - fill
        if empty != self._pinned_empty_slots:
            raise IntegrityError(
                f"pinned books: {self._pinned_empty_slots} empty slots recorded, "
                f"prefixes leave {empty}"
            )

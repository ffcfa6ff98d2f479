"""Books for the partially filled last blocks: where paged memory's reservation and internal
fragmentation live.

A paged sequence holds ceil(T / bs) blocks, so only its last block can have empty slots. Those
slots are reservation if the sequence will fill them (its final length F reaches them) and
internal fragmentation if it never will::

    last block:  | tokens (fill) | reservation ... want | internal frag ... bs |
                 0               f                      w                     bs

    w = min(bs, F - start_of_block)   (bs when F is unknown: assume it will fill up)

After a fork, parent and child share the partial last block until one appends (copy-on-write);
a shared slot counts once, so a block's w is the largest among the sequences that end in it.
"""

from __future__ import annotations

from collections.abc import Mapping

from pagedkv.errors import IntegrityError
from pagedkv.memory.block_table import BlockTable
from pagedkv.memory.interface import SeqId


class TailBooks:
    """Running sums of reservation and internal fragmentation over partial last blocks."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._wants: dict[int, dict[SeqId, int]] = {}
        self._fill: dict[int, int] = {}
        self.reservation = 0
        self.internal = 0

    def _add(self, block: int, sign: int) -> None:
        want = max(self._wants[block].values())
        self.reservation += sign * (want - self._fill[block])
        self.internal += sign * (self.block_size - want)

    def track(self, seq_id: SeqId, table: BlockTable) -> None:
        """Count the table's last block (call after the table changed), if it is partial."""
        blocks = table.blocks
        if not blocks:
            return
        bs = self.block_size
        start = (len(blocks) - 1) * bs
        fill = table.num_tokens - start  # table.fill of the last block, inlined (hot)
        if fill >= bs:
            return
        if fill < 0:
            fill = 0
        final = table.final_len
        want = bs if final is None else min(bs, max(final - start, fill))
        block = blocks[-1]
        wants = self._wants.get(block)
        if wants is None:  # a block no one counts yet (the usual case): its own books
            self._wants[block] = {seq_id: want}
            self._fill[block] = fill
            self.reservation += want - fill
            self.internal += bs - want
            return
        self._add(block, -1)
        wants[seq_id] = want
        self._fill[block] = fill
        self._add(block, +1)

    def untrack(self, seq_id: SeqId, table: BlockTable) -> None:
        """Stop counting the table's last block (call before the table changes)."""
        if not table.blocks:
            return
        block = table.blocks[-1]
        # Only partial last blocks are counted, and sharers of a block share its fill: its
        # books are there iff the table's last block is partial (no fill to work out here).
        wants = self._wants.get(block)
        if wants is None:
            return
        if len(wants) == 1:  # the sequence's own block (the usual case): drop its books
            want = wants[seq_id]
            self.reservation -= want - self._fill[block]
            self.internal -= self.block_size - want
            del self._wants[block], self._fill[block]
            return
        self._add(block, -1)
        del wants[seq_id]
        self._add(block, +1)

    def advance(self, seq_id: SeqId, table: BlockTable, old_fill: int) -> None:
        """Fast path of untrack + track for tokens written into the table's own partial last
        block (not shared, no new block): ``table`` already holds the new tokens."""
        bs = self.block_size
        block = table.blocks[-1]
        wants = self._wants[block]
        old_want = wants[seq_id]
        self.reservation -= old_want - old_fill
        self.internal -= bs - old_want
        fill = table.num_tokens - (len(table.blocks) - 1) * bs
        if fill == bs:
            del self._wants[block], self._fill[block]
            return
        final = table.final_len
        start = table.num_tokens - fill
        want = bs if final is None else min(bs, max(final - start, fill))
        wants[seq_id] = want
        self._fill[block] = fill
        self.reservation += want - fill
        self.internal += bs - want

    def grow_all(self, grown: list[tuple[SeqId, BlockTable, int]]) -> None:
        """Untrack + track for each (seq_id, table, old_tokens): a sequence that owns its blocks
        alone (no shared last block) and grew from ``old_tokens`` tokens, possibly into new
        blocks; ``table`` already holds the new tokens and blocks. One call per bulk append,
        the sums kept in locals."""
        bs = self.block_size
        wants, fills = self._wants, self._fill
        reservation = internal = 0
        for seq_id, table, old in grown:
            new = table.num_tokens
            final = table.final_len
            old_fill = old % bs
            if old_fill:
                fill = old_fill + new - old
                if fill < bs:  # still in the same partial last block: move its books in place
                    block = table.blocks[-1]
                    old_want = wants[block][seq_id]
                    start = new - fill
                    want = bs if final is None else min(bs, max(final - start, fill))
                    wants[block][seq_id] = want
                    fills[block] = fill
                    reservation += (want - fill) - (old_want - old_fill)
                    internal += old_want - want
                    continue
                block = table.blocks[(old - 1) // bs]  # the old last block, now full
                old_want = wants.pop(block)[seq_id]
                del fills[block]
                reservation -= old_want - old_fill
                internal -= bs - old_want
            fill = new % bs
            if fill:
                want = bs if final is None else min(bs, max(final - new + fill, fill))
                block = table.blocks[-1]
                wants[block] = {seq_id: want}
                fills[block] = fill
                reservation += want - fill
                internal += bs - want
        self.reservation += reservation
        self.internal += internal

    def fill_in_place(self, blocks: list[int], num_tokens: int) -> None:
        """``num_tokens`` more tokens in each of these unshared partial last blocks, none of
        which fills up or passes its sequence's final length F. A block's want is then
        min(bs, F - start) before and after, so only fill and reservation move."""
        fills = self._fill
        for block in blocks:
            fills[block] += num_tokens
        self.reservation -= num_tokens * len(blocks)

    def check(self, tables: Mapping[SeqId, BlockTable]) -> None:
        """Recompute from scratch and compare with the running sums."""
        fresh = TailBooks(self.block_size)
        for seq_id, table in tables.items():
            fresh.track(seq_id, table)
        got = (self.reservation, self.internal, self._wants)
        want = (fresh.reservation, fresh.internal, fresh._wants)
        if got != want:
            raise IntegrityError(
                f"tail books off: reservation/internal {got[:2]} but tables give {want[:2]}"
            )

"""One sequence's block table: logical block j -> physical block ``blocks[j]``.

Token t of the sequence lives in slot ``t % block_size`` of ``blocks[t // block_size]``::

    tokens:   0 ........ bs-1 | bs ....... 2bs-1 | 2bs ... T-1  (free slots) |
    logical:  block 0         | block 1          | block 2 (last, partial)    |
    physical: blocks[0] = 7   | blocks[1] = 2    | blocks[2] = 9              |

The table only ever holds ceil(T / block_size) blocks: paging never reserves ahead. It does
the mechanics (take blocks, copy-on-write, fork, release) on a ``BlockPool``; the manager checks
room first and keeps the books.
"""

from __future__ import annotations

from collections.abc import Sequence

from pagedkv.errors import ConfigError
from pagedkv.memory.block_pool import BlockPool
from pagedkv.memory.interface import BlockCopy
from pagedkv.memory.prefix_hash import BlockHash, hash_blocks
from pagedkv.memory.token_runs import TokenRuns


def _own_ids(token_ids: Sequence[int]) -> list[int] | TokenRuns:
    """A table's own copy of ids: runs are immutable and shared as they are; anything else is
    copied into a list (the caller may change its own)."""
    return token_ids if type(token_ids) is TokenRuns else list(token_ids)


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative ints."""
    return -(-a // b)


class BlockTable:
    """Blocks, token count and (when known) token ids and block keys of one sequence."""

    __slots__ = (
        "block_hashes",
        "block_size",
        "blocks",
        "final_len",
        "num_tokens",
        "salt",
        "token_ids",
        "tokens_known",
    )

    def __init__(
        self,
        block_size: int,
        *,
        token_ids: Sequence[int] | None = None,
        final_len: int | None = None,
        salt: bytes | None = None,
    ) -> None:
        self.block_size = block_size
        self.blocks: list[int] = []
        self.num_tokens = 0
        # Token ids known so far; they may run ahead of num_tokens (a whole prompt is known
        # before all of it has slots). Once a token is appended without its id, later ids can
        # no longer be placed, so keys stop there (tokens_known = False). Runs stay runs
        # (immutable, O(runs)) while every id appended comes as runs; a list otherwise.
        self.token_ids: list[int] | TokenRuns = _own_ids(token_ids) if token_ids is not None else []
        self.tokens_known = token_ids is not None
        self.block_hashes: list[BlockHash] = []  # keys of blocks 0..len-1 (full, known tokens)
        self.final_len = final_len
        self.salt = salt

    # ----- derived ---------------------------------------------------------------------------
    @property
    def num_slots(self) -> int:
        """Allocated slots A = len(blocks) x block_size."""
        return len(self.blocks) * self.block_size

    def fill(self, j: int) -> int:
        """Tokens held by logical block j."""
        return max(0, min(self.block_size, self.num_tokens - j * self.block_size))

    def blocks_needed(self, num_new_tokens: int) -> int:
        """New blocks that ``num_new_tokens`` more tokens take, copy-on-write not counted."""
        return cdiv(self.num_tokens + num_new_tokens, self.block_size) - len(self.blocks)

    def needs_cow(self, pool: BlockPool, num_new_tokens: int) -> bool:
        """Would appending write into a partially filled last block that others share?"""
        return (
            num_new_tokens > 0
            and self.num_tokens % self.block_size != 0
            and pool.ref_counts[self.blocks[-1]] > 1
        )

    # ----- mechanics (room checked by the caller) --------------------------------------------
    def append_slots(self, pool: BlockPool, num_new_tokens: int) -> list[BlockCopy]:
        """Slots for ``num_new_tokens`` more tokens; copy-on-write first if the last block is
        shared.

        Returns the copies the executor must perform before writing.
        """
        copies: list[BlockCopy] = []
        if self.needs_cow(pool, num_new_tokens):
            src = self.blocks[-1]
            dst = pool.allocate()
            pool.decref(src)  # still referenced by the others: never frees here
            self.blocks[-1] = dst
            copies.append(BlockCopy(src, dst))
        self.blocks += pool.allocate_many(self.blocks_needed(num_new_tokens))
        self.num_tokens += num_new_tokens
        return copies

    def note_token_ids(self, num_new_tokens: int, token_ids: Sequence[int] | None) -> None:
        """Record the ids of the ``num_new_tokens`` tokens just appended (positions T-n .. T-1)."""
        start = self.num_tokens - num_new_tokens
        if token_ids is not None and len(token_ids) != num_new_tokens:
            raise ConfigError(
                "token_ids", len(token_ids), f"must hold exactly num_tokens={num_new_tokens} ids"
            )
        if not self.tokens_known or len(self.token_ids) >= self.num_tokens:
            return  # ids already known (they ran ahead), or lost for good
        if token_ids is None or len(self.token_ids) != start:
            self.tokens_known = False
            return
        self.extend_ids(token_ids)

    def extend_ids(self, token_ids: Sequence[int]) -> None:
        """Append ids to ``token_ids``: runs onto runs stay runs (adjacent ones merge)."""
        known = self.token_ids
        if isinstance(known, list):  # (a builtin: no ABC check)
            known.extend(token_ids)
        elif type(token_ids) is TokenRuns:
            self.token_ids = known + token_ids
        else:
            self.token_ids = [*known, *token_ids]

    def new_block_keys(self, limit: int | None = None) -> list[tuple[int, BlockHash]]:
        """Keys for blocks that became full with known tokens since the last call (within the
        first ``limit`` tokens if given)."""
        bs = self.block_size
        known = min(self.num_tokens, len(self.token_ids))
        if limit is not None:
            known = min(known, limit)
        hashes = self.block_hashes
        first = len(hashes)
        if known // bs <= first:
            return []
        parent = hashes[-1] if first else None
        keys = hash_blocks(self.token_ids[first * bs : known], bs, self.salt, parent)
        hashes += keys
        return list(enumerate(keys, first))

    def fork(self, pool: BlockPool, final_len: int | None = None) -> BlockTable:
        """A child that shares every block (each reference count + 1)."""
        child = BlockTable(self.block_size, final_len=final_len, salt=self.salt)
        child.blocks = list(self.blocks)
        child.num_tokens = self.num_tokens
        child.token_ids = _own_ids(self.token_ids)
        child.tokens_known = self.tokens_known
        child.block_hashes = list(self.block_hashes)
        for block in self.blocks:
            pool.incref(block)
        return child

    def release(self, pool: BlockPool) -> list[int]:
        """Drop every reference, last block first (so a prefix's tail is evicted before its head).

        Returns the blocks that became free. The table is left empty of blocks.
        """
        freed = pool.release(self.blocks[::-1])
        self.blocks = []
        return freed

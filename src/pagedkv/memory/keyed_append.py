"""The bulk append under prefix caching: the part of ``KVCacheManager`` that appends k tokens
to many sequences at once (the fast-forward's window of k decode rounds) as k rounds of one
token per sequence would, with blocks keyed as they fill.

Which block gets a key, and which free cached block an allocation evicts, can depend on the
order in which the rounds take blocks and register keys: an allocation may evict the free
cached block that holds the very key a block of the window fills with (a recomputed request
meets its own old blocks), and two sequences may fill blocks with one key. Two paths:

* **blocks at once** (``_append_blocks``), when neither can happen: no key that a block of the
  window fills with is already cached, none is made twice, and no sequence writes into a
  shared partial block (a copy-on-write). Then registering a key touches only a used block
  and the cache map, never the free queue, so the order of registrations against allocations
  is immaterial: the new blocks are taken from the pool in the rounds' order (round by round,
  sequence by sequence, as the reference would take them), each table and the tail books
  move once, and the keys are made from the runs of the ids (``prefix_hash.keys_of``).
* **round by round** (``_append_in_rounds``) otherwise: only three kinds of token touch the
  pool or the cache: one that starts a block (an allocation, which may evict), one that fills
  a block (its key is registered), and the first into a shared partial block (a copy-on-write).
  The others only move their own table's count and the tail books, which commute with
  everything else; so each sequence's quiet tokens are appended in one piece just before its
  next such token, and those tokens keep the rounds' order.

Both leave the books exactly as the rounds would (tests/memory/test_manager_bulk.py).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from pagedkv.errors import PagedKVError
from pagedkv.memory.block_pool import BlockPool
from pagedkv.memory.block_table import BlockTable
from pagedkv.memory.interface import BlockCopy, SeqId
from pagedkv.memory.prefix_hash import BlockHash, keys_of
from pagedkv.memory.tail_books import TailBooks
from pagedkv.memory.token_runs import TokenRuns

_Plan = tuple[SeqId, BlockTable, int, Sequence[int] | None, "TokenRuns | None", list[BlockHash]]


class KeyedAppendMixin:
    """``append_slots_all``'s path with prefix caching on (the manager's books, below)."""

    gpu: BlockPool
    block_size: int
    _tables: dict[SeqId, BlockTable]
    _tails: TailBooks
    _token_slots: int

    def append_slots(
        self,
        seq_id: SeqId,
        num_tokens: int = 1,
        *,
        token_ids: Sequence[int] | None = None,
        cache_limit: int | None = None,
    ) -> list[BlockCopy] | None:
        raise NotImplementedError

    def _check_appended_ids(self, token_ids: Sequence[int], num_tokens: int) -> None:
        raise NotImplementedError

    def _append_rounds(
        self,
        seq_ids: Sequence[SeqId],
        num_tokens: int,
        token_ids: Sequence[Sequence[int] | None] | None,
    ) -> list[BlockCopy]:
        """``append_slots_all`` with prefix caching, as its rounds would (module docstring)."""
        if self._append_blocks(seq_ids, num_tokens, token_ids):
            return []
        return self._append_in_rounds(seq_ids, num_tokens, token_ids)

    def _append_blocks(
        self,
        seq_ids: Sequence[SeqId],
        k: int,
        token_ids: Sequence[Sequence[int] | None] | None,
    ) -> bool:
        """The append at once, if no key or copy-on-write can make the order matter; False,
        changing nothing, if one can. ``PagedKVError``, changing nothing, without room."""
        bs = self.block_size
        pool = self.gpu
        refs = pool.ref_counts
        cached = pool.lookup
        tables = self._tables
        check = self._check_appended_ids
        plan: list[_Plan] = []
        grown: list[tuple[SeqId, BlockTable, int]] = []
        made: set[BlockHash] = set()
        starts: list[int] = []  # each sequence's first round that starts a block (k: none)
        needed = 0
        for i, seq_id in enumerate(seq_ids):
            table = tables[seq_id]
            ids = None if token_ids is None else token_ids[i]
            if ids is not None:
                check(ids, k)  # (the reference checks each round's id)
            old = table.num_tokens
            fill = old % bs
            if fill and refs[table.blocks[-1]] > 1:
                return False  # a copy-on-write
            keys: list[BlockHash] = []
            joined: TokenRuns | None = None  # the table's ids after the append, when runs
            if table.tokens_known:
                known = table.token_ids
                if ids is None or len(known) != old or len(table.block_hashes) != old // bs:
                    return False  # ids lost here, ids ahead, or keys held back: rare
                if type(known) is TokenRuns and type(ids) is TokenRuns:
                    joined = known + ids
                full = (fill + k) // bs  # blocks that fill in the window
                if full:
                    start = old - fill
                    parent = table.block_hashes[-1] if start else None
                    if joined is not None:
                        j0 = start // bs
                        keys = keys_of(joined, j0, j0 + full, bs, table.salt, parent)
                    else:
                        block_ids = [*known[start:], *ids[: full * bs - fill]]
                        keys = keys_of(block_ids, 0, full, bs, table.salt, parent)
                    for key in keys:
                        if key in made or cached(key) is not None:
                            return False
                        made.add(key)
            plan.append((seq_id, table, old, ids, joined, keys))
            grown.append((seq_id, table, old))
            first = -old % bs
            starts.append(first if first < k else k)
            if first < k:
                needed += (k - first - 1) // bs + 1
        if needed > pool.num_free:
            raise PagedKVError(f"append_slots_all: {needed} new blocks, {pool.num_free} free")
        self._take_in_rounds(plan, starts, k, pool.allocate_many(needed))
        cache = pool.cache_block
        for _, table, old, ids, joined, keys in plan:
            table.num_tokens = old + k
            if table.tokens_known:
                if joined is not None:
                    table.token_ids = joined
                else:
                    assert ids is not None
                    table.extend_ids(ids)
                if keys:
                    blocks = table.blocks
                    for j, key in enumerate(keys, old // bs):
                        cache(blocks[j], key)
                    table.block_hashes += keys
        self._tails.grow_all(grown)
        self._token_slots += k * len(plan)
        return True

    def _take_in_rounds(
        self, plan: list[_Plan], starts: list[int], k: int, taken: list[int]
    ) -> None:
        """Hand the blocks ``taken`` (in the pool's order) to the sequences in the order of the
        rounds that start them: round r = starts[i] + m * block_size of sequence i, by (r, i)."""
        if not taken:
            return
        bs = self.block_size
        order = sorted(range(len(plan)), key=starts.__getitem__)  # stable: ties keep i
        firsts = [starts[i] for i in order]
        tables = [plan[i][1].blocks for i in order]
        pos = 0
        m = 0
        while pos < len(taken):
            # In cycle m, the sequences whose first start is < k - m * bs take one block each.
            count = bisect.bisect_left(firsts, k - m * bs)
            for blocks in tables[:count]:
                blocks.append(taken[pos])
                pos += 1
            m += 1

    def _append_in_rounds(
        self,
        seq_ids: Sequence[SeqId],
        num_tokens: int,
        token_ids: Sequence[Sequence[int] | None] | None,
    ) -> list[BlockCopy]:
        """The append round by round, each sequence's quiet tokens in one piece (module
        docstring)."""
        bs = self.block_size
        refs = self.gpu.ref_counts
        events: dict[int, list[int]] = {}  # round -> the sequences (in order) with an event
        for i, seq_id in enumerate(seq_ids):
            table = self._tables[seq_id]
            t0 = table.num_tokens
            starts = {-t0 % bs, (bs - 1 - t0) % bs}  # first rounds that start / fill a block
            if t0 % bs and table.blocks and refs[table.blocks[-1]] > 1:
                starts.add(0)
            rounds = sorted({r for s in starts for r in range(s, num_tokens, bs)})
            for r in rounds:
                events.setdefault(r, []).append(i)
        done = [0] * len(seq_ids)
        copies: list[BlockCopy] = []
        for r in sorted(events):
            for i in events[r]:
                seq_id = seq_ids[i]
                ids = None if token_ids is None else token_ids[i]
                if done[i] < r:
                    self._append_quiet(seq_id, done[i], r, ids)
                got = self.append_slots(
                    seq_id, 1, token_ids=None if ids is None else ids[r : r + 1]
                )
                if got is None:
                    raise PagedKVError(f"append_slots_all: no room for sequence {seq_id!r}")
                copies.extend(got)
                done[i] = r + 1
        for i, seq_id in enumerate(seq_ids):
            if done[i] < num_tokens:
                self._append_quiet(
                    seq_id, done[i], num_tokens, None if token_ids is None else token_ids[i]
                )
        return copies

    def _append_quiet(
        self, seq_id: SeqId, start: int, stop: int, ids: Sequence[int] | None
    ) -> None:
        """Tokens ``start:stop`` of a bulk append that neither start nor fill a block."""
        got = self.append_slots(
            seq_id, stop - start, token_ids=None if ids is None else ids[start:stop]
        )
        if got:  # the event schedule said no block is touched: a copy means it was wrong
            raise PagedKVError(f"append_slots_all: {seq_id!r} copied a block on a quiet append")
        if got is None:
            raise PagedKVError(f"append_slots_all: no room for sequence {seq_id!r}")

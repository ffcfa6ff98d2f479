"""Swapping between the GPU and CPU pools: the part of ``KVCacheManager`` that moves a
sequence group's blocks out to the CPU pool and back.

A group moves together: blocks shared among its sequences move once and stay shared on the CPU.
A block also used by a sequence that stays on the GPU is copied (the GPU keeps it for the
other). Swapping in reuses a GPU block whose prefix key is still cached, instead of copying.
Every method returns the block copies an executor must perform, or ``None`` (changing nothing)
when the destination pool is short.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

from pagedkv.errors import ConfigError, PagedKVError, UnknownSequenceError
from pagedkv.memory.block_pool import BlockPool
from pagedkv.memory.block_table import BlockTable, cdiv
from pagedkv.memory.config import CacheConfig
from pagedkv.memory.growth import Growth
from pagedkv.memory.interface import AllocStatus, SeqId, SwapMapping
from pagedkv.memory.tail_books import TailBooks
from pagedkv.validation import as_int

# can_swap_in's answers as globals: an enum member looked up on its class costs CPython 3.11
# about four times a global read, and a vllm policy asks at every round while one is swapped.
_OK, _LATER, _NEVER = AllocStatus.OK, AllocStatus.LATER, AllocStatus.NEVER


def _group(seq_ids: Iterable[SeqId]) -> list[SeqId]:
    """The sequences of one swap, each once: a repeated id is refused before anything moves
    (it would be moved twice)."""
    ids = list(seq_ids)
    if len(ids) > 1 and len(set(ids)) != len(ids):
        seen: set[SeqId] = set()
        for seq_id in ids:
            if seq_id in seen:
                raise ConfigError("seq_ids", seq_id, "must name each sequence once")
            seen.add(seq_id)
    return ids


class SwapMixin:
    """Swap operations over the manager's pools, tables and books (declared below)."""

    config: CacheConfig
    gpu: BlockPool
    cpu: BlockPool
    _growth: Growth
    _tables: dict[SeqId, BlockTable]
    _swapped: dict[SeqId, BlockTable]
    _tails: TailBooks
    _token_slots: int
    _swapped_out: int
    _swapped_in: int
    _ids_read: bool
    _watermark_blocks: int

    def _release_gpu(self, table: BlockTable) -> None:
        raise NotImplementedError

    def _settle(self, only: Iterable[SeqId] | None = None) -> None:
        raise NotImplementedError

    @property
    def num_free_blocks(self) -> int:
        raise NotImplementedError

    def _settle_pool(self) -> None:
        raise NotImplementedError

    def _settle_for_swap_in(self) -> None:
        """A swap-in reads no growing sequence's blocks, only how many are free, unless a
        cached free block may stand in for a CPU one (under prefix caching: growth's blocks
        not chosen yet may be cached free ones). A pinned prefix's blocks are never free, so
        growth never takes them: pinned prefixes alone need nothing brought up to date."""
        if self.config.enable_prefix_caching:
            self._settle_pool()

    def _register_keys(self, table: BlockTable) -> None:
        raise NotImplementedError

    def can_swap_out(self, seq_ids: Iterable[SeqId]) -> bool:
        """Does the CPU pool have a block for every distinct GPU block of these sequences?"""
        ids = _group(seq_ids)
        self._settle(ids)
        return len(self._distinct_blocks(ids, self._tables)) <= self.cpu.num_free

    def swap_out(self, seq_ids: Iterable[SeqId]) -> list[SwapMapping] | None:
        """Move these sequences (swap a sequence group together) to the CPU pool.

        Returns the GPU -> CPU block copies to perform, or ``None`` (changing nothing) if the CPU
        pool is short. Blocks shared among the sequences stay shared on the CPU. A block also
        referenced by a sequence that stays on the GPU is copied, and stays there for the other.
        """
        ids = _group(seq_ids)
        if len(ids) == 1 and ids[0] in self._growth.seqs and not self.config.enable_prefix_caching:
            return self._swap_out_grower(ids[0])
        self._settle(ids)  # (their blocks are read; other growing sequences go on)
        if len(ids) == 1:
            return self._swap_out_one(ids[0])
        return self._swap_out_group(ids)

    def _swap_out_group(self, ids: list[SeqId]) -> list[SwapMapping] | None:
        """``swap_out`` of settled sequences, blocks shared among them moved once."""
        distinct = self._distinct_blocks(ids, self._tables)
        if len(distinct) > self.cpu.num_free:
            return None
        to_cpu = {gpu: self.cpu.allocate() for gpu in distinct}
        for seq_id in ids:
            table = self._tables.pop(seq_id)
            self._tails.untrack(seq_id, table)
            gpu_blocks = list(table.blocks)
            self._release_gpu(table)
            table.blocks = [to_cpu[b] for b in gpu_blocks]
            self._swapped[seq_id] = table
        for cpu_block, refs in self._count_refs(ids, self._swapped).items():
            for _ in range(refs - 1):  # allocate() gave one reference already
                self.cpu.incref(cpu_block)
        self._swapped_out += len(to_cpu)
        return [SwapMapping(g, c) for g, c in to_cpu.items()]

    def can_swap_in(self, seq_ids: Iterable[SeqId], num_new_tokens: int = 0) -> AllocStatus:
        """Would swapping these sequences back in fit, honouring the watermark, with room
        left for ``num_new_tokens`` more tokens of each (so that a resumed request can take
        its next step instead of going straight back out)?"""
        self._settle_for_swap_in()
        ids = _group(seq_ids)
        if type(num_new_tokens) is not int or num_new_tokens < 0:
            num_new_tokens = as_int("num_new_tokens", num_new_tokens, 0)
        table = self._swapped.get(ids[0]) if len(ids) == 1 else None
        if table is not None and not self._ids_read:  # (a vllm policy asks at every round)
            needed = len(table.blocks)  # ``_swap_in_blocks_taken``, one table
        else:
            needed = self._swap_in_blocks_taken(ids)
        wm = self._watermark_blocks
        if self.gpu.num_blocks - needed < wm:
            return _NEVER
        needed += self._growth_blocks(ids, num_new_tokens)
        return _OK if self.num_free_blocks - needed >= wm else _LATER

    def swap_in(self, seq_ids: Iterable[SeqId]) -> list[SwapMapping] | None:
        """Bring swapped sequences back; CPU -> GPU copies to perform, or ``None`` if no room.

        A block whose key is still in the GPU prefix cache is reused without a copy.
        """
        self._settle_for_swap_in()
        ids = _group(seq_ids)
        if self._swap_in_blocks_taken(ids) > self.num_free_blocks:
            return None
        if len(ids) == 1 and not self._ids_read:
            return self._swap_in_one(ids[0])
        return self._swap_in_group(ids)

    def _swap_in_group(self, ids: list[SeqId]) -> list[SwapMapping]:
        """``swap_in`` once the room is checked: a cached GPU block stands in where it can."""
        to_gpu: dict[int, int] = {}
        copies: list[SwapMapping] = []
        for seq_id in ids:
            table = self._swapped.pop(seq_id)
            cpu_blocks = list(table.blocks)
            for j, cpu_block in enumerate(cpu_blocks):
                if cpu_block not in to_gpu:
                    to_gpu[cpu_block] = self._gpu_block_for_swap_in(table, j, cpu_block, copies)
                else:
                    self.gpu.incref(to_gpu[cpu_block])
            table.release(self.cpu)
            table.blocks = [to_gpu[c] for c in cpu_blocks]
            self._register_keys(table)
            self._tables[seq_id] = table
            self._tails.track(seq_id, table)
        self._swapped_in += len(copies)
        return copies

    # ----- internals --------------------------------------------------------------------------
    def _swap_out_grower(self, seq_id: SeqId) -> list[SwapMapping] | None:
        """``swap_out`` of one growing sequence without prefix caching: settling it (``_settle``)
        would append its tokens since it joined, taking the blocks growth holds for them, and
        move its tail books, which the swap then drops. Here the blocks are taken as settling
        takes them (the same ones) and go out with the rest; the books move once."""
        table = self._tables[seq_id]
        blocks = table.blocks
        if table.tokens_known or (blocks and self.gpu.ref_counts[blocks[-1]] > 1):
            self._settle((seq_id,))  # (keys to make, or a copy-on-write: appended one by one)
            return self._swap_out_one(seq_id)
        growth = self._growth
        tokens = table.num_tokens + growth.round - growth.seqs[seq_id].join
        need = cdiv(tokens, self.config.block_size) - len(blocks)
        if len(blocks) + need > self.cpu.num_free:
            self._settle((seq_id,))  # (the call changes nothing but the settling)
            return None
        self._tails.untrack(seq_id, table)  # (its last block before the lag's)
        lag, _ = growth.remove(seq_id)
        if need > self.gpu.num_free - growth.held:
            raise PagedKVError(f"swap_out: no room for sequence {seq_id!r}'s growth")
        if need:
            blocks += self.gpu.allocate_many(need)
        table.num_tokens = tokens
        self._token_slots += lag
        return self._move_out(seq_id, table)

    def _swap_out_one(self, seq_id: SeqId) -> list[SwapMapping] | None:
        """``swap_out`` of one sequence (settled): its blocks are distinct, so each takes one
        CPU block with one reference, in table order (as the general path's)."""
        table = self._tables.get(seq_id)
        if table is None:
            raise UnknownSequenceError(f"sequence {seq_id!r} is not in the expected pool")
        if len(table.blocks) > self.cpu.num_free:
            return None
        self._tails.untrack(seq_id, table)
        return self._move_out(seq_id, table)

    def _move_out(self, seq_id: SeqId, table: BlockTable) -> list[SwapMapping]:
        """``_swap_out_one``'s move once the room is checked and the tail books untracked."""
        gpu_blocks = table.blocks
        cpu_blocks = self.cpu.allocate_many(len(gpu_blocks))
        del self._tables[seq_id]
        self._release_gpu(table)  # (a new, empty list: ``gpu_blocks`` stays)
        table.blocks = cpu_blocks
        self._swapped[seq_id] = table
        self._swapped_out += len(cpu_blocks)
        return list(map(_mapping, zip(gpu_blocks, cpu_blocks, strict=True)))

    def _swap_in_one(self, seq_id: SeqId) -> list[SwapMapping]:
        """``swap_in`` of one sequence (room checked) where nothing on the GPU can stand in
        for a CPU block (no prefix cache, no pins): a fresh GPU block for each, in order."""
        table = self._swapped.pop(seq_id)
        cpu_blocks = table.blocks
        gpu_blocks = self.gpu.allocate_many(len(cpu_blocks))
        self._token_slots += table.num_tokens  # (its blocks hold its tokens: fill(j) summed)
        table.release(self.cpu)
        table.blocks = gpu_blocks
        self._tables[seq_id] = table
        self._tails.track(seq_id, table)
        self._swapped_in += len(gpu_blocks)
        return list(map(_mapping, zip(cpu_blocks, gpu_blocks, strict=True)))

    @staticmethod
    def _distinct_blocks(seq_ids: Iterable[SeqId], tables: dict[SeqId, BlockTable]) -> list[int]:
        seen: dict[int, None] = {}
        for seq_id in seq_ids:
            if seq_id not in tables:
                raise UnknownSequenceError(f"sequence {seq_id!r} is not in the expected pool")
            seen.update(dict.fromkeys(tables[seq_id].blocks))
        return list(seen)

    @staticmethod
    def _count_refs(seq_ids: Iterable[SeqId], tables: dict[SeqId, BlockTable]) -> dict[int, int]:
        refs: dict[int, int] = {}
        for seq_id in seq_ids:
            for b in tables[seq_id].blocks:
                refs[b] = refs.get(b, 0) + 1
        return refs

    def _cached_gpu_block(self, table: BlockTable, j: int) -> int | None:
        if self.config.enable_prefix_caching and j < len(table.block_hashes):
            return self.gpu.lookup(table.block_hashes[j])
        return None

    def _growth_blocks(self, seq_ids: list[SeqId], num_new_tokens: int) -> int:
        """Blocks that ``num_new_tokens`` more tokens of each swapped sequence take once back:
        new blocks, and a copy for every sibling but one sharing a partial last block."""
        if num_new_tokens <= 0:
            return 0
        bs = self.config.block_size
        if len(seq_ids) == 1:  # no sibling shares its last block
            table = self._swapped[seq_ids[0]]
            return cdiv(table.num_tokens + num_new_tokens, bs) - len(table.blocks)
        blocks = 0
        sharing: dict[int, int] = {}  # shared partial last block -> sequences ending in it
        for seq_id in seq_ids:
            table = self._swapped[seq_id]
            t = table.num_tokens
            blocks += cdiv(t + num_new_tokens, bs) - len(table.blocks)
            if t % bs and table.blocks:
                sharing[table.blocks[-1]] = sharing.get(table.blocks[-1], 0) + 1
        return blocks + sum(c - 1 for c in sharing.values())

    def _swap_in_blocks_taken(self, seq_ids: list[SeqId]) -> int:
        """Free-queue entries a swap-in consumes (cached blocks already in use cost none)."""
        for seq_id in seq_ids:
            if seq_id not in self._swapped:
                raise UnknownSequenceError(f"sequence {seq_id!r} is not swapped out")
        if self.config.enable_prefix_caching or self.config.enable_pinned_prefixes:
            return self._swap_in_blocks_taken_each(seq_ids)
        # Nothing on the GPU can stand in for a CPU block (no cache, no pins): each distinct
        # one takes a free block (vllm tries this at every step while a request is swapped).
        if len(seq_ids) == 1:
            return len(self._swapped[seq_ids[0]].blocks)  # a table's blocks are distinct
        return len({b for seq_id in seq_ids for b in self._swapped[seq_id].blocks})

    def _swap_in_blocks_taken_each(self, seq_ids: list[SeqId]) -> int:
        """``_swap_in_blocks_taken`` block by block, asking whether the GPU still has each."""
        taken = 0
        seen: set[int] = set()
        for seq_id in seq_ids:
            table = self._swapped[seq_id]
            for j, cpu_block in enumerate(table.blocks):
                if cpu_block in seen:
                    continue
                seen.add(cpu_block)
                cached = self._cached_gpu_block(table, j)
                taken += int(cached is None or self.gpu.ref_counts[cached] == 0)
        return taken

    def _gpu_block_for_swap_in(
        self, table: BlockTable, j: int, cpu_block: int, copies: list[SwapMapping]
    ) -> int:
        cached = self._cached_gpu_block(table, j)
        if cached is not None:  # the GPU still holds this block's K/V: no copy needed
            if self.gpu.ref_counts[cached] == 0:
                self._token_slots += table.fill(j)
            self.gpu.incref(cached)
            return cached
        gpu_block = self.gpu.allocate()
        self._token_slots += table.fill(j)
        if self.config.enable_prefix_caching and j < len(table.block_hashes):
            self.gpu.cache_block(gpu_block, table.block_hashes[j])
        copies.append(SwapMapping(cpu_block, gpu_block))
        return gpu_block


# SwapMapping of a (src, dst) pair, in C: a NamedTuple's own constructor is Python code, and a
# swap makes one mapping per block.
_mapping = partial(tuple.__new__, SwapMapping)

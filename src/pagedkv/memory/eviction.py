"""Eviction policies of the prefix cache: which free cached block an allocation gives up.

``BlockPool`` itself is the LRU policy (its one ``OrderedDict`` free queue is in eviction
order). ``LFUBlockPool`` keeps the same books but splits the free blocks in two::

    uncached free blocks: OrderedDict, head first    (always handed out before any cached one)
    cached free blocks:   heap of (uses, stamp, block) with lazy deletion

**A use** is a reference taken on the block since it was last allocated: the allocation that
fills it counts 1, and every later ``incref`` counts 1 more, whether a prefix hit (a new
request finds it in the cache), a fork (a parallel sample reads it) or a swap-in that finds it
still cached. Why references and not only hits on *free* blocks: a popular system prompt is
hit while other requests still hold it, so it is rarely free; counting only revivals from the
free queue would give it the count of a one-off prompt and LFU would evict it first once it
went free. The pool cannot tell a prefix hit from a fork (both are an ``incref``), and both
are a sequence reading the cached K/V, so both count.

Ties go to the least recently freed block (the ``stamp``, a counter of frees), so among
blocks freed together the tail of a chain goes before its head, as under LRU.

Costs: allocate O(log n) amortized when it evicts (O(1) from the uncached queue), incref O(1)
(a free cached block leaves by deletion from ``_stamp``; its heap entry goes stale), decref
O(log n). Stale entries are dropped when popped, and the heap is rebuilt when stale entries
outnumber live ones, so it stays O(live) in size.

Classic LFU (frequency buckets, O(1) everywhere) relies on a count only ever growing by one
while an entry is in the structure; here a block re-enters the free set with whatever count it
reached while in use, so the minimum count is not tracked in O(1) and a heap is the simple
choice.
"""

from __future__ import annotations

import heapq

from pagedkv.errors import IntegrityError, PagedKVError
from pagedkv.memory.block_pool import BlockPool, UncachedBlockPool
from pagedkv.memory.config import CacheConfig, EvictionPolicy
from pagedkv.memory.prefix_hash import BlockHash

_COMPACT_SLACK = 64
"""Stale heap entries tolerated beyond the live ones before a rebuild (amortizes it)."""


class LFUBlockPool(BlockPool):
    """A ``BlockPool`` whose cached free blocks are evicted least-frequently-used first."""

    def __init__(self, num_blocks: int, *, enable_caching: bool = True) -> None:
        super().__init__(num_blocks, enable_caching=enable_caching)
        # self._free (the base class's queue) holds only the uncached free blocks here.
        self.uses: list[int] = [0] * num_blocks
        self._heap: list[tuple[int, int, int]] = []  # (uses, stamp, block), stale ones too
        self._stamp: dict[int, int] = {}  # cached free block -> the stamp of its live entry
        self._clock = 0  # frees of cached blocks so far: the tie-break's recency

    allocate_many = BlockPool._allocate_each  # (its own allocate and _freed, one at a time)
    release = BlockPool._release_each

    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._stamp)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free) - len(self._stamp)

    def allocate(self) -> int:
        """An uncached free block if any, else evict the cached one with the fewest uses."""
        if self._free:
            block, _ = self._free.popitem(last=False)
        elif self._stamp:
            block = self._pop_victim()
            key = self.block_hash[block]
            assert key is not None  # only cached blocks enter the heap
            del self._cache[key]
            self.block_hash[block] = None
            self._num_cached_free -= 1
            self.num_evictions += 1
        else:
            raise PagedKVError("block pool exhausted: check num_free before allocating")
        self.uses[block] = 1
        self.ref_counts[block] = 1
        self.num_refs += 1
        return block

    def incref(self, block: int) -> None:
        """One more reference, and one more use; a free block leaves the free set."""
        if self.ref_counts[block] == 0:
            if self.block_hash[block] is None:
                del self._free[block]
            else:
                del self._stamp[block]  # its heap entry is now stale
                self._num_cached_free -= 1
        self.ref_counts[block] += 1
        self.num_refs += 1
        self.uses[block] += 1

    def _freed(self, block: int) -> None:
        """A block that became free joins the uncached queue's head, or the heap at (uses,
        next stamp)."""
        if self.block_hash[block] is None:
            self._free[block] = None
            self._free.move_to_end(block, last=False)
            return
        self._clock += 1
        self._stamp[block] = self._clock
        heapq.heappush(self._heap, (self.uses[block], self._clock, block))
        self._num_cached_free += 1
        if len(self._heap) > 2 * len(self._stamp) + _COMPACT_SLACK:
            self._compact()

    def free_blocks(self) -> list[int]:
        """Every free block in the order allocations take them: uncached, then cached by
        (uses, least recently freed)."""
        cached = sorted(self._stamp, key=lambda b: (self.uses[b], self._stamp[b]))
        return [*self._free, *cached]

    def check_integrity(self, expected_refs: list[int]) -> None:
        """The base books, plus: the uncached queue and the cached set split the free blocks by
        whether they hold a key, and every cached free block has a live heap entry."""
        super().check_integrity(expected_refs)
        if any(self.block_hash[b] is not None for b in self._free):
            raise IntegrityError("a cached block sits in the uncached free queue")
        if any(self.block_hash[b] is None or self.ref_counts[b] for b in self._stamp):
            raise IntegrityError("the cached free set holds an uncached or used block")
        live = {(self.uses[b], s, b) for b, s in self._stamp.items()}
        if not live <= set(self._heap):
            raise IntegrityError("a cached free block has no live heap entry")

    def _pop_victim(self) -> int:
        heap, stamps = self._heap, self._stamp
        while True:
            _, stamp, block = heapq.heappop(heap)
            if stamps.get(block) == stamp:
                del stamps[block]
                return block

    def _compact(self) -> None:
        """Drop the stale entries: rebuild the heap from the live ones (O(n), amortized)."""
        self._heap = [(self.uses[b], s, b) for b, s in self._stamp.items()]
        heapq.heapify(self._heap)


class V1BlockPool(BlockPool):
    """vLLM 0.33's block pool, where it differs from ``BlockPool``:

    * the free queue (its ``free_blocks``): of the blocks one release frees, the uncached ones
      go to the head in the order given (the first is handed out next), the cached ones to the
      tail in the order given; ``BlockPool`` puts each uncached block at the head in turn,
      which reverses them when one release frees several;
    * a key may be cached on several blocks (two requests computed the same block): a lookup
      finds the earliest cached one still there, and evicting it leaves the next; in
      ``BlockPool`` the first block keeps the key and a second copy is not cached at all.
    """

    def __init__(self, num_blocks: int, *, enable_caching: bool = False) -> None:
        super().__init__(num_blocks, enable_caching=enable_caching)
        self._copies: dict[BlockHash, list[int]] = {}  # later blocks of a cached key, in order

    allocate_many = BlockPool._allocate_each  # (its own allocate and cache_block, one at a time)
    cache_many = BlockPool._cache_each

    def allocate(self) -> int:
        if not self._free:
            raise PagedKVError("block pool exhausted: check num_free before allocating")
        block, _ = self._free.popitem(last=False)
        key = self.block_hash[block]
        if key is not None:
            self._evict(block, key)
        self.ref_counts[block] = 1
        self.num_refs += 1
        return block

    def _evict(self, block: int, key: BlockHash) -> None:
        self._unmap(block, key)
        self._num_cached_free -= 1
        self.num_evictions += 1

    def uncache_block(self, block: int, key: BlockHash) -> None:
        """Undo the last ``cache_block(block, key)`` of a used block: the key's next copy,
        if any, is the one a lookup finds (the cache map as if that call never ran)."""
        if self.block_hash[block] == key and self.ref_counts[block]:
            self._unmap(block, key)

    def _unmap(self, block: int, key: BlockHash) -> None:
        """``block`` no longer holds ``key`` in the cache map (the key's next copy moves up)."""
        copies = self._copies.get(key)
        if self._cache[key] == block:
            if copies:
                self._cache[key] = copies.pop(0)
            else:
                del self._cache[key]
        else:
            assert copies is not None
            copies.remove(block)
        if copies is not None and not copies:
            del self._copies[key]
        self.block_hash[block] = None

    def release(self, blocks: list[int]) -> list[int]:
        freed = [b for b in blocks if self._drop_ref(b)]
        free, keys = self._free, self.block_hash
        for b in reversed(freed):
            if keys[b] is None:
                free[b] = None
                free.move_to_end(b, last=False)
        for b in freed:
            if keys[b] is not None:
                free[b] = None
                self._num_cached_free += 1
        return freed

    def cache_block(self, block: int, key: BlockHash) -> bool:
        if key in self._cache and self.enable_caching and self.block_hash[block] is None:
            self._copies.setdefault(key, []).append(block)
            self.block_hash[block] = key
            return True
        return super().cache_block(block, key)

    def check_integrity(self, expected_refs: list[int]) -> None:
        """The base books, with a key's later copies counted as cached blocks too."""
        for key, blocks in self._copies.items():
            if (
                key not in self._cache
                or not blocks
                or any(self.block_hash[b] != key for b in blocks)
            ):
                raise IntegrityError(f"copies {blocks} of a key disagree with the cache map")
        copies = [b for blocks in self._copies.values() for b in blocks]
        # The base counts keyed blocks against the cache map: it is shown the primaries only.
        keys = [self.block_hash[b] for b in copies]
        hidden_free = sum(1 for b in copies if self.ref_counts[b] == 0)
        for b in copies:
            self.block_hash[b] = None
        self._num_cached_free -= hidden_free
        try:
            super().check_integrity(expected_refs)
        finally:
            for b, k in zip(copies, keys, strict=True):
                self.block_hash[b] = k
            self._num_cached_free += hidden_free


class V1UncachedBlockPool(UncachedBlockPool):
    """``V1BlockPool`` without prefix caching (the vllm-v1 policy's default): without keys its
    free queue is a stack, as ``UncachedBlockPool``'s, but the blocks one release frees go to
    the head in the order given (the first is handed out next), as vLLM's free queue puts
    them (``UncachedBlockPool`` reverses them); the very same blocks in the same order as
    ``V1BlockPool`` (a differential test checks)."""

    def _push_chain(self, blocks: list[int]) -> None:
        self._stack.extend(reversed(blocks))  # (the stack's end is the head)

    def _release_each(self, blocks: list[int]) -> list[int]:
        freed = [b for b in blocks if self._drop_ref(b)]
        self._push_chain(freed)
        return freed


def v1_pool(num_blocks: int, *, enable_caching: bool) -> BlockPool:
    """vLLM 0.33's block pool: ``V1BlockPool``, or without caching its stack."""
    if enable_caching:
        return V1BlockPool(num_blocks, enable_caching=True)
    return V1UncachedBlockPool(num_blocks)


def gpu_pool(config: CacheConfig) -> BlockPool:
    """The GPU block pool for ``config``: the plain (LRU) pool unless prefix caching is on with
    another policy, so the common cases run exactly the LRU code."""
    if config.enable_prefix_caching and config.eviction_policy is EvictionPolicy.LFU:
        return LFUBlockPool(config.num_gpu_blocks, enable_caching=True)
    if not config.enable_prefix_caching:
        return UncachedBlockPool(config.num_gpu_blocks)  # the same order, as a plain stack
    return BlockPool(config.num_gpu_blocks, enable_caching=True)

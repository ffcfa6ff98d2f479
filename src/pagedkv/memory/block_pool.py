"""A pool of physical KV blocks: reference counts, an O(1) free queue, and the prefix cache.

The free queue is kept in eviction order (head = next block handed out)::

    head -> [uncached free blocks ...][cached free blocks, least recently freed first ...] <- tail

* ``allocate`` pops the head in O(1). If that block still carries a cache key, the key is
  dropped: this is an LRU eviction.
* ``decref`` to zero puts a cached block at the tail (most recently used) and an uncached one
  at the head (it holds nothing worth keeping, so it is reused before any cached block).
* ``incref`` of a free cached block (a prefix hit) takes it out of the middle of the queue in O(1).

An ``OrderedDict`` gives all three in O(1) (it is a hash map over a doubly linked list), the
same structure as the free-block queue of vLLM v1, without hand-writing the list.
This is the LRU eviction policy; other policies subclass it (``pagedkv.memory.eviction``).
Freeing a sequence's blocks in reverse order puts a chain's tail nearer the head, so among
blocks freed together the tail of a prefix is evicted first and the shareable head survives.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from pagedkv.errors import IntegrityError, PagedKVError
from pagedkv.memory.prefix_hash import BlockHash


class BlockPool:
    """``num_blocks`` physical blocks with reference counts and an optional hash -> block cache."""

    def __init__(self, num_blocks: int, *, enable_caching: bool = False) -> None:
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.ref_counts: list[int] = [0] * num_blocks
        self.block_hash: list[BlockHash | None] = [None] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cache: dict[BlockHash, int] = {}
        self._num_cached_free = 0
        self.num_evictions = 0
        self.num_refs = 0  # the sum of ref_counts: references from tables (and pins)

    @property
    def num_free(self) -> int:
        """Blocks with reference count 0 (cached or not): all can be handed out."""
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_cached_free(self) -> int:
        """Free blocks that still hold a cached prefix (evictable)."""
        return self._num_cached_free

    @property
    def num_cached(self) -> int:
        """Blocks registered in the prefix cache, used or free."""
        return len(self._cache)

    def allocate(self) -> int:
        """Take the head of the free queue (evicting its cache key if it has one); ref count 1."""
        if not self._free:
            raise PagedKVError("block pool exhausted: check num_free before allocating")
        block, _ = self._free.popitem(last=False)
        key = self.block_hash[block]
        if key is not None:
            del self._cache[key]
            self.block_hash[block] = None
            self._num_cached_free -= 1
            self.num_evictions += 1
        self.ref_counts[block] = 1
        self.num_refs += 1
        return block

    def allocate_many(self, n: int) -> list[int]:
        """``n`` blocks, each as ``allocate`` would hand them out one after another (the same
        steps, in one loop)."""
        if n > self.num_free:
            raise PagedKVError(f"block pool exhausted: {n} blocks wanted, {self.num_free} free")
        if n <= 0:
            return []
        pop, keys, cache, refs = self._free.popitem, self.block_hash, self._cache, self.ref_counts
        taken = []
        evicted = 0
        for _ in range(n):
            block = pop(False)[0]
            key = keys[block]
            if key is not None:
                del cache[key]
                keys[block] = None
                evicted += 1
            refs[block] = 1
            taken.append(block)
        self._num_cached_free -= evicted
        self.num_evictions += evicted
        self.num_refs += n
        return taken

    def _allocate_each(self, n: int) -> list[int]:
        """``allocate_many`` as n calls of ``allocate`` (a policy that changes ``allocate``)."""
        if n > self.num_free:
            raise PagedKVError(f"block pool exhausted: {n} blocks wanted, {self.num_free} free")
        return [self.allocate() for _ in range(n)]

    def incref(self, block: int) -> None:
        """One more reference; a free cached block (a prefix hit) leaves the free queue."""
        if self.ref_counts[block] == 0:
            del self._free[block]
            if self.block_hash[block] is not None:
                self._num_cached_free -= 1
        self.ref_counts[block] += 1
        self.num_refs += 1

    def decref(self, block: int) -> bool:
        """One reference fewer; returns True when the block became free."""
        if not self._drop_ref(block):
            return False
        self._freed(block)
        return True

    def _drop_ref(self, block: int) -> bool:
        """One reference fewer (a double free raises); True when it was the last."""
        ref = self.ref_counts[block]
        if ref <= 0:
            raise IntegrityError(f"block {block} freed twice (reference count already {ref})")
        self.ref_counts[block] = ref - 1
        self.num_refs -= 1
        return ref == 1

    def _freed(self, block: int) -> None:
        """Put a block that just became free in the free queue (the eviction policy's place)."""
        self._free[block] = None
        if self.block_hash[block] is None:
            self._free.move_to_end(block, last=False)
        else:
            self._num_cached_free += 1

    def release(self, blocks: list[int]) -> list[int]:
        """``decref`` each block, in the order given; returns those that became free (the
        same steps, in one loop)."""
        refs, keys, free = self.ref_counts, self.block_hash, self._free
        freed = []
        cached = 0
        for i, block in enumerate(blocks):
            ref = refs[block]
            if ref <= 0:  # (the books keep the blocks before it released, as decref's would)
                self.num_refs -= i
                self._num_cached_free += cached
                raise IntegrityError(f"block {block} freed twice (reference count already {ref})")
            refs[block] = ref - 1
            if ref == 1:
                free[block] = None
                if keys[block] is None:
                    free.move_to_end(block, last=False)
                else:
                    cached += 1
                freed.append(block)
        self.num_refs -= len(blocks)
        self._num_cached_free += cached
        return freed

    def _release_each(self, blocks: list[int]) -> list[int]:
        """``release`` as ``decref`` of each block (a policy that changes ``_freed``)."""
        return [b for b in blocks if self.decref(b)]

    def cache_many(self, blocks: Sequence[int], keys: Sequence[BlockHash]) -> None:
        """``cache_block`` of each (block, key) pair, in order (the same steps, in one loop;
        the answers are not needed)."""
        if not self.enable_caching:
            return
        cache, hashes = self._cache, self.block_hash
        for block, key in zip(blocks, keys, strict=True):
            if key not in cache and hashes[block] is None:
                cache[key] = block
                hashes[block] = key

    def cache_new(self, blocks: Sequence[int], keys: Sequence[BlockHash]) -> None:
        """``cache_many`` of keys no block holds, none twice, on blocks that hold none (the
        caller knows): each registers, so the map takes them in one piece. Every policy's
        ``cache_block`` registers such a pair as the base's does."""
        if not self.enable_caching:
            return
        self._cache.update(zip(keys, blocks, strict=True))
        hashes = self.block_hash
        for block, key in zip(blocks, keys, strict=True):
            hashes[block] = key

    def _cache_each(self, blocks: Sequence[int], keys: Sequence[BlockHash]) -> None:
        """``cache_many`` as ``cache_block`` of each pair (a policy that changes it)."""
        for block, key in zip(blocks, keys, strict=True):
            self.cache_block(block, key)

    def cache_block(self, block: int, key: BlockHash) -> bool:
        """Register a full, used block under ``key``; False if caching is off or the key is
        already held by another block (the first one keeps it)."""
        if not self.enable_caching or key in self._cache or self.block_hash[block] is not None:
            return False
        self._cache[key] = block
        self.block_hash[block] = key
        return True

    def uncache_block(self, block: int, key: BlockHash) -> None:
        """Undo the ``cache_block(block, key)`` that cached a used block (nothing if none
        did); a later ``cache_block`` of that key, refused then, stays refused."""
        if self.block_hash[block] == key and self.ref_counts[block]:
            del self._cache[key]
            self.block_hash[block] = None

    def lookup(self, key: BlockHash) -> int | None:
        """The block cached under ``key``, if any (no side effect)."""
        return self._cache.get(key)

    def hits(self, keys: Iterable[BlockHash]) -> list[int]:
        """The blocks cached under ``keys``, up to the first not cached (``lookup`` of each)."""
        get = self._cache.get
        blocks = []
        for key in keys:
            block = get(key)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def any_cached(self, keys: Iterable[BlockHash]) -> bool:
        """Is any of ``keys`` cached (``lookup`` not None for one)? In C, no side effect."""
        return not self._cache.keys().isdisjoint(keys)

    def free_blocks(self) -> list[int]:
        """The free queue from head (next out) to tail, for inspection and tests."""
        return list(self._free)

    def check_integrity(self, expected_refs: list[int]) -> None:
        """Reference counts equal ``expected_refs``; free queue holds exactly the blocks with
        count 0; the cache map and the per-block keys agree."""
        if expected_refs != self.ref_counts:
            bad = [b for b in range(self.num_blocks) if expected_refs[b] != self.ref_counts[b]]
            raise IntegrityError(
                f"reference counts disagree with table references at blocks {bad[:10]}: "
                f"have {[self.ref_counts[b] for b in bad[:10]]}, "
                f"tables say {[expected_refs[b] for b in bad[:10]]}"
            )
        if self.num_refs != sum(self.ref_counts):
            raise IntegrityError(f"reference total {self.num_refs} != {sum(self.ref_counts)}")
        free = {b for b, r in enumerate(self.ref_counts) if r == 0}
        queue = self.free_blocks()  # a policy may keep more than the one queue (eviction.py)
        if set(queue) != free or len(queue) != len(free) or self.num_free != len(free):
            raise IntegrityError("free queue differs from the blocks with reference count 0")
        if self.num_free + self.num_used != self.num_blocks:
            raise IntegrityError("free + used != total")
        for key, block in self._cache.items():
            if self.block_hash[block] != key:
                raise IntegrityError(f"cache maps a key to block {block}, which holds another")
        keyed = [b for b, k in enumerate(self.block_hash) if k is not None]
        if len(keyed) != len(self._cache):
            raise IntegrityError("a block carries a key that the cache map does not hold")
        cached_free = sum(1 for b in keyed if self.ref_counts[b] == 0)
        if cached_free != self._num_cached_free:
            raise IntegrityError("cached-free counter is off")
        if not self.enable_caching and self._cache:
            raise IntegrityError("cache entries with caching disabled")


class UncachedBlockPool(BlockPool):
    """A pool without a prefix cache (caching off, the default, and every CPU pool).

    Without keys every free block is alike and ``BlockPool`` puts each freed block at the head
    of its queue, so the queue is a LIFO stack. Here it is one: a list whose end is the head,
    cheaper than the ``OrderedDict`` per allocation and free, handing out the very same blocks
    in the same order (a differential test checks).
    """

    def __init__(self, num_blocks: int) -> None:
        super().__init__(0)
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self.block_hash = [None] * num_blocks
        self._stack = list(range(num_blocks - 1, -1, -1))  # head (next out) last: 0 goes first

    @property
    def num_free(self) -> int:
        return len(self._stack)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._stack)

    def allocate(self) -> int:
        if not self._stack:
            raise PagedKVError("block pool exhausted: check num_free before allocating")
        block = self._stack.pop()
        self.ref_counts[block] = 1
        self.num_refs += 1
        return block

    def allocate_many(self, n: int) -> list[int]:
        stack = self._stack
        if n > len(stack):
            raise PagedKVError(f"block pool exhausted: {n} blocks wanted, {len(stack)} free")
        if n <= 0:
            return []
        taken = stack[-n:]
        del stack[-n:]
        taken.reverse()  # the head (the stack's end) first, as n allocate() calls
        refs = self.ref_counts
        for block in taken:
            refs[block] = 1
        self.num_refs += n
        return taken

    def incref(self, block: int) -> None:
        if self.ref_counts[block] == 0:
            self._stack.remove(block)  # O(n), but only a cache hit revives a free block
        self.ref_counts[block] += 1
        self.num_refs += 1

    def _freed(self, block: int) -> None:
        self._stack.append(block)

    def release(self, blocks: list[int]) -> list[int]:
        n = len(blocks)
        if n > 1 and self.num_refs == self.num_blocks - len(self._stack):
            # The usual chain, nothing shared: the counts of the used blocks are >= 1 and sum
            # to their number, so each is 1 and every block named (held: a table's) becomes
            # free. (A free block named here would be a double free, which the slow path
            # raises at once and check_integrity finds in the free stack afterwards.)
            refs = self.ref_counts
            for block in blocks:
                refs[block] = 0
            self._push_chain(blocks)
            self.num_refs -= n
            return list(blocks)
        return self._release_each(blocks)

    def _push_chain(self, blocks: list[int]) -> None:
        """The free blocks of one release onto the stack: each at the head in turn, as
        ``BlockPool`` puts them (the last named is handed out next)."""
        self._stack.extend(blocks)

    def free_blocks(self) -> list[int]:
        return self._stack[::-1]

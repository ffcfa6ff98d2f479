"""KVCacheManager: the paged books, and the only memory API the scheduler uses.

It answers whether a sequence fits (``can_allocate``: OK / LATER / NEVER), hands out slots
(``allocate``, ``append_slots``), shares them (``fork``, prefix-cache hits), takes them back
(``free``), moves them between GPU and CPU (``swap_out`` / ``swap_in``), and returns the block
copies and swaps an executor must perform. It never picks victims: that is the scheduler's job.
"No room" is a ``None`` return that changed nothing, never an exception.

Accounting is incremental (O(1) per token, O(blocks) per allocate/free), so ``usage()`` is
O(1); ``check_integrity()`` recomputes everything from the tables and compares. Decoding
sequences may grow in closed form (``grow``, ``advance_rounds``: memory/growth.py): the books
stay exact every round and their blocks are chosen when something reads them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from pagedkv.errors import ConfigError, IntegrityError, PagedKVError, UnknownSequenceError
from pagedkv.memory.block_pool import BlockPool, UncachedBlockPool
from pagedkv.memory.block_table import BlockTable, cdiv
from pagedkv.memory.config import CacheConfig
from pagedkv.memory.eviction import gpu_pool
from pagedkv.memory.growth import Growth, Window
from pagedkv.memory.interface import AllocStatus, BlockCopy, SeqId
from pagedkv.memory.keyed_append import KeyedAppendMixin
from pagedkv.memory.keyed_growth import KeyedGrowthMixin
from pagedkv.memory.pinned import PinnedPrefixMixin
from pagedkv.memory.prefix_hash import (
    BlockHash,
    check_token_ids,
    hash_blocks,
    iter_keys,
    keys_of,
)
from pagedkv.memory.swapping import SwapMixin
from pagedkv.memory.tail_books import TailBooks
from pagedkv.memory.token_runs import TokenRuns
from pagedkv.memory.usage import MemoryUsage
from pagedkv.validation import as_int


@dataclass(frozen=True)
class PrefixHit:
    """The cached full blocks that start a token sequence, and the tokens they already hold."""

    blocks: tuple[int, ...]
    num_computed_tokens: int
    block_keys: tuple[BlockHash, ...] = ()


_KEYS_MEMO = 16
"""Entries the keys memo keeps (the oldest goes first): a prompt's block keys, and those of the
blocks within a prompt's first run."""
NO_HIT = PrefixHit((), 0)  # token ids unknown: nothing to look up (one object, made once)
# can_allocate's answers as globals: looking an enum member up on its class costs CPython 3.11
# about four times a global read, and admission asks at every arrival.
_OK, _LATER, _NEVER = AllocStatus.OK, AllocStatus.LATER, AllocStatus.NEVER


@dataclass(frozen=True)
class CacheStats:
    """Usage counters of a ``KVCacheManager`` (cumulative ones count since construction)."""

    num_gpu_blocks: int
    num_free_blocks: int
    num_cached_free_blocks: int
    num_cpu_blocks: int
    num_free_cpu_blocks: int
    num_seqs: int
    num_swapped_seqs: int
    prefix_query_tokens: int
    prefix_hit_tokens: int
    evictions: int
    cow_copies: int
    swapped_out_blocks: int
    swapped_in_blocks: int

    @property
    def prefix_hit_rate(self) -> float:
        """prefix_hit_tokens / prefix_query_tokens (0 when nothing was queried)."""
        return (
            self.prefix_hit_tokens / self.prefix_query_tokens if self.prefix_query_tokens else 0.0
        )


def _to_salt(cache_salt: str | bytes | None) -> bytes | None:
    return cache_salt.encode() if isinstance(cache_salt, str) else cache_salt


class KVCacheManager(PinnedPrefixMixin, SwapMixin, KeyedAppendMixin, KeyedGrowthMixin):
    """Paged KV memory: a GPU block pool, a CPU swap pool, one block table per sequence.

    Swapping (``swap_out``, ``swap_in`` and their can-halves) lives in ``SwapMixin``; explicit
    pinned prefixes (``register_prefix``, ``take_copies``) in ``PinnedPrefixMixin``; the bulk
    append under prefix caching in ``KeyedAppendMixin``; growth under prefix caching (blocks
    and keys made in the rounds' order when read) in ``KeyedGrowthMixin``.
    """

    def __init__(self, config: CacheConfig, gpu: BlockPool | None = None) -> None:
        self.config = config
        self.block_size = config.block_size
        # the eviction policy's pool (plain LRU by default), or one a policy brings
        self.gpu = gpu_pool(config) if gpu is None else gpu
        self.cpu = UncachedBlockPool(config.num_cpu_blocks)
        self._tables: dict[SeqId, BlockTable] = {}  # sequences whose blocks are on the GPU
        self._swapped: dict[SeqId, BlockTable] = {}  # sequences whose blocks are CPU block ids
        self._token_slots = 0  # distinct used GPU slots holding a token
        self._tails = TailBooks(self.block_size)
        # Sequences that gain a token per round in closed form (``grow``): the tables above
        # lag behind them, and ``books`` adds what the growth took since (memory/growth.py).
        self._growth = Growth(self.block_size)
        self._watermark_blocks = config.watermark_blocks  # (a frozen config: read once)
        # Token ids are read (hashed, matched) only with one of these on: only then are their
        # types checked (their number always is).
        self._ids_read = config.enable_prefix_caching or config.enable_pinned_prefixes
        # The block keys of the last few ids looked up (immutable ones: runs or a tuple): a
        # waiting request is looked up at every step until it is admitted, and once more then,
        # between arrivals' lookups. Keys are a function of the ids and the salt alone, so
        # this holds no state of the books.
        self._keys_memo: dict[tuple[object, int, bytes | None], list[BlockHash]] = {}
        self._prefix_queries = 0
        self._prefix_hits = 0
        self._cow_copies = 0
        self._swapped_out = 0
        self._swapped_in = 0
        self._init_pins()
        self._init_keyed()
        # Has a table been given token ids under prefix caching? Until then no block has a
        # key, the order of growth's blocks cannot matter, and growth stays as without it.
        self._ids_seen = False

    # ----- queries -----------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """C = num_gpu_blocks x block_size."""
        return self.config.capacity

    @property
    def num_free_blocks(self) -> int:
        """Free GPU blocks now (growing sequences' new blocks are taken, if not chosen yet)."""
        return self.gpu.num_free - self._growth.held

    def has_seq(self, seq_id: SeqId) -> bool:
        """Is ``seq_id`` allocated on the GPU?"""
        return seq_id in self._tables

    def is_swapped(self, seq_id: SeqId) -> bool:
        return seq_id in self._swapped

    def num_tokens(self, seq_id: SeqId) -> int:
        self._settle()
        return self._any_table(seq_id).num_tokens

    def block_ids(self, seq_id: SeqId) -> list[int]:
        """The physical blocks of ``seq_id`` (GPU ids, or CPU ids while swapped out)."""
        self._settle()
        return list(self._any_table(seq_id).blocks)

    def seq_ids(self) -> list[SeqId]:
        return list(self._tables)

    @property
    def growth_block_size(self) -> int | None:
        """Slots one more block adds when a sequence outgrows its room (paged: block_size)."""
        return self.block_size

    def room(self, seq_id: SeqId) -> int:
        """Tokens ``seq_id`` can append before it needs a new block or a copy-on-write."""
        self._settle()
        table = self._gpu_table(seq_id)
        if table.blocks and self.gpu.ref_counts[table.blocks[-1]] > 1:
            return 0  # the next write into the shared last block copies it first
        return table.num_slots - table.num_tokens

    def rooms(self, seq_ids: Sequence[SeqId]) -> list[int]:
        """``room`` of each sequence, in one call (the fast-forward asks for all at once)."""
        self._settle()
        tables = self._tables
        refs = self.gpu.ref_counts
        bs = self.block_size
        out = []
        for seq_id in seq_ids:
            table = tables.get(seq_id) or self._gpu_table(seq_id)
            blocks = table.blocks
            if blocks and refs[blocks[-1]] > 1:
                out.append(0)
            else:
                out.append(len(blocks) * bs - table.num_tokens)
        return out

    @property
    def blocks_saved_by_sharing(self) -> int:
        """GPU blocks that sharing saves now: block references from sequences (what each
        would hold alone) minus blocks in use. Forks, parallel samples and prefix hits all
        count; 0 when nothing is shared."""
        # A pin is a reference but not a sequence's: an unused pinned block saves -1.
        return self.gpu.num_refs - self.gpu.num_used - self._num_pinned_blocks

    @property
    def reads_token_ids(self) -> bool:
        """Are token ids ever read (hashed by prefix caching, matched by pinned prefixes)?
        Otherwise a table carries none: ids given to ``allocate`` are checked and dropped."""
        return self._ids_read

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens."""
        return cdiv(num_tokens, self.block_size)

    @property
    def stats(self) -> CacheStats:
        if self._keyed:  # (the evictions growth owes the pool count)
            self._materialise()
        return CacheStats(
            num_gpu_blocks=self.gpu.num_blocks,
            num_free_blocks=self.num_free_blocks,
            num_cached_free_blocks=self.gpu.num_cached_free,
            num_cpu_blocks=self.cpu.num_blocks,
            num_free_cpu_blocks=self.cpu.num_free,
            num_seqs=len(self._tables),
            num_swapped_seqs=len(self._swapped),
            prefix_query_tokens=self._prefix_queries,
            prefix_hit_tokens=self._prefix_hits,
            evictions=self.gpu.num_evictions,
            cow_copies=self._cow_copies,
            swapped_out_blocks=self._swapped_out,
            swapped_in_blocks=self._swapped_in,
        )

    def usage(self, waiting_for_memory: bool = False) -> MemoryUsage:
        """The five categories of the GPU capacity, from the books (O(1)).

        Cached free blocks (prefix caching) are free: any allocation may evict them.
        """
        tokens, reservation, internal = self.books()
        return MemoryUsage.from_books(
            self.capacity, tokens, reservation, internal, waiting_for_memory
        )

    def books(self) -> tuple[int, int, int]:
        """(token states, reservation, internal fragmentation) in slots: ``usage`` without
        building it (the fast-forward's decode cohort reads them at every event). Exact at
        the current round: the tables' books plus what growing sequences gained since they
        joined (tokens, the blocks they took, those blocks' slots past a final length)."""
        # (Growth's sums are all 0 while nothing grows, so they are added unconditionally.)
        growth, tails = self._growth, self._tails
        return (
            self._token_slots + growth.tokens,
            tails.reservation + growth.reservation,
            tails.internal + self._pinned_empty_slots + growth.frag,  # pinned blocks' empties
        )

    # ----- growth in closed form ------------------------------------------------------------
    def grow(
        self,
        seq_ids: Sequence[SeqId],
        *,
        token_ids: Sequence[Sequence[int] | None] | None = None,
        order: Sequence[object] | None = None,
    ) -> None:
        """From the next round on, each of these sequences gains one token per round (it
        decodes) until it is freed or something reads its blocks: ``advance_rounds`` moves
        them all at once, the books stay exact, and block ids are chosen only when read.

        Each must hold its last block alone if it is partial (no copy-on-write to come; blocks
        before the last may be shared, as parallel samples share their prompt's). Without
        prefix caching the ids of the tokens it gains are not kept (nothing keys them; pinned
        prefixes match prompts). With it, ``token_ids`` gives each one's
        ids from its current count to its final length (None where unknown: its keys stop),
        and ``order`` each one's place within a round (sortable; the caller's running order):
        blocks and keys are then made when read, as the rounds would have made them
        (memory/keyed_growth.py). Already growing ones go on as they were."""
        refs = self.gpu.ref_counts
        growth, tables = self._growth, self._tables
        growing = growth.seqs
        keyed = self.config.enable_prefix_caching and self._ids_seen
        for i, seq_id in enumerate(seq_ids):
            if seq_id in growing:
                continue
            table = tables.get(seq_id) or self._gpu_table(seq_id)
            blocks = table.blocks
            shared = blocks and refs[blocks[-1]] != 1 and table.num_tokens % self.block_size
            # (ids matter to growth only where they are keyed: pinned prefixes match prompts)
            unkeyed = table.tokens_known and self.config.enable_prefix_caching and not keyed
            if unkeyed or shared:
                raise PagedKVError(f"sequence {seq_id!r} cannot grow in closed form")
            if keyed:
                ids = None if token_ids is None else token_ids[i]
                self._grow_keyed(seq_id, table, ids, None if order is None else order[i])
            else:
                growth.add(seq_id, table)

    @property
    def grows_keyed(self) -> bool:
        """Do growing sequences key their blocks (prefix caching, and a table with token ids
        seen)? Then their blocks and keys are made in the rounds' order (``short_round`` for a
        round short of blocks); otherwise they are taken when read, in any order."""
        return self._ids_seen and self.config.enable_prefix_caching

    def is_growing(self, seq_id: SeqId) -> bool:
        """Does ``seq_id`` grow in closed form now (``grow``; not settled since)?"""
        return seq_id in self._growth.seqs

    def stop_growing(self, seq_ids: Sequence[SeqId]) -> None:
        """Those of ``seq_ids`` still growing stop (their tables take what they gained: a
        policy holds a finished request's blocks); the others are left as they are."""
        growing = self._growth.seqs
        only = [s for s in seq_ids if s in growing]
        if only:
            self._settle(only)

    def rounds_that_fit(self, spare: int = 0) -> int | None:
        """Rounds of growth whose new blocks the free blocks hold, ``spare`` of them kept back
        for other appends (None: growth takes none)."""
        return self._growth.rounds_that_fit(self.gpu.num_free - self._growth.held - spare)

    def next_round_fits(self) -> bool:
        """Does the next round of growth fit in the free blocks (``rounds_that_fit() != 0``)?"""
        return self._growth.next_round_fits(self.gpu.num_free - self._growth.held)

    def advance_rounds(self, k: int, *, rounds: bool = False, upto: bool = False) -> Window:
        """k rounds of growth (with ``upto``: as many of them as the free blocks hold): every
        growing sequence gains a token a round. Returns the rounds run, the blocks they take
        with their sums of x and x^2 (x: a round's place in the window, from 0) and each last
        block's (x, internal fragmentation it brings), for integrals over the rounds; with
        ``rounds``, also the round of each block (1 = the window's first). ``PagedKVError``,
        changing nothing, if (without ``upto``) the blocks do not fit. The caller frees or
        stops a sequence at its final length (``check_integrity`` fails once one passed it)."""
        growth = self._growth
        return growth.advance(k, self.gpu.num_free - growth.held, rounds, upto)

    def _settle(self, only: Iterable[SeqId] | None = None) -> None:
        """Bring every growing sequence's table up to date (its blocks are being read), or
        those of ``only``: each takes its tokens and its new blocks from the pool now, and
        stops growing."""
        growth = self._growth
        if not growth.seqs:
            return
        if self._keyed:  # under prefix caching: the pool made in the rounds' order first
            self._settle_keyed(only)
            if not growth.seqs:
                return
        growing = growth.seqs
        by_lag: dict[int, list[SeqId]] = {}
        for seq_id in list(growing) if only is None else [s for s in only if s in growing]:
            lag, _ = growth.remove(seq_id)
            if lag:
                by_lag.setdefault(lag, []).append(seq_id)
        if not by_lag:
            return
        # The others go on growing: the bulk append must not settle them (it settles every
        # grower first), and the blocks it takes are those growth held for these.
        others, growth.seqs = growth.seqs, {}
        try:
            for lag, seq_ids in by_lag.items():
                self.append_slots_all(seq_ids, lag)
        finally:
            growth.seqs = others

    def _settle_pool(self) -> None:
        """Bring the pool up to date for a read of the pool alone (a lookup, an allocation, a
        swap-in): under prefix caching the blocks and keys growth owes it are made and the
        growers go on; otherwise every grower settles."""
        if self._keyed:
            self._materialise()
        elif self._ids_seen and self.config.enable_prefix_caching:  # (else nothing is cached)
            self._settle()

    def _settle_for_swap_in(self) -> None:
        """``SwapMixin``'s; a cached block a swap-in reuses may be one a grower keyed ahead
        of its table (keyed_growth.py), so those take theirs first."""
        super()._settle_for_swap_in()
        if self._ahead:
            self._take_chosen(self._made)

    # ----- prefix cache ---------------------------------------------------------------------
    def lookup_prefix(
        self, token_ids: Sequence[int], *, cache_salt: str | bytes | None = None
    ) -> PrefixHit:
        """Cached full blocks that start ``token_ids`` (no side effect on the cache).

        The last token is never a hit: its logits are needed, so it must be computed. Hits are
        therefore whole blocks within the first len(token_ids) - 1 tokens.
        """
        if not self.config.enable_prefix_caching or len(token_ids) < 2:
            return PrefixHit((), 0)
        self._settle_pool()  # growth's blocks not chosen yet may be cached free ones
        bs = self.block_size
        n = (len(token_ids) - 1) // bs
        salt = _to_salt(cache_salt)
        lookup = self.gpu.lookup
        # runs by their ranges, a tuple as itself (ints never equal ranges): hashed in C
        keys: Sequence[BlockHash] | None = self._memo_keys(token_ids, n, salt)
        if keys is None:  # ids the caller may change later: not kept, keyed to the first miss
            ids = token_ids[: n * bs]
            keys = []
            for key in iter_keys(ids, bs, salt):
                if lookup(key) is None:
                    break
                keys.append(key)
        blocks = self.gpu.hits(keys)
        if self._ahead and blocks:  # a grower's block, keyed ahead of its table: it takes it
            self._settle_ahead(blocks)
        return PrefixHit(tuple(blocks), len(blocks) * bs, tuple(keys[: len(blocks)]))

    def _memo_keys(self, ids: Sequence[int], n: int, salt: bytes | None) -> list[BlockHash] | None:
        """The keys of the first ``n`` blocks of immutable ids (runs or a tuple), remembered;
        None for ids the caller may change later."""
        name = ids.runs if type(ids) is TokenRuns else ids if type(ids) is tuple else None
        if name is None:
            return None
        keys = self._keys_memo.get((name, n, salt))
        if keys is None:
            keys = self._remember((name, n, salt), self._first_run_keys(ids, n, salt))
        return keys

    def _first_run_keys(self, ids: Sequence[int], n: int, salt: bytes | None) -> list[BlockHash]:
        """``keys_of`` the first ``n`` blocks, those within the first of several runs from the
        memo too: a shared prefix's run starts many prompts (their later runs differ)."""
        bs = self.block_size
        if type(ids) is TokenRuns and len(ids.runs) > 1:
            first = ids.runs[0]
            k = min(n, len(first) // bs)
            if k:
                head = self._keys_memo.get((first, k, salt))
                if head is None:
                    head = self._remember((first, k, salt), keys_of(ids, 0, k, bs, salt))
                return head + keys_of(ids, k, n, bs, salt, head[-1])
        return keys_of(ids, 0, n, bs, salt)

    def _remember(
        self, name: tuple[object, int, bytes | None], keys: list[BlockHash]
    ) -> list[BlockHash]:
        memo = self._keys_memo
        if len(memo) >= _KEYS_MEMO:
            del memo[next(iter(memo))]  # the oldest
        memo[name] = keys
        return keys

    def _key_from_memo(self, table: BlockTable, ids: Sequence[int], salt: bytes | None) -> None:
        """Key the new table's full blocks that its lookup hashed already (the keys memo's),
        as ``_register_keys`` would key them; it keys the rest."""
        bs = self.block_size
        keys = self._memo_keys(ids, (len(ids) - 1) // bs, salt)
        start = len(table.block_hashes)
        full = min(table.num_tokens, len(table.token_ids)) // bs
        if not keys or not table.tokens_known or full <= start:
            return
        use = keys[start:full]
        self.gpu.cache_many(table.blocks[start : start + len(use)], use)
        table.block_hashes += use

    def growth_may_hit(
        self,
        token_ids: Sequence[int] | None = None,
        swapped: Sequence[SeqId] = (),
        last: Collection[BlockHash] = (),
    ) -> bool:
        """Could the rounds to come of the growing sequences key a block that a lookup of
        ``token_ids`` (a waiting request's prompt), or a swap-in of the swapped sequences
        ``swapped``, would find (``growth_may_key``)? Or would the lookup find one of the keys
        ``last`` (``last_full_keys``)? (False without prefix caching.)"""
        if not self._parents and not self._stale and not last:
            return False
        if token_ids is not None and len(token_ids) >= 2:
            bs = self.block_size
            n = (len(token_ids) - 1) // bs
            keys = self._memo_keys(token_ids, n, None)
            if keys is None:
                keys = hash_blocks(token_ids[: n * bs], bs)
            if (self._parents or self._stale) and self.growth_may_key(keys):
                return True
            if last and any(k in last for k in keys):
                return True
        for seq_id in swapped:
            table = self._swapped.get(seq_id)
            if table is not None and self.growth_may_key(table.block_hashes):
                return True
        return False

    # ----- admission --------------------------------------------------------------------------
    def can_allocate(
        self,
        seq_id: SeqId,
        num_tokens: int,
        *,
        token_ids: Sequence[int] | None = None,
        final_len: int | None = None,
        cache_salt: str | bytes | None = None,
    ) -> AllocStatus:
        """Can ``seq_id`` get slots for its first ``num_tokens`` tokens now?

        NEVER: not even an empty pool would do: the tokens need more blocks than the pool minus
        the watermark, or the final length more blocks than the whole pool.
        LATER: it would leave fewer than the watermark's blocks free.
        """
        num_tokens, final_len = self._check_new(
            seq_id, num_tokens, token_ids, final_len, cache_salt
        )
        bs = self.block_size
        taken = needed = -(-num_tokens // bs)
        gpu = self.gpu
        total = gpu.num_blocks
        free = gpu.num_free - self._growth.held
        # (not in the usual simulation; without pins a hit only lowers the blocks taken, so
        # it is looked up only where the answer without it would be LATER)
        if self._pins or (token_ids is not None and free - needed < self._watermark_blocks):
            hit = self._hit(num_tokens, token_ids, cache_salt)
            if self._pins:
                total -= self._pinned_apart(hit.num_computed_tokens)
            if hit.blocks:
                taken = self._free_blocks_taken(num_tokens, hit)
        wm = self._watermark_blocks
        if total - needed < wm or (final_len is not None and -(-final_len // bs) > total):
            return _NEVER
        return _LATER if free - taken < wm else _OK

    def usable_blocks(self, num_tokens: int, token_ids: Sequence[int] | None = None) -> int:
        """The blocks a sequence whose first ``num_tokens`` are ``token_ids`` could ever hold:
        the pool less the pinned blocks it does not share (``_pinned_apart``)."""
        total = self.gpu.num_blocks
        if self._pins:  # (match_prefix reads; it counts no query)
            total -= self._pinned_apart(self._hit(num_tokens, token_ids, None).num_computed_tokens)
        return total

    def never_reason(
        self,
        num_tokens: int,
        *,
        token_ids: Sequence[int] | None = None,
        final_len: int | None = None,
    ) -> str:
        """Why ``can_allocate`` answers NEVER, in words (a reject reason): the final length
        beyond the pool, or the first tokens beyond what the watermark leaves admission."""
        bs = self.block_size
        total = self.gpu.num_blocks
        usable = self.usable_blocks(num_tokens, token_ids)
        pinned = total - usable
        beside = f", {pinned} of them held by pinned prefixes" if pinned else ""
        final = max(num_tokens, final_len or 0)
        if -(-final // bs) > usable:
            return (
                f"needs {final} token slots ({-(-final // bs)} blocks of {bs}); the KV "
                f"cache of {self.capacity} slots ({total} block{'s' * (total != 1)}{beside}) can "
                "never hold it"
            )
        wm = self._watermark_blocks
        return (
            f"its first {num_tokens} tokens need {-(-num_tokens // bs)} blocks of {bs}; the "
            f"watermark ({self.config.watermark} of {total} blocks) keeps {wm} free at "
            f"admission, leaving {usable - wm}{beside}"
        )

    def allocate(
        self,
        seq_id: SeqId,
        num_tokens: int,
        *,
        token_ids: Sequence[int] | None = None,
        final_len: int | None = None,
        cache_salt: str | bytes | None = None,
    ) -> int | None:
        """A table for ``seq_id`` with slots for its first ``num_tokens`` tokens.

        ``token_ids`` (optional, at least ``num_tokens`` long, may be the whole prompt) enable
        prefix caching: cached blocks among the first min(num_tokens, len(token_ids)) - 1 tokens
        are reused. Returns the number of tokens already computed (the hit), or ``None`` if the
        free blocks do not suffice (the watermark is ``can_allocate``'s business, not this).
        """
        num_tokens, final_len = self._check_new(
            seq_id, num_tokens, token_ids, final_len, cache_salt
        )
        if not self._ids_read:  # (their number checked) nothing hashes or matches them: the
            token_ids = None  # table carries none, and its growth needs none (``grow``)
        if token_ids is None:  # nothing to look up or key (the usual simulation): fresh blocks
            if self._keyed:  # (the blocks growth owes the pool come off its queue first)
                self._materialise()
            needed = -(-num_tokens // self.block_size)
            if needed > self.gpu.num_free - self._growth.held:
                return None
            salt = None if cache_salt is None else _to_salt(cache_salt)
            table = BlockTable(self.block_size, final_len=final_len, salt=salt)
            table.blocks = self.gpu.allocate_many(needed)
            table.num_tokens = num_tokens
            self._token_slots += num_tokens
            self._tables[seq_id] = table
            self._tails.track(seq_id, table)
            return 0
        # A lookup reads cached blocks, which growth may have taken; the first ids seen start
        # the cache: every grower takes what it is owed before (none was keyed).
        if self._ids_seen:
            self._settle_pool()
        elif self.config.enable_prefix_caching:  # (pinned prefixes alone key nothing)
            self._settle()
        self._ids_seen = True
        hit = self._hit(num_tokens, token_ids, cache_salt)
        if self._free_blocks_taken(num_tokens, hit) > self.num_free_blocks:  # (growth's held)
            return None
        salt = _to_salt(cache_salt)
        table = BlockTable(self.block_size, token_ids=token_ids, final_len=final_len, salt=salt)
        if hit.blocks:
            table.block_hashes = list(hit.block_keys)
            for block in hit.blocks:  # take the hits first so allocating cannot evict them
                if self.gpu.ref_counts[block] == 0:
                    self._token_slots += self.block_size
                self.gpu.incref(block)
            table.blocks = list(hit.blocks)
            table.num_tokens = hit.num_computed_tokens
        copies = table.append_slots(self.gpu, num_tokens - hit.num_computed_tokens)
        self._token_slots += num_tokens - hit.num_computed_tokens
        if copies:  # a pinned partial last block, copied before the prompt writes into it
            self._token_slots += hit.num_computed_tokens % self.block_size
            self._cow_copies += len(copies)
            self._pending_copies.extend(copies)
        if self.config.enable_prefix_caching and not self._pins and num_tokens >= 2:
            self._key_from_memo(table, token_ids[:num_tokens], salt)
        self._register_keys(table)
        if self.config.enable_prefix_caching or self.config.enable_pinned_prefixes:
            self._prefix_queries += num_tokens
            self._prefix_hits += hit.num_computed_tokens
        self._tables[seq_id] = table
        self._tails.track(seq_id, table)
        return hit.num_computed_tokens

    # ----- growth and sharing -----------------------------------------------------------------
    def append_slots(
        self,
        seq_id: SeqId,
        num_tokens: int = 1,
        *,
        token_ids: Sequence[int] | None = None,
        cache_limit: int | None = None,
    ) -> list[BlockCopy] | None:
        """Slots for ``num_tokens`` more tokens of ``seq_id``.

        Returns the copy-on-write copies to perform before writing (empty when none), or
        ``None``, changing nothing, when the free blocks do not suffice. ``cache_limit``: key
        only blocks within the first that many tokens now (a scheduler that does not know the
        newest token yet, as vLLM's async one); a later call keys the rest.
        """
        # Only its own table is read (growth's blocks not chosen yet may be cached free ones:
        # under prefix caching ``_settle`` makes them first; a pinned block is never free):
        # other growing sequences go on.
        self._settle((seq_id,))
        table = self._gpu_table(seq_id)
        if type(num_tokens) is not int or num_tokens < 0:  # (checked before anything moves)
            num_tokens = as_int("num_tokens", num_tokens, 0)
        if token_ids is not None:
            self._check_appended_ids(token_ids, num_tokens)
        fill = table.num_tokens % self.block_size
        if (
            fill
            and 0 < num_tokens <= self.block_size - fill
            and self.gpu.ref_counts[table.blocks[-1]] == 1
        ):
            # Fast path (most decode steps): the tokens go into the sequence's own partial
            # last block; no block is taken, nothing is copied, only the tail's books move.
            table.num_tokens += num_tokens
            self._tails.advance(seq_id, table, fill)
            self._token_slots += num_tokens
            if table.tokens_known:
                table.note_token_ids(num_tokens, token_ids)
                if fill + num_tokens == self.block_size:
                    self._register_keys(table, cache_limit)
            return []
        cow = table.needs_cow(self.gpu, num_tokens)
        if table.blocks_needed(num_tokens) + int(cow) > self.gpu.num_free - self._growth.held:
            return None
        self._tails.untrack(seq_id, table)
        old = table.num_tokens
        if self.config.enable_prefix_caching and table.tokens_known:
            copies = self._append_keyed(table, num_tokens, token_ids, cache_limit)
        else:
            copies = table.append_slots(self.gpu, num_tokens)
            table.note_token_ids(num_tokens, token_ids)
        # Copy-on-write duplicates the last block's tokens into a new physical block.
        copied = old % self.block_size if copies else 0
        self._token_slots += num_tokens + copied
        self._cow_copies += len(copies)
        self._register_keys(table, cache_limit)
        self._tails.track(seq_id, table)
        return copies

    def _append_keyed(
        self,
        table: BlockTable,
        num_tokens: int,
        token_ids: Sequence[int] | None,
        cache_limit: int | None,
    ) -> list[BlockCopy]:
        """``append_slots`` of many tokens with prefix caching on, a block at a time: each
        full block is keyed before the next one is taken, as one token at a time would key
        it. (Taking them all first can evict the free cached block that holds a key the new
        tokens give, which then moves to the new block: other evictions, other free order.)"""
        bs = self.block_size
        copies: list[BlockCopy] = []
        done = 0
        while done < num_tokens:
            piece = min(num_tokens - done, bs - table.num_tokens % bs)
            copies += table.append_slots(self.gpu, piece)
            ids = None if token_ids is None else token_ids[done : done + piece]
            table.note_token_ids(piece, ids)
            self._register_keys(table, cache_limit)
            done += piece
        return copies

    def cache_known_blocks(self, seq_id: SeqId, num_tokens: int) -> None:
        """Key the full blocks of ``seq_id`` within its first ``num_tokens`` tokens that are
        not keyed yet (with prefix caching on): for a scheduler that learns a step's tokens
        only after the next step is scheduled, as vLLM's async one, and keys them then."""
        self._settle()
        self._register_keys(self._gpu_table(seq_id), num_tokens)

    def last_full_keys(self, seq_ids: Sequence[SeqId]) -> set[BlockHash]:
        """The keys of these sequences' last blocks, where full and keyed."""
        bs = self.block_size
        got: set[BlockHash] = set()
        for seq_id in seq_ids:
            table = self._gpu_table(seq_id)
            n = table.num_tokens
            if n and n % bs == 0 and len(table.block_hashes) == n // bs:
                got.add(table.block_hashes[-1])
        return got

    def take_back_last_keys(self, seq_ids: Sequence[SeqId]) -> None:
        """The inverse of keying each sequence's last block, where its last token filled it
        and it is keyed: its table's keys and the pool's cache map forget that key, and a
        later ``cache_known_blocks`` makes it again. For a scheduler that learns a step's
        tokens a step late (vLLM's async one), whose rounds were run with their blocks keyed
        as they filled (the decode cohort: nothing read those keys in between)."""
        self._settle(seq_ids)
        bs = self.block_size
        for seq_id in seq_ids:
            table = self._gpu_table(seq_id)
            full = table.num_tokens // bs
            if full and table.num_tokens % bs == 0 and len(table.block_hashes) == full:
                self.gpu.uncache_block(table.blocks[full - 1], table.block_hashes.pop())

    def can_append_all(self, seq_ids: Sequence[SeqId], num_tokens: int) -> bool:
        """Would ``append_slots(s, num_tokens)`` succeed for every sequence, in order? Siblings
        sharing a partial last block each copy it but the last, who finds it its own."""
        self._settle(self._reads(seq_ids))
        bs = self.block_size
        refs = self.gpu.ref_counts
        left: dict[int, int] = {}  # shared last block -> references not yet copied away
        needed = 0
        for seq_id in seq_ids:
            table = self._gpu_table(seq_id)
            blocks = table.blocks
            t = table.num_tokens
            needed += cdiv(t + num_tokens, bs) - len(blocks)
            if num_tokens and t % bs and blocks:
                last = blocks[-1]
                r = left.get(last, refs[last])
                if r > 1:
                    needed += 1
                    left[last] = r - 1
        return needed <= self.gpu.num_free - self._growth.held

    def _reads(self, seq_ids: Sequence[SeqId]) -> Sequence[SeqId] | None:
        """The growing sequences whose blocks an operation on ``seq_ids`` reads: theirs, or
        every one where the cache may be read (growth's blocks not chosen yet may be cached
        free ones; a pinned block is never free, so never growth's). (Parallel samples fork
        and append as a group while the others grow on.)"""
        return None if self.config.enable_prefix_caching else seq_ids

    def append_slots_all(
        self,
        seq_ids: Sequence[SeqId],
        num_tokens: int,
        token_ids: Sequence[Sequence[int] | None] | None = None,
    ) -> list[BlockCopy]:
        """``append_slots(seq_id, num_tokens)`` for every sequence: the fast-forward's bulk
        decode append (one call per window instead of one per sequence).

        The caller has checked the room (free blocks); if it was wrong, ``PagedKVError`` is
        raised. Returns the copy-on-write copies, in order. ``token_ids``, when given, holds
        each sequence's new ids (or None). The common case (an unshared last block, token ids
        unknown or prefix caching off) skips the general path's checks.
        """
        self._settle(self._reads(seq_ids))
        bs = self.block_size
        tables = self._tables
        if type(num_tokens) is not int or num_tokens < 0:
            num_tokens = as_int("num_tokens", num_tokens, 0)
        if not all(map(tables.__contains__, seq_ids)):  # an unknown id: refuse before any move
            for seq_id in seq_ids:
                self._gpu_table(seq_id)
        if token_ids is not None and len(token_ids) != len(seq_ids):
            raise ConfigError("token_ids", len(token_ids), f"must hold {len(seq_ids)} entries")
        pool = self.gpu
        refs = pool.ref_counts
        take = pool.allocate
        general = self.config.enable_prefix_caching
        if general and num_tokens:
            return self._append_rounds(seq_ids, num_tokens, token_ids)
        copies: list[BlockCopy] = []
        same: list[int] = []  # last blocks that stay partial: only their fill moves
        grown: list[tuple[SeqId, BlockTable, int]] = []  # took blocks or filled the last one
        held = self._growth.held  # (those of sequences still growing: not these)
        free = pool.num_free - held
        try:
            for i, seq_id in enumerate(seq_ids):
                table = tables.get(seq_id) or self._gpu_table(seq_id)
                blocks = table.blocks
                if general or table.tokens_known or (blocks and refs[blocks[-1]] > 1):
                    ids = None if token_ids is None else token_ids[i]
                    done = self.append_slots(seq_id, num_tokens, token_ids=ids)
                    if done is None:
                        raise PagedKVError(f"append_slots_all: no room for sequence {seq_id!r}")
                    copies.extend(done)
                    free = pool.num_free - held
                    continue
                old = table.num_tokens
                new = old + num_tokens
                fill = old % bs
                if fill and fill + num_tokens < bs:
                    final = table.final_len
                    if final is None or new <= final:
                        table.num_tokens = new
                        same.append(blocks[-1])
                        continue
                need = -(-new // bs) - len(blocks)
                if need:
                    if need > free:
                        raise PagedKVError(f"append_slots_all: no room for sequence {seq_id!r}")
                    free -= need
                    if need == 1:  # (a decode round's usual case)
                        blocks.append(take())
                    else:  # a lag that growth settles, say: as ``need`` allocate() calls
                        blocks += pool.allocate_many(need)
                table.num_tokens = new
                grown.append((seq_id, table, old))
        finally:  # the books stay whole even if a sequence had no room
            self._tails.fill_in_place(same, num_tokens)
            self._tails.grow_all(grown)
            self._token_slots += num_tokens * (len(same) + len(grown))
        return copies

    def fork(
        self, parent: SeqId, child: SeqId, *, final_len: int | None = None
    ) -> list[BlockCopy] | None:
        """``child`` shares every block of ``parent`` (reference counts + 1). Never needs room,
        so it returns ``[]``: copies happen lazily, on the first append into a shared block."""
        self._settle(self._reads((parent,)))
        table = self._gpu_table(parent)
        if child in self._tables or child in self._swapped:
            raise UnknownSequenceError(f"sequence {child!r} is already allocated")
        if final_len is not None and (type(final_len) is not int or final_len < 0):
            # (a parent may have grown past its own final length, so a child may start there)
            final_len = as_int("final_len", final_len, 0)
        child_table = table.fork(self.gpu, final_len if final_len is not None else table.final_len)
        self._tables[child] = child_table
        self._tails.track(child, child_table)
        return []

    def free(self, seq_id: SeqId) -> None:
        """Release every block of ``seq_id`` (GPU or swapped), last block first. A growing
        sequence's blocks not chosen yet were never taken: they stay free."""
        growth = self._growth
        if self._keyed:  # the queue it frees into must be the rounds' first (keyed_growth)
            self._settle((seq_id,))
        if growth.seqs:
            grower = growth.seqs.pop(seq_id, None)
            if grower is not None:
                growth.drop(grower)
        table = self._tables.pop(seq_id, None)
        if table is None:
            if seq_id in self._swapped:
                self._swapped.pop(seq_id).release(self.cpu)
                return
            table = self._gpu_table(seq_id)  # raises: not allocated
        self._tails.untrack(seq_id, table)
        self._release_gpu(table)

    # ----- integrity --------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Recompute the books from the tables and compare; raise IntegrityError on any gap
        (growing sequences: their sums from each one's state, their tables as of their join)."""
        self._growth.check(self._tables, self._chosen_counts())
        self._check_keyed()
        if self._growth.held > self.gpu.num_free:
            held = self._growth.held
            raise IntegrityError(f"growth holds {held} blocks; the pool has fewer free")
        overlap = self._tables.keys() & self._swapped.keys()
        if overlap:
            raise IntegrityError(f"sequences both on GPU and swapped: {sorted(map(str, overlap))}")
        for pool, tables in ((self.gpu, self._tables), (self.cpu, self._swapped)):
            expected = [0] * pool.num_blocks
            for table in tables.values():
                for b in table.blocks:
                    expected[b] += 1
            if pool is self.gpu:
                self._add_pin_refs(expected)
                self._add_chosen_refs(expected)
            pool.check_integrity(expected)
        slots: dict[int, int] = {}
        for seq_id, table in {**self._tables, **self._swapped}.items():
            if len(table.blocks) != self.blocks_for(table.num_tokens):
                raise IntegrityError(f"sequence {seq_id!r} holds a wrong number of blocks")
            if seq_id in self._tables:
                for j, b in enumerate(table.blocks):
                    if slots.setdefault(b, table.fill(j)) != table.fill(j):
                        raise IntegrityError(f"shared block {b} has different fills")
                    key = self.gpu.block_hash[b]
                    if key is not None and (
                        j >= len(table.block_hashes) or table.block_hashes[j] != key
                    ):
                        raise IntegrityError(
                            f"block {b} is cached under a key its tokens do not give"
                        )
            self._check_keys(seq_id, table)
        self._add_pin_slots(slots)
        if sum(slots.values()) != self._token_slots:
            raise IntegrityError(
                f"token slots: books {self._token_slots}, tables {sum(slots.values())}"
            )
        self._tails.check(self._tables)

    # ----- internals --------------------------------------------------------------------------
    def _check_keys(self, seq_id: SeqId, table: BlockTable) -> None:
        if not table.block_hashes:
            return
        want = hash_blocks(
            table.token_ids, self.block_size, table.salt, None, len(table.block_hashes)
        )
        if want != table.block_hashes:
            raise IntegrityError(f"sequence {seq_id!r}: block keys do not match its token ids")

    def _any_table(self, seq_id: SeqId) -> BlockTable:
        table = self._tables.get(seq_id)
        if table is None:
            table = self._swapped.get(seq_id)
        if table is None:
            raise UnknownSequenceError(f"unknown sequence {seq_id!r}")
        return table

    def _gpu_table(self, seq_id: SeqId) -> BlockTable:
        table = self._tables.get(seq_id)
        if table is None:
            where = "is swapped out" if seq_id in self._swapped else "is not allocated"
            raise UnknownSequenceError(f"sequence {seq_id!r} {where}")
        return table

    def _check_new(
        self,
        seq_id: SeqId,
        num_tokens: int,
        token_ids: Sequence[int] | None,
        final_len: int | None,
        cache_salt: str | bytes | None,
    ) -> tuple[int, int | None]:
        """Every argument of ``can_allocate`` / ``allocate``, checked before anything changes
        (O(1), and O(len(token_ids)) once when the ids will be read); the counts as plain
        ints (numpy integers accepted, bools and floats refused: ``as_int``)."""
        if seq_id in self._tables or seq_id in self._swapped:
            raise UnknownSequenceError(f"sequence {seq_id!r} is already allocated")
        if type(num_tokens) is not int or num_tokens < 0:
            num_tokens = as_int("num_tokens", num_tokens, 0)
        if final_len is not None and (type(final_len) is not int or final_len < num_tokens):
            final_len = self._check_final(final_len, num_tokens)  # (a plain int passes at once)
        if token_ids is not None:
            if _length(token_ids) < num_tokens:
                raise ConfigError(
                    "token_ids", len(token_ids), f"must hold at least num_tokens={num_tokens} ids"
                )
            if self._ids_read:
                check_token_ids("token_ids", token_ids)
        if cache_salt is not None and not isinstance(cache_salt, (str, bytes)):
            raise ConfigError("cache_salt", cache_salt, "must be a str, bytes or None")
        return num_tokens, final_len

    @staticmethod
    def _check_final(final_len: int, num_tokens: int) -> int:
        if type(final_len) is not int or final_len < num_tokens:
            final_len = as_int("final_len", final_len, 0)
            if final_len < num_tokens:
                raise ConfigError("final_len", final_len, f"must be >= num_tokens ({num_tokens})")
        return final_len

    def _check_appended_ids(self, token_ids: Sequence[int], num_tokens: int) -> None:
        if _length(token_ids) != num_tokens:
            raise ConfigError(
                "token_ids", len(token_ids), f"must hold exactly num_tokens={num_tokens} ids"
            )
        if self._ids_read:
            check_token_ids("token_ids", token_ids)

    def _hit(
        self, num_tokens: int, token_ids: Sequence[int] | None, cache_salt: str | bytes | None
    ) -> PrefixHit:
        if token_ids is None:
            return NO_HIT
        if self._pins:  # explicit mode: a registered prefix, partial last block included
            pinned = self.match_prefix(token_ids, num_tokens)
            if pinned is None:
                return NO_HIT
            return PrefixHit(pinned.blocks, pinned.num_tokens)
        return self.lookup_prefix(token_ids[:num_tokens], cache_salt=cache_salt)

    def free_blocks_taken(self, num_tokens: int, hit: PrefixHit) -> int:
        """Free blocks that allocating ``num_tokens`` tokens after ``hit`` would take (a hit
        block that is free still leaves the free queue); the policy's own admission test."""
        return self._free_blocks_taken(num_tokens, hit)

    def _free_blocks_taken(self, num_tokens: int, hit: PrefixHit) -> int:
        """Free-queue entries an allocation consumes: every block but hits already in use."""
        if not hit.blocks:
            return -(-num_tokens // self.block_size)
        shared = sum(1 for b in hit.blocks if self.gpu.ref_counts[b] > 0)
        cow = int(hit.num_computed_tokens % self.block_size != 0)  # a pinned partial block
        return self.blocks_for(num_tokens) - shared + cow

    def _register_keys(self, table: BlockTable, limit: int | None = None) -> None:
        """Key the blocks that became full with known tokens (only with prefix caching on),
        within the first ``limit`` tokens if given."""
        if self.config.enable_prefix_caching and table.tokens_known:
            for j, key in table.new_block_keys(limit):
                self.gpu.cache_block(table.blocks[j], key)

    def _release_gpu(self, table: BlockTable) -> None:
        if not table.blocks:
            return
        # Every block but the last is full, so only the last one's fill needs looking up.
        bs = self.block_size
        last, last_fill = table.blocks[-1], table.num_tokens - (len(table.blocks) - 1) * bs
        freed = table.release(self.gpu)
        self._token_slots -= bs * len(freed)
        if freed and freed[0] == last:
            self._token_slots -= max(0, last_fill) - bs


def _length(token_ids: Sequence[int]) -> int:
    try:
        return len(token_ids)
    except TypeError:
        raise ConfigError("token_ids", token_ids, "must be a sequence of ids or None") from None

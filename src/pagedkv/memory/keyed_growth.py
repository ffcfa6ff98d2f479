"""Growth under prefix caching: lazy decoding sequences whose blocks and keys are made, when
read, in the very order the rounds would have made them.

With prefix caching the pool's state depends on the order of three things a decode round
does: each block a sequence starts is taken from the head of the free queue (which may evict
a free cached block), each block it fills gets a key (entering the cache map), and a finish
puts its full blocks at the tail of the queue and the rest at its head. Which block a
sequence gets, and which cached block an allocation evicts, follow from that order: round by
round, and within a round in the caller's order (the running order). So a grower's blocks
cannot simply be taken in one piece when read, as without keys (``growth.py``).

But only two kinds of round touch the pool for a grower: the round that starts a block and the
round that fills one; they recur every ``block_size`` rounds, at rounds congruent to one
residue (``(join + room) % bs`` fills, the next residue starts). So the growers sit in
``block_size`` buckets by that residue, and ``_materialise`` replays rounds ``made + 1 .. d``
visiting only the growers with a block event in each (in the caller's order), their quiet
tokens appended in one piece before each event::

    round i:  bucket (i - 1) % bs  starts a block     (pool.allocate: may evict)
              bucket i % bs        fills one          (its key: pool.cache_block)

Cost per block, not per token or per grower. When no key the rounds fill with is in the cache
already or made twice, the order of keys against allocations cannot matter (``keyed_append``'s
argument), and ``_materialise_at_once`` takes the rounds' blocks in one pass instead. That
pass settles no grower: the blocks it takes for one are *chosen* (out of the pool, theirs,
``Growth.choose``), the keys it makes go into its table's keys and the pool's cache map
(*ahead* of the table's tokens), and its table takes the chosen blocks and its tokens only when
something reads it (``_take_chosen``: a settle, the round-by-round replay, a prefix hit on a
block keyed ahead). The replay (which reads the tables) first brings the lagging growers to
its first round; a grower touched goes on growing from round d (``Growth.shift``: its table
then holds its tokens and blocks; its residue does not change). The books (``Growth``'s
closed-form sums) never depended on the order, only the pool does, so
``_materialise`` runs only where the pool is read: a prefix lookup, an allocation with ids, a
swap, a free, and before anything settles a sequence.

A grower's future ids are known at ``grow`` (a simulated request's planned outputs): its table
is told them once (ids may run ahead of tokens), so a filled block's key is made from the
table alone, and ``growth_may_key`` can say, for a waiting request's keys, whether a grower's
next full block could complete one of them (then a lookup between events could hit more).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from pagedkv.errors import ConfigError, IntegrityError, PagedKVError
from pagedkv.memory.block_pool import BlockPool
from pagedkv.memory.block_table import BlockTable
from pagedkv.memory.config import CacheConfig
from pagedkv.memory.growth import Growth, Window
from pagedkv.memory.interface import SeqId
from pagedkv.memory.prefix_hash import BlockHash, check_token_ids, keys_of, run_code, sha256
from pagedkv.memory.tail_books import TailBooks
from pagedkv.memory.token_runs import TokenRuns

_ALLOC, _FILL = 1, 2


class _Keyed(NamedTuple):
    """A grower's place in the replay: its order key, its residue bucket, and the key its
    next full block chains from (``_NONE``: it keys nothing)."""

    order: object
    bucket: int
    parent: object


_NONE = object()  # a grower whose next full block gets no key (its ids unknown)


class KeyedGrowthMixin:
    """``KVCacheManager``'s growers under prefix caching (the module docstring)."""

    config: CacheConfig
    gpu: BlockPool
    block_size: int
    _growth: Growth
    _tables: dict[SeqId, BlockTable]
    _tails: TailBooks
    _token_slots: int
    _ids_seen: bool

    def _register_keys(self, table: BlockTable, limit: int | None = None) -> None:
        raise NotImplementedError

    def _init_keyed(self) -> None:
        self._keyed: dict[SeqId, _Keyed] = {}
        self._buckets: list[dict[SeqId, object]] = [{} for _ in range(self.block_size)]
        self._made = 0  # rounds of growth whose blocks and keys the pool holds
        self._lost: set[SeqId] = set()  # ids known so far but not ahead: lost at a token
        # growers by the key their next full block chains from (None: the root)
        self._parents: dict[BlockHash | None, set[SeqId]] = {}
        self._next_keys: dict[SeqId, BlockHash | None] = {}
        self._stale: set[SeqId] = set()  # growers whose parent entry lags (filled since)
        self._serial_order = 0
        self._ids_len: dict[SeqId, int] = {}  # a grower's known ids before ``grow`` told more
        # Blocks the one-pass replay took from the pool for a grower, in order, that its table
        # does not hold yet (their keys are in its table already): the grower is not settled
        # at every block it takes, only when read (``_take_chosen``).
        self._chosen: dict[SeqId, list[int]] = {}
        # The blocks keyed ahead of their grower's table (those it filled since its table's
        # tokens), by block: a prefix hit on one reads the grower, which then takes them.
        self._ahead: dict[int, SeqId] = {}

    # ----- joining ---------------------------------------------------------------------------
    def _grow_keyed(
        self, seq_id: SeqId, table: BlockTable, ids: Sequence[int] | None, order: object
    ) -> None:
        """``grow`` of one sequence under prefix caching: ``ids``, its tokens' ids from its
        current count to its final length (None: unknown; its keys stop at its next token,
        as an append without ids stops them)."""
        if table.tokens_known:
            n, known = table.num_tokens, len(table.token_ids)
            if len(table.block_hashes) != n // self.block_size:
                raise PagedKVError(f"sequence {seq_id!r}: keys held back")
            if ids is None:
                if known > n:  # (appends without ids would keep those ahead, then lose them)
                    raise PagedKVError(f"sequence {seq_id!r}: its ids run ahead; pass the rest")
                self._lost.add(seq_id)
            else:
                final = table.final_len
                if final is None or len(ids) < final - n:
                    want = "its final length" if final is None else f"{final - n} ids"
                    raise ConfigError("token_ids", len(ids), f"must hold {want}")
                if known < final:
                    ids = ids[known - n : final - n]  # (those ahead are the table's already)
                    check_token_ids("token_ids", ids)
                    table.extend_ids(ids)
                self._ids_len[seq_id] = known
        if order is None:
            self._serial_order += 1
            order = (1, self._serial_order)
        self._growth.add(seq_id, table)
        self._join_keyed(seq_id, table, order)

    def _join_keyed(self, seq_id: SeqId, table: BlockTable, order: object) -> None:
        g = self._growth.seqs[seq_id]
        bucket = (g.join + g.room) % self.block_size
        parent: object = _NONE
        if table.tokens_known and seq_id not in self._lost:
            hashes = table.block_hashes
            parent = hashes[-1] if hashes else None
            self._parents.setdefault(parent, set()).add(seq_id)
        self._keyed[seq_id] = _Keyed(order, bucket, parent)
        self._buckets[bucket][seq_id] = order

    def _leave_keyed(self, seq_id: SeqId) -> object:
        """Take a grower out of the replay's books; returns its order key."""
        k = self._keyed.pop(seq_id)
        del self._buckets[k.bucket][seq_id]
        self._next_keys.pop(seq_id, None)
        self._stale.discard(seq_id)
        if k.parent is not _NONE:
            sharers = self._parents[k.parent]  # type: ignore[index]
            sharers.discard(seq_id)
            if not sharers:
                del self._parents[k.parent]  # type: ignore[arg-type]
        return k.order

    # ----- the replay ------------------------------------------------------------------------
    def _materialise(self) -> None:
        """Make every block and key growth owes the pool up to the current round, in the
        rounds' order (module docstring)."""
        growth = self._growth
        d, m = growth.round, self._made
        self._made = d
        if m >= d or not self._keyed or self._materialise_at_once(m, d):
            return
        self._take_chosen(m)  # (the replay reads and writes the tables as of round m)
        bs = self.block_size
        seqs, tables, pool = growth.seqs, self._tables, self.gpu
        lost, tails, buckets = self._lost, self._tails, self._buckets
        # each bucket's growers in order, tagged as they start (_ALLOC) or fill (_FILL) a
        # block in a round: made when first needed
        starts: list[list[tuple[object, int, SeqId]] | None] = [None] * bs
        fills: list[list[tuple[object, int, SeqId]] | None] = [None] * bs
        touched: dict[SeqId, None] = {}
        keyed = self._stale  # touched ones that filled a block: a new parent key
        for i in range(m + 1, d + 1):
            c = (i - 1) % bs
            starting = starts[c]
            if starting is None:
                got = [(o, _ALLOC, s) for s, o in buckets[c].items()]
                starting = starts[c] = sorted(got, key=_first) if len(got) > 1 else got
            if bs == 1:
                events = starting
            else:
                c = i % bs
                filling = fills[c]
                if filling is None:
                    got = [(o, _FILL, s) for s, o in buckets[c].items()]
                    filling = fills[c] = sorted(got, key=_first) if len(got) > 1 else got
                if starting and filling:
                    events = sorted(starting + filling, key=_first)
                else:
                    events = starting or filling
            for _, kind, seq_id in events:
                join, tokens, room, owed, _, end, _ = seqs[seq_id]
                x = i - join  # its x-th round since it joined: tokens + x after it
                if x <= 0 or (end >= 0 and i > end):
                    continue
                table = tables[seq_id]
                keys = table.tokens_known and seq_id not in lost
                if kind == _ALLOC:
                    if x <= room or 0 <= owed <= (x - room - 1) // bs:
                        continue
                elif x < room or not keys:
                    continue  # (a fill without a key touches no pool)
                if seq_id not in touched:
                    touched[seq_id] = None
                if kind == _ALLOC:
                    table.blocks.append(pool.allocate())
                table.num_tokens = tokens + x
                if seq_id in lost:
                    lost.discard(seq_id)
                    table.tokens_known = keys = False
                if keys and (kind == _FILL or bs == 1):
                    self._key_filled(table)
                    keyed.add(seq_id)
        if not touched:
            return
        grown: list[tuple[SeqId, BlockTable, int]] = []  # (the tail books move once each)
        for seq_id in touched:  # the quiet tokens after its last event
            table = tables[seq_id]
            join, tokens = seqs[seq_id][:2]
            table.num_tokens = tokens + (d - join)
            self._token_slots += d - join
            grown.append((seq_id, table, tokens))
        tails.grow_all(grown)  # (a grower's last block, if partial, is its own)
        growth.shift(list(touched), tables)

    def _materialise_at_once(self, m: int, d: int) -> bool:
        """``_materialise`` of rounds m+1 .. d in one pass, when the order of the rounds cannot
        matter (``keyed_append``'s blocks-at-once argument): no key a block fills with is in
        the cache already or made twice, and every grower's ids are known ahead. Then a key's
        registration touches only a used block and the cache map, so the blocks are taken
        from the pool in the rounds' order (round, then order key) and the keys registered
        after. False, changing nothing, otherwise (the replay then runs)."""
        growth, tables, pool = self._growth, self._tables, self.gpu
        bs, seqs, buckets = self.block_size, growth.seqs, self._buckets
        if d - m >= bs:
            residues: Iterable[int] = range(bs)
        else:  # buckets (i - 1) % bs and i % bs for i in m+1 .. d (fewer than bs: distinct)
            residues = [r % bs for r in range(m, d + 1)]
        lost = self._lost
        # (round, order, n, seq_id) of each new block: n (a count) keeps the sort stable on
        # equal (round, order) without comparing sequence ids
        takes: list[tuple[int, object, int, SeqId]] = []
        new_keys: list[BlockHash] = []  # every key made, table by table
        # (seq_id, table, its first new key's block, n)
        keyed: list[tuple[SeqId, BlockTable, int, int]] = []
        sha, code = sha256, run_code
        for c in residues:
            bucket = buckets[c]
            if not bucket:
                continue
            # this bucket's first fill round (congruent to c) and first start (c + 1) after m
            fill_at = m + 1 + (c - m - 1) % bs
            start_at = m + 1 + (c - m) % bs
            for seq_id, order in bucket.items():
                join, tokens, room, owed, _, end, _ = seqs[seq_id]
                hi = d if end < 0 or end > d else end  # its last round in the window
                # its starts: rounds a + 1 + q bs (q < owed), fills: a + q bs (after join),
                # a = join + room; those in the window: lo_s .. hi_s, lo_f .. hi, step bs
                a = join + room
                lo_s = a + 1 if a >= start_at else start_at
                hi_s = hi if owed < 0 or a + 1 + (owed - 1) * bs > hi else a + 1 + (owed - 1) * bs
                lo_f = (a if room else a + bs) if a >= fill_at else fill_at
                if lo_s > hi_s and lo_f > hi:
                    continue
                if seq_id in lost:
                    return False
                table = tables[seq_id]
                if lo_s <= hi_s:
                    if lo_s + bs > hi_s:
                        takes.append((lo_s, order, len(takes), seq_id))
                    else:
                        n = len(takes)
                        rounds = range(lo_s, hi_s + 1, bs)
                        takes += [(i, order, n + q, seq_id) for q, i in enumerate(rounds)]
                if lo_f <= hi and table.tokens_known:
                    hashes = table.block_hashes
                    j0 = len(hashes)
                    # blocks full after its last fill in the window
                    n = (tokens + lo_f + (hi - lo_f) // bs * bs - join) // bs - j0
                    ids = table.token_ids
                    if j0 and type(ids) is TokenRuns:  # (keys_of's usual case, inlined)
                        last = ids.runs[-1]
                        first = last.start + j0 * bs - (len(ids) - len(last))
                        if first >= last.start:
                            head = hashes[-1]
                            for start in range(first, first + n * bs, bs):
                                head = sha(head + code(b"R", start, bs)).digest()
                                new_keys.append(head)
                        else:
                            new_keys += keys_of(ids, j0, j0 + n, bs, table.salt, hashes[-1])
                    else:
                        parent = hashes[-1] if j0 else None
                        new_keys += keys_of(ids, j0, j0 + n, bs, table.salt, parent)
                    keyed.append((seq_id, table, j0, n))
        if not takes and not new_keys:
            return True  # (no table moves: growers go on as they were)
        if new_keys and (len(set(new_keys)) != len(new_keys) or pool.any_cached(new_keys)):
            return False
        chosen = self._chosen
        if takes:
            if len(takes) > 1:
                takes.sort()
            for take, block in zip(takes, pool.allocate_many(len(takes)), strict=True):
                got = chosen.get(take[3])
                if got is None:
                    chosen[take[3]] = [block]
                else:
                    got.append(block)
            growth.choose(len(takes))
        if new_keys:  # each key's block: its table's, or one chosen for it (in order)
            filled: list[int] = []
            owners: list[SeqId] = []  # each filled block's grower
            i = 0
            for seq_id, table, j0, n in keyed:
                blocks = table.blocks
                j = j0 - len(blocks)
                if j >= 0:  # (the usual case: all in blocks chosen for it)
                    filled += chosen[seq_id][j : j + n]
                elif j + n <= 0:
                    filled += blocks[j0 : j0 + n]
                else:
                    filled += (blocks + chosen[seq_id])[j0 : j0 + n]
                owners += [seq_id] * n
                table.block_hashes += new_keys[i : i + n]
                i += n
            self._ahead.update(zip(filled, owners, strict=True))
            pool.cache_new(filled, new_keys)
            self._stale.update([k[0] for k in keyed])
        return True

    def _take_chosen(self, at: int, only: Iterable[SeqId] | None = None) -> None:
        """The growers (those of ``only``) whose tables lag behind the pool (blocks chosen for
        them, or keyed ahead) take their blocks and their tokens up to round ``at`` (the pool
        made up to it), and go on from there (``Growth.shift``): their tables as a replay
        round by round would have left them."""
        chosen, ahead = self._chosen, self._ahead
        if not chosen and not ahead:
            return
        lagging = set(ahead.values()).union(chosen)
        moved = list(lagging) if only is None else [s for s in only if s in lagging]
        if not moved:
            return
        seqs, tables, bs = self._growth.seqs, self._tables, self.block_size
        counts: dict[SeqId, int] = {}
        grown: list[tuple[SeqId, BlockTable, int]] = []
        lag = 0
        for seq_id in moved:
            table = tables[seq_id]
            blocks = chosen.pop(seq_id, None)
            if blocks is not None:
                table.blocks += blocks
                counts[seq_id] = len(blocks)
            join, tokens = seqs[seq_id][:2]
            for block in table.blocks[tokens // bs : len(table.block_hashes)]:
                del ahead[block]
            table.num_tokens = tokens + (at - join)
            lag += at - join
            grown.append((seq_id, table, tokens))
        self._token_slots += lag
        self._tails.grow_all(grown)
        self._growth.shift(moved, tables, at, counts)

    def _settle_ahead(self, blocks: Iterable[int]) -> None:
        """A pool read found these blocks: a grower keyed ahead of its table among them takes
        its blocks and tokens first (``_take_chosen``)."""
        ahead = self._ahead
        owners = {ahead[b] for b in blocks if b in ahead}
        if owners:
            self._take_chosen(self._made, owners)

    def _reparent(self, seq_id: SeqId, table: BlockTable) -> None:
        k = self._keyed[seq_id]
        if k.parent is not _NONE:
            sharers = self._parents[k.parent]  # type: ignore[index]
            sharers.discard(seq_id)
            if not sharers:
                del self._parents[k.parent]  # type: ignore[arg-type]
        parent: object = _NONE
        if table.tokens_known and seq_id not in self._lost:
            parent = table.block_hashes[-1] if table.block_hashes else None
            self._parents.setdefault(parent, set()).add(seq_id)
        self._keyed[seq_id] = k._replace(parent=parent)
        self._next_keys.pop(seq_id, None)

    def short_round(self, make_room: Callable[[SeqId], bool]) -> Window:
        """The next round of growth when its new blocks do not all fit (``rounds_that_fit``
        is 0), as a round of appends would run it: the growers with a block event in it (one
        that starts a block, one that fills one) append their token in order, and where a
        block is short, ``make_room(seq_id)`` is called until one is free: the caller frees
        or swaps out a victim (False: the victim was ``seq_id`` itself, which then appends
        nothing). Every other grower gains its token too (none takes a block). Returns the
        round's ``Window``."""
        self._materialise()
        self._take_chosen(self._made)
        growth, tables, pool, tails = self._growth, self._tables, self.gpu, self._tails
        d = growth.round
        i, bs = d + 1, self.block_size
        seqs, lost = growth.seqs, self._lost
        buckets = [self._buckets[d % bs]] + ([self._buckets[i % bs]] if bs > 1 else [])
        candidates = sorted([(o, s) for b in buckets for s, o in b.items()], key=_first)
        events: list[tuple[SeqId, bool, bool]] = []
        for _, seq_id in candidates:
            g = seqs[seq_id]
            x = i - g.join
            if x <= 0 or (g.end >= 0 and i > g.end):
                continue
            room = g.room
            starts = (
                x > room and (x - room - 1) % bs == 0 and not 0 <= g.taken <= (x - room - 1) // bs
            )
            fills = x >= room and (x - room) % bs == 0
            if starts or fills:
                events.append((seq_id, starts, fills))
        done: list[tuple[SeqId, object]] = []
        for seq_id, starts, fills in events:
            if seq_id not in seqs:
                continue  # a victim already
            if starts:
                while pool.num_free - growth.held < 1 and make_room(seq_id):
                    pass
                if seq_id not in seqs:
                    continue  # it was the victim
            table = tables[seq_id]
            order = self._leave_keyed(seq_id)
            lag, taken = growth.remove(seq_id)
            if taken:
                raise IntegrityError(f"growing sequence {seq_id!r} owes {taken} blocks")
            tails.untrack(seq_id, table)
            if starts:
                table.blocks.append(pool.allocate())
            table.num_tokens += lag + 1
            self._token_slots += lag + 1
            if seq_id in lost:
                lost.discard(seq_id)
                table.tokens_known = False
            if fills and table.tokens_known:
                self._key_filled(table)
            tails.track(seq_id, table)
            done.append((seq_id, order))
        window = growth.advance(1, pool.num_free - growth.held)
        for seq_id, order in done:
            table = tables[seq_id]
            growth.add(seq_id, table)
            self._join_keyed(seq_id, table, order)
        self._made = growth.round
        return window

    def _key_filled(self, table: BlockTable) -> None:
        """Key the block the table's last token just filled (``_register_keys`` for the usual
        case: every block before it keyed, the ids runs), from one encoding of its ids."""
        bs = self.block_size
        hashes = table.block_hashes
        j = len(hashes)
        end = table.num_tokens
        if (j + 1) * bs != end:
            self._register_keys(table)
            return
        key = keys_of(table.token_ids, j, j + 1, bs, table.salt, hashes[-1] if j else None)[0]
        hashes.append(key)
        self.gpu.cache_block(table.blocks[j], key)

    def _settle_keyed(self, only: Iterable[SeqId] | None) -> None:
        """Stop these growers (all if None): the pool made up to now, each table takes its
        quiet tokens since (no block starts or fills among them) and its ids run ahead no
        more."""
        self._materialise()
        growth, tables, tails = self._growth, self._tables, self._tails
        keyed, chosen, ahead, bs = self._keyed, self._chosen, self._ahead, self.block_size
        for seq_id in list(keyed) if only is None else [s for s in only if s in keyed]:
            table = tables[seq_id]
            self._leave_keyed(seq_id)
            blocks = chosen.pop(seq_id, ())
            lag, taken = growth.remove(seq_id, len(blocks))
            if taken != len(blocks):
                raise IntegrityError(f"growing sequence {seq_id!r} owes {taken} blocks")
            if lag:
                tails.untrack(seq_id, table)
                table.blocks += blocks
                if ahead:
                    for block in table.blocks[table.num_tokens // bs : len(table.block_hashes)]:
                        ahead.pop(block, None)
                table.num_tokens += lag
                self._token_slots += lag
                tails.track(seq_id, table)
                if seq_id in self._lost:
                    table.tokens_known = False
            self._lost.discard(seq_id)
            # the ids as appends would have left them: those known before, or the tokens'
            keep = max(self._ids_len.pop(seq_id, 0), table.num_tokens)
            if table.tokens_known and len(table.token_ids) > keep:
                ids = table.token_ids
                if isinstance(ids, list):
                    del ids[keep:]
                else:
                    table.token_ids = ids[:keep]

    # ----- queries ---------------------------------------------------------------------------
    def growth_may_key(self, keys: Sequence[BlockHash]) -> bool:
        """Could a growing sequence's next full block get one of ``keys`` (a chain of block
        keys from the root: a waiting request's, a swapped one's)? A key chains over its
        parent, so a grower's later blocks can give a key of the chain only if its next one
        does: False means no decode round to come adds a key of the chain to the cache."""
        stale, tables = self._stale, self._tables
        while stale:  # its next full block chains from its new last key
            seq_id = stale.pop()
            self._reparent(seq_id, tables[seq_id])
        parents = self._parents
        if not parents:
            return False
        bs = self.block_size
        for j, key in enumerate(keys):
            sharers = parents.get(keys[j - 1] if j else None)
            if not sharers:
                continue
            for seq_id in sharers:
                if self._next_key(seq_id, bs) == key:
                    return True
        return False

    def _next_key(self, seq_id: SeqId, bs: int) -> BlockHash | None:
        got = self._next_keys.get(seq_id, b"")
        if got != b"":
            return got
        table = self._tables[seq_id]
        j = len(table.block_hashes)
        ids = table.token_ids
        key = None
        if len(ids) >= (j + 1) * bs:
            parent = table.block_hashes[-1] if j else None
            key = keys_of(ids, j, j + 1, bs, table.salt, parent)[0]
        self._next_keys[seq_id] = key
        return key

    def _check_keyed(self) -> None:
        """The replay's books: every keyed grower grows, sits in its residue's bucket, and the
        pool is made up to no later than the current round."""
        growth = self._growth
        if not (self.config.enable_prefix_caching and self._ids_seen):
            if self._keyed:
                raise IntegrityError("growers in the replay without prefix caching or ids")
            return
        if self._keyed.keys() != growth.seqs.keys():
            raise IntegrityError("growers under prefix caching missing from the replay")
        for seq_id, k in self._keyed.items():
            g = growth.seqs[seq_id]
            if (
                k.bucket != (g.join + g.room) % self.block_size
                or seq_id not in self._buckets[k.bucket]
            ):
                raise IntegrityError(f"growing sequence {seq_id!r} in the wrong bucket")
        if sum(map(len, self._buckets)) != len(self._keyed) or self._made > growth.round:
            raise IntegrityError("replay buckets disagree with the growers")
        if self._chosen.keys() - self._keyed.keys() or not all(self._chosen.values()):
            raise IntegrityError("blocks chosen for a sequence that does not grow")
        bs, made = self.block_size, self._made
        ahead: dict[int, SeqId] = {}
        for seq_id, g in growth.seqs.items():  # made up to round ``made``: blocks and keys
            x = max(0, made - g.join)
            if g.end >= 0:
                x = min(x, g.end - g.join)
            if len(self._chosen.get(seq_id, ())) != g.taken_by(g.join + x, bs):
                raise IntegrityError(f"growing sequence {seq_id!r}: blocks chosen off")
            table = self._tables[seq_id]
            keys = (g.tokens + x) // bs if table.tokens_known and seq_id not in self._lost else 0
            if keys and len(table.block_hashes) != keys:
                raise IntegrityError(f"growing sequence {seq_id!r}: keys made off")
            blocks = table.blocks + self._chosen.get(seq_id, [])
            for j in range(g.tokens // bs, len(table.block_hashes)):
                ahead[blocks[j]] = seq_id
        if ahead != self._ahead:
            raise IntegrityError("the blocks keyed ahead of their tables are off")

    def _chosen_counts(self) -> dict[SeqId, int]:
        """Each grower's chosen blocks (``Growth.check``'s)."""
        return {seq_id: len(blocks) for seq_id, blocks in self._chosen.items()}

    def _add_chosen_refs(self, expected: list[int]) -> None:
        """The references of the chosen blocks, which no table holds yet (integrity)."""
        for blocks in self._chosen.values():
            for block in blocks:
                expected[block] += 1


def _first(t: tuple[Any, ...]) -> Any:
    return t[0]

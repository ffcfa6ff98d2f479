"""Growth in closed form: decoding sequences that gain one token per round, kept exact lazily.

A sequence that decodes gains one token a round, so from the round r0 it starts growing its
state at round d is a formula of d - r0 alone::

    tokens(d)     = t0 + (d - r0)                       (t0, its tokens at r0)
    new blocks    at rounds r0 + room + 1 + q bs, q = 0, 1, ... (room: free slots at r0)
    last block    the one whose slots reach its final length F; its frag = slots - F,
                  internal fragmentation from its round on

``Growth`` keeps the growers of a paged manager (``KVCacheManager.grow``) as their state at r0
plus sums over all of them, brought to round d in O(1) (``PeriodicCounts``: a grower takes a
block at rounds congruent to its residue modulo bs) and O(log n) per last block (a heap)::

    lag tokens  = n d - sum r0              (tokens the growers' tables do not hold yet)
    held        = blocks taken since r0     (still in the pool's free queue: not chosen yet)
    chosen      = blocks taken since r0     (out of the pool, not in the tables yet: ``choose``)
    frag        = frag of last blocks taken since r0

Nothing here touches the pool or a table: the manager adds these sums to its books (exact free
blocks, categories) and, when something reads a grower's blocks, takes them then (``remove``
says how many tokens and blocks it owes).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import NamedTuple

from pagedkv.errors import IntegrityError, PagedKVError
from pagedkv.memory.block_table import BlockTable
from pagedkv.memory.interface import SeqId
from pagedkv.memory.periodic import PeriodicCounts


class Grower(NamedTuple):
    """A growing sequence as of the round ``join`` it started growing."""

    join: int
    tokens: int  # tokens in its table then (and still)
    room: int  # free slots of its table then
    taken: int  # blocks it takes up to its final length (-1: no final length known)
    frag: int  # the internal fragmentation its last new block brings (0 if none)
    end: int  # the round it reaches its final length (-1: none known)
    serial: int  # names its heap entry (``Growth._dead`` when it leaves before its last block)

    def taken_by(self, d: int, bs: int) -> int:
        """Blocks it took in rounds join+1 .. d."""
        lag = d - self.join
        if lag <= self.room:
            return 0
        n = (lag - self.room - 1) // bs + 1
        return n if self.taken < 0 else min(n, self.taken)


class Window(NamedTuple):
    """What rounds a+1 .. a+k of growth took: the blocks, their sums of x and x^2 (x = i-1-a,
    round i's place in the window), each last block's (x, frag), and if asked for the round
    of every block, i - a ascending (one per block)."""

    k: int
    blocks: int
    s1: int
    s2: int
    lasts: list[tuple[int, int]]
    rounds: list[int] | None


class Growth:
    """The growers of one paged manager, and their sums brought to the current round."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.round = 0  # decode rounds advanced
        self.seqs: dict[SeqId, Grower] = {}
        self.counts = PeriodicCounts(block_size)
        self.sum_join = 0
        self.held = 0
        # blocks taken since r0 that the pool handed out but no table holds yet (prefix
        # caching's replay chooses them without settling a grower: keyed_growth.py)
        self.chosen = 0
        self.frag = 0
        # What the books add for the growers (``KVCacheManager.books``), kept up to date:
        # tokens (n d - sum r0), and reservation (bs (held + chosen) - tokens - frag).
        self.tokens = 0
        self.reservation = 0
        self._lasts: list[tuple[int, int, int]] = []  # (round, frag, serial): a heap
        self._dead: set[int] = set()  # serials of growers gone before their last block
        self._serial = 0

    @property
    def lag_tokens(self) -> int:
        """Tokens the growers gained since they joined (not in their tables)."""
        return len(self.seqs) * self.round - self.sum_join

    def add(self, seq_id: SeqId, table: BlockTable) -> None:
        """``seq_id`` (its last block private, its tokens' ids unknown) grows from the next
        round: it appends after its last block, so blocks before it may be shared (a group's
        prompt), and freeing it frees what the pool says (a shared block once)."""
        bs, d = self.block_size, self.round
        tokens = table.num_tokens
        room = len(table.blocks) * bs - tokens
        final = table.final_len
        first = d + room + 1  # the round of its first new block
        self._serial = serial = self._serial + 1
        if final is None:
            grower = (d, tokens, room, -1, 0, -1, serial)
        else:
            left = final - tokens
            taken = frag = 0
            if left > room:
                taken = (left - room - 1) // bs + 1
                frag = room + taken * bs - left
                if frag:
                    last = first + (taken - 1) * bs
                    heapq.heappush(self._lasts, (last, frag, serial))
            grower = (d, tokens, room, taken, frag, d + left, serial)
        self.seqs[seq_id] = _new(Grower, grower)
        self.counts.add(first % bs, 1)
        self.sum_join += d  # (it adds no token yet: the books stay as they are)

    def remove(self, seq_id: SeqId, chosen: int = 0) -> tuple[int, int]:
        """Stop ``seq_id`` growing; returns the tokens and the blocks it gained since it
        joined (its table must take them, or its blocks be freed); ``chosen`` of those blocks
        are out of the pool already (``choose``)."""
        return self.drop(self.seqs.pop(seq_id), chosen)

    def choose(self, n: int) -> None:
        """``n`` of the blocks growth holds left the pool's free queue for growers whose
        tables do not hold them yet: no longer free, still the growers' (the sums stay)."""
        self.held -= n
        self.chosen += n

    def drop(self, g: Grower, chosen: int = 0) -> tuple[int, int]:
        """``remove`` of a grower already taken out of ``seqs``."""
        bs, d = self.block_size, self.round
        join, _, room, owed, frag, _, serial = g  # (one unpacking: fields are descriptors)
        lag = d - join
        taken = 0  # ``g.taken_by(d, bs)``, inlined (a finish frees one)
        if lag > room:
            taken = (lag - room - 1) // bs + 1
            if 0 <= owed < taken:
                taken = owed
        self.counts.add((join + room + 1) % bs, -1)
        self.sum_join -= join
        if frag:
            if taken == owed:  # its last block was taken: its frag goes with it
                self.frag -= frag
            else:  # its last block's heap entry is still to come: it counts for nothing
                self._dead.add(serial)
        self.held -= taken - chosen  # the books' sums follow
        self.chosen -= chosen
        self.tokens = tokens = len(self.seqs) * d - self.sum_join
        self.reservation = bs * (self.held + self.chosen) - tokens - self.frag
        return lag, taken

    def shift(
        self,
        moved: list[SeqId],
        tables: Mapping[SeqId, BlockTable],
        at: int | None = None,
        chosen: Mapping[SeqId, int] | None = None,
    ) -> None:
        """Growers whose tables were brought to round ``at`` (the current one if None; their
        tokens and the blocks they took by then are in them now, ``chosen[seq_id]`` of those
        out of the pool already): each goes on from there, as ``remove`` then ``add`` at that
        round would leave it. Its residue, the round of its last block and that block's heap
        entry stay as they were, so only its own fields and the sums move."""
        bs = self.block_size
        d = self.round if at is None else at
        seqs = self.seqs
        for seq_id in moved:
            join, _, room, owed, frag, end, serial = seqs[seq_id]
            lag = d - join
            taken = 0
            if lag > room:
                taken = (lag - room - 1) // bs + 1
                if 0 <= owed < taken:
                    taken = owed
            if chosen is None:
                self.held -= taken
            else:
                c = chosen.get(seq_id, 0)
                self.held -= taken - c
                self.chosen -= c
            self.sum_join += lag
            if owed >= 0:
                if frag and taken == owed:  # its last block is its table's now, frag too
                    self.frag -= frag
                    frag = 0
                owed -= taken
            table = tables[seq_id]
            tokens = table.num_tokens
            grower = (d, tokens, len(table.blocks) * bs - tokens, owed, frag, end, serial)
            seqs[seq_id] = _new(Grower, grower)
        self.tokens = tokens = len(seqs) * self.round - self.sum_join
        self.reservation = bs * (self.held + self.chosen) - tokens - self.frag

    def rounds_that_fit(self, free: int) -> int | None:
        """How many rounds from now the growers' new blocks fit in ``free`` free blocks (None:
        they take none, however many)."""
        if not self.counts.weight:
            return None
        return self.counts.first_over(self.round, free) - 1 - self.round

    def next_round_fits(self, free: int) -> bool:
        """Do the next round's new blocks fit in ``free`` free blocks (``rounds_that_fit`` is
        not 0)? One residue's count: O(1)."""
        counts = self.counts
        return not counts.weight or counts.total(self.round, self.round + 1) <= free

    def advance(self, k: int, free: int, rounds: bool = False, upto: bool = False) -> Window:
        """k rounds of growth within ``free`` free blocks (with ``upto``: as many of them as
        fit); their ``Window``. ``PagedKVError``, changing nothing, if (without ``upto``) the
        rounds take more blocks than are free. The caller stops a grower at its final length
        (it finishes: ``remove``); one that passed it fails ``check``."""
        if k < 0:
            raise PagedKVError(f"growth of {k} rounds: must be >= 0")
        a = self.round
        counts = self.counts
        w0, s1, s2 = counts.window(a, a + k)
        if w0 > free:
            if not upto:
                raise PagedKVError(f"growth of {k} rounds needs {w0} blocks; {free} are free")
            k = counts.first_over(a, free) - 1 - a
            w0, s1, s2 = counts.window(a, a + k)
        b = a + k
        listed = [i - a for i in counts.rounds(a, b)] if rounds else None
        lasts = []
        heap = self._lasts
        if heap and heap[0][0] <= b:
            dead, pop = self._dead, heapq.heappop
            while heap and heap[0][0] <= b:
                z, frag, serial = pop(heap)
                if dead and serial in dead:
                    dead.remove(serial)
                else:
                    lasts.append((z - 1 - a, frag))
                    self.frag += frag
        self.held = held = self.held + w0
        self.round = b
        self.tokens = tokens = len(self.seqs) * b - self.sum_join  # the books' sums follow
        self.reservation = self.block_size * (held + self.chosen) - tokens - self.frag
        return _new(Window, (k, w0, s1, s2, lasts, listed))

    def check(
        self, tables: Mapping[SeqId, BlockTable], chosen: Mapping[SeqId, int] | None = None
    ) -> None:
        """Recompute the sums from the growers and compare (``chosen``: each one's blocks out
        of the pool that its table does not hold, ``choose``)."""
        chosen = chosen or {}
        if chosen.keys() - self.seqs.keys() or sum(chosen.values()) != self.chosen:
            raise IntegrityError(f"growth has {self.chosen} blocks chosen, the growers others")
        bs, d = self.block_size, self.round
        held = frag = sum_join = 0
        counts = [0] * bs
        for seq_id, g in self.seqs.items():
            table = tables.get(seq_id)
            if table is None or table.num_tokens != g.tokens:
                raise IntegrityError(f"growing sequence {seq_id!r}: its table moved")
            taken = g.taken_by(d, bs)
            if not 0 <= chosen.get(seq_id, 0) <= taken:
                raise IntegrityError(f"growing sequence {seq_id!r} chose blocks it did not take")
            held += taken - chosen.get(seq_id, 0)
            frag += g.frag if g.frag and taken == g.taken else 0
            sum_join += g.join
            counts[(g.join + g.room + 1) % bs] += 1
            if g.end >= 0 and d > g.end:
                raise IntegrityError(f"growing sequence {seq_id!r} passed its final length")
        tokens = len(self.seqs) * d - sum_join
        reservation = bs * (held + self.chosen) - tokens - frag
        got = (self.held, self.frag, self.sum_join, self.counts.count)
        if got != (held, frag, sum_join, counts) or (self.tokens, self.reservation) != (
            tokens,
            reservation,
        ):
            want = (held, frag, sum_join)
            raise IntegrityError(f"growth books {got[:3]} but the growers give {want}")


# A NamedTuple's own constructor is Python code; tuple's is not (one of each is made per
# request and per window).
_new = tuple.__new__

"""The contiguous KV-cache baselines: one run of adjacent slots per sequence.

This is how serving systems worked before PagedAttention (Orca in the vLLM paper, the course
lesson's fixed slots): the K/V of a sequence must be contiguous, so a region is reserved at
admission for the whole length the sequence may reach, and it can never grow afterwards.
Each sequence's region, with A slots held, T computed tokens and final length F::

    start                                                          start + A
    |  tokens: [0, T)  |  reservation: [T, min(A, F))  |  internal frag.: [min(A, F), A)  |
                          (filled before it finishes)      (never filled: over-reservation,
                                                            buddy rounding, fixed slots)

The reservation policy (``Reservation``) decides R, the slots asked for; the placement
(``Placement``) decides where they go and how many are actually held (a buddy block rounds R up
to a power of two, a fixed slot is always max_model_len). Free slots between regions are the
external fragmentation whenever a request waits for memory.

Without a final length (allowed for 'max' and 'slots' only), the worst case is assumed: the
sequence may grow to its region, so F = R = max_model_len in the accounting. A sequence that
grows past its declared final length (inside its region) has its final length raised to match.

A decoding sequence may grow in the books (``grow``, ``advance_rounds``: memory/region_growth.py):
one token a round inside its region, the books exact at every round in closed form, its region's
token count brought up to date when something reads it (``room``, an append, a fork, ``free``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pagedkv.errors import ConfigError, IntegrityError, PagedKVError, UnknownSequenceError
from pagedkv.memory.config import ContiguousConfig, Placement, Reservation
from pagedkv.memory.growth import Window
from pagedkv.memory.interface import AllocStatus, SeqId, SlotCopy
from pagedkv.memory.placement import AddressSpace, BuddySpace, FirstFitSpace, FixedSlotSpace
from pagedkv.memory.region_growth import RegionGrowth
from pagedkv.memory.usage import MemoryUsage
from pagedkv.validation import as_int


@dataclass
class _Region:
    """One live sequence's region and counters."""

    start: int
    held: int  # A: slots actually held (>= the reservation R asked for)
    reserved: int  # R
    tokens: int  # T
    final: int  # F (>= T)
    prompt: int  # tokens at admission: what 'pow2' counts the output from

    def books(self) -> tuple[int, int, int]:
        """(token states, reservation, internal fragmentation) of this region."""
        filled = min(self.held, self.final)
        return self.tokens, filled - self.tokens, self.held - filled

    def rounding(self) -> int:
        """Held slots beyond both the reservation asked for and the final length: the part of
        the internal fragmentation the placement added (buddy rounding), not the policy."""
        return self.held - max(self.reserved, min(self.held, self.final))


class ContiguousAllocator:
    """A ``KVAllocator`` with one contiguous region per sequence, reserved up front.

    ``usage()`` is O(1): the three per-sequence sums are kept as counters, updated on every
    change; ``check_integrity()`` recomputes them from scratch. No prefix caching (``allocate``
    returns 0 hits) and no swap (a region is copied, never paged).
    """

    def __init__(self, config: ContiguousConfig) -> None:
        if not isinstance(config, ContiguousConfig):
            raise ConfigError("config", config, "must be a ContiguousConfig")
        self.config = config
        self._space: AddressSpace
        if config.reservation is Reservation.SLOTS:
            self._space = FixedSlotSpace(config.capacity, config.max_model_len)
        elif config.placement is Placement.BUDDY:
            self._space = BuddySpace(config.capacity)
        else:
            self._space = FirstFitSpace(config.capacity)
        self._seqs: dict[SeqId, _Region] = {}
        self._token_states = 0
        self._reservation = 0
        self._internal = 0
        self._rounding = 0
        # Sequences that gain a token per round in closed form (``grow``): their regions'
        # counters lag behind, and ``books`` adds what they gained since.
        self._growth = RegionGrowth()

    # ----------------------------------------------------------------------------- queries
    @property
    def capacity(self) -> int:
        """C: the address space in token slots."""
        return self.config.capacity

    @property
    def space(self) -> AddressSpace:
        """The address space (read it, do not change it: the books would go stale)."""
        return self._space

    @property
    def num_free_slots(self) -> int:
        """Slots held by no region (usable or not)."""
        return self._space.free_slots

    @property
    def num_seqs(self) -> int:
        return len(self._seqs)

    def has_seq(self, seq_id: SeqId) -> bool:
        return seq_id in self._seqs

    def num_tokens(self, seq_id: SeqId) -> int:
        return self._get(seq_id).tokens

    @property
    def block_size(self) -> int:
        """The block size of the paged run this one is compared with (no block here)."""
        return self.config.block_size

    @property
    def allocator_rounding(self) -> int:
        """Slots the placement holds beyond the reservation and the final length (O(1))."""
        return self._rounding

    @property
    def growth_block_size(self) -> int | None:
        """A region never grows: None (appending past its room fails)."""
        return None

    def room(self, seq_id: SeqId) -> int:
        """Tokens ``seq_id`` can still append inside its region (and max_model_len)."""
        r = self._get(seq_id)
        return min(r.held, self.config.max_model_len) - r.tokens

    @property
    def blocks_saved_by_sharing(self) -> int:
        """0: a contiguous region is never shared (a fork copies into a region of its own)."""
        return 0

    def rooms(self, seq_ids: Sequence[SeqId]) -> list[int]:
        """``room`` of each sequence."""
        top, get = self.config.max_model_len, self._get
        return [min(r.held, top) - r.tokens for r in map(get, seq_ids)]

    def region(self, seq_id: SeqId) -> tuple[int, int]:
        """(start, slots actually held) of the sequence's region, e.g. to draw a block map."""
        r = self._get(seq_id)
        return r.start, r.held

    def seq_ids(self) -> list[SeqId]:
        """The sequences holding a region, in admission order."""
        return list(self._seqs)

    def region_books(self, seq_id: SeqId) -> tuple[int, int, int]:
        """(token states, reservation, internal fragmentation) of ``seq_id``'s region: its held
        slots from the start, in that order (e.g. to draw a block map)."""
        return self._get(seq_id).books()

    def reservation_for(self, final_len: int | None, num_tokens: int = 0) -> int:
        """R, the slots asked for a request of final length ``final_len`` (prompt + output)
        that starts with ``num_tokens`` tokens (its prompt).

        'max' and 'slots': max_model_len; 'pow2': the prompt plus the next power of two of the
        output (at most 2x the output, the vLLM paper's Orca (Pow2)), capped at max_model_len;
        'oracle': final_len exactly. 'pow2' and 'oracle' need final_len.
        """
        policy, mml = self.config.reservation, self.config.max_model_len
        if policy in (Reservation.MAX, Reservation.SLOTS):
            return mml
        if final_len is None:
            raise ConfigError(
                "final_len", None, f"reservation {policy.value!r} needs the final length"
            )
        if policy is Reservation.POW2:
            output = final_len - num_tokens
            return min(num_tokens + (1 << (output - 1).bit_length() if output > 0 else 0), mml)
        return final_len

    def usage(self, waiting_for_memory: bool = False) -> MemoryUsage:
        tokens, reservation, internal = self.books()
        return MemoryUsage.from_books(
            self.capacity, tokens, reservation, internal, waiting_for_memory, self._rounding
        )

    def books(self) -> tuple[int, int, int]:
        """(token states, reservation, internal fragmentation) in slots, exact at the current
        round: the regions' counters plus the tokens growing sequences gained since they
        joined (each fills a slot of its reservation; internal fragmentation stays)."""
        lag = self._growth.lag_tokens
        return self._token_states + lag, self._reservation - lag, self._internal

    # ----------------------------------------------------------------- growth in closed form
    def grow(self, seq_ids: Sequence[SeqId]) -> None:
        """From the next round on, each of these sequences gains one token per round inside
        its region (it decodes) until it is freed or something reads it, up to its region's
        room within its final length; already growing ones go on as they were."""
        growth, top = self._growth, self.config.max_model_len
        growing = growth.seqs
        for seq_id in seq_ids:
            if seq_id in growing:
                continue
            r = self._get(seq_id)
            growth.add(seq_id, min(r.held, r.final, top) - r.tokens)

    def is_growing(self, seq_id: SeqId) -> bool:
        """Does ``seq_id`` grow in closed form now (``grow``; not read since)?"""
        return seq_id in self._growth.seqs

    def rounds_that_fit(self, spare: int = 0) -> int | None:
        """Rounds of growth before some growing sequence's region is full (None: nothing
        grows). Growth takes no free slot, so ``spare`` (paged memory's blocks kept back for
        other appends) changes nothing."""
        return self._growth.rounds_that_fit()

    def next_round_fits(self) -> bool:
        """Does the next round of growth fit in every growing region (``rounds_that_fit() !=
        0``)? (The paged manager's question, asked by the cohort after a preemption.)"""
        return self._growth.rounds_that_fit() != 0

    def advance_rounds(self, k: int, *, rounds: bool = False, upto: bool = False) -> Window:
        """k rounds of growth (with ``upto``: as many of them as every region holds): every
        growing sequence gains a token a round. The ``Window`` of ``KVCacheManager``'s
        ``advance_rounds``, with no block taken and no last block (growth fills
        reservations). ``PagedKVError``, changing nothing, if (without ``upto``) a region
        would pass full."""
        k = self._growth.advance(k, upto)
        return Window(k, 0, 0, 0, [], [] if rounds else None)

    def stop_growing(self, seq_ids: Sequence[SeqId]) -> None:
        """Those of ``seq_ids`` still growing stop (their regions take what they gained); the
        others, freed or never growing, are left as they are."""
        growing = self._growth.seqs
        for seq_id in seq_ids:
            if seq_id in growing:
                self._settle(seq_id, self._seqs[seq_id])

    def _settle(self, seq_id: SeqId, r: _Region) -> None:
        """``seq_id`` stops growing: its region takes the tokens it gained (within its final
        length, so each one moves a slot from reservation to token states)."""
        lag = self._growth.remove(seq_id)
        r.tokens += lag
        self._token_states += lag
        self._reservation -= lag

    # ----------------------------------------------------------------------------- changes
    def can_allocate(
        self,
        seq_id: SeqId,
        num_tokens: int,
        *,
        token_ids: Sequence[int] | None = None,
        final_len: int | None = None,
    ) -> AllocStatus:
        """NEVER if it could not fit in the empty space; LATER if no hole is big enough now
        (even when enough slots are free in total: external fragmentation); else OK.
        Changes nothing. A ``seq_id`` already held is misuse: ``UnknownSequenceError``."""
        self._check_new(seq_id)
        return self._plan(num_tokens, final_len)[0]

    def allocate(
        self,
        seq_id: SeqId,
        num_tokens: int,
        *,
        token_ids: Sequence[int] | None = None,
        final_len: int | None = None,
    ) -> int | None:
        """Reserve the region for ``seq_id``'s whole life; 0 prefix hits, or ``None`` if no room."""
        self._check_new(seq_id)
        status, reserved, final = self._plan(num_tokens, final_len)
        if status is not AllocStatus.OK:
            return None
        num_tokens = int(num_tokens)  # (_plan checked it: an int, or a numpy integer)
        self._place(seq_id, reserved, num_tokens, final, num_tokens)
        return 0

    def can_append_all(self, seq_ids: Sequence[SeqId], num_tokens: int) -> bool:
        """Does every region have room for ``num_tokens`` more?"""
        return all(self.room(s) >= num_tokens for s in seq_ids)

    def append_slots_all(
        self,
        seq_ids: Sequence[SeqId],
        num_tokens: int,
        token_ids: Sequence[Sequence[int] | None] | None = None,
    ) -> list[SlotCopy]:
        """``append_slots`` for each sequence; the caller checked every region's room (token
        ids play no part in contiguous memory)."""
        num_tokens = as_int("num_tokens", num_tokens, 0)
        regions = [self._get(seq_id) for seq_id in seq_ids]  # unknown ids: refused first
        # Within its final length, a region's tokens take n slots of its reservation, and
        # nothing else in its books moves: one sum for all (the rest one at a time).
        top = self.config.max_model_len
        moved = 0
        for seq_id, r in zip(seq_ids, regions, strict=True):
            if r.tokens + num_tokens <= min(r.final, r.held, top):
                r.tokens += num_tokens
                moved += num_tokens
            elif self.append_slots(seq_id, num_tokens) is None:
                self._token_states += moved
                self._reservation -= moved
                raise PagedKVError(f"append_slots_all: no room for sequence {seq_id!r}")
        self._token_states += moved
        self._reservation -= moved
        return []

    def append_slots(
        self, seq_id: SeqId, num_tokens: int = 1, *, token_ids: Sequence[int] | None = None
    ) -> list[SlotCopy] | None:
        """[] if the tokens fit in the region (up to max_model_len), else ``None``: a contiguous
        region cannot grow in place, and moving it is the scheduler's business (preempt)."""
        r = self._get(seq_id)
        if type(num_tokens) is not int or num_tokens < 0:
            num_tokens = as_int("num_tokens", num_tokens, 0)
        if r.tokens + num_tokens > min(r.held, self.config.max_model_len):
            return None
        self._count(r, -1)
        r.tokens += num_tokens
        r.final = max(r.final, r.tokens)
        self._count(r, +1)
        return []

    def fork(
        self, parent: SeqId, child: SeqId, *, final_len: int | None = None
    ) -> list[SlotCopy] | None:
        """A region of the child's own (nothing is shared), filled by copying the parent's
        tokens; ``final_len`` defaults to the parent's. ``None`` if no room."""
        p = self._get(parent)
        self._check_new(child)
        final = p.final if final_len is None else final_len
        status, reserved, final = self._plan(p.tokens, final, prompt=p.prompt)
        if status is not AllocStatus.OK:
            return None
        start = self._place(child, reserved, p.tokens, final, p.prompt)
        return [SlotCopy(p.start, start, p.tokens)]

    def free(self, seq_id: SeqId) -> None:
        r = self._get(seq_id)
        del self._seqs[seq_id]
        self._space.free(r.start)
        self._count(r, -1)

    def check_integrity(self) -> None:
        """The space partitions [0, C); every sequence holds its region; counters are fresh."""
        self._space.check_integrity()
        held = dict(self._space.regions())
        if len(held) != len(self._seqs):
            raise IntegrityError(f"{len(held)} regions in the space, {len(self._seqs)} sequences")
        growth = self._growth
        growth.check()
        if not growth.seqs.keys() <= self._seqs.keys():
            raise IntegrityError("a growing sequence holds no region")
        sums = [0, 0, 0, 0]
        for seq_id, r in self._seqs.items():
            grower = growth.seqs.get(seq_id)
            if grower is not None:  # (its tokens now, as a read would settle them)
                r = replace(r, tokens=r.tokens + growth.round - grower[0])
            if held.get(r.start) != r.held or r.held < r.reserved:
                raise IntegrityError(f"sequence {seq_id!r}: region {r} not held as recorded")
            if not 0 <= r.tokens <= min(r.held, r.final):
                raise IntegrityError(f"sequence {seq_id!r}: {r.tokens} tokens do not fit {r}")
            for i, v in enumerate((*r.books(), r.rounding())):
                sums[i] += v
        counters = [*self.books(), self._rounding]
        if sums != counters:
            raise IntegrityError(f"counters {counters} != recomputed {sums}")

    # ----------------------------------------------------------------------------- helpers
    def _plan(
        self, num_tokens: int, final_len: int | None, prompt: int | None = None
    ) -> tuple[AllocStatus, int, int]:
        """(status, R, F) for a new region; validates the arguments; changes nothing."""
        num_tokens = as_int("num_tokens", num_tokens, 0)
        if final_len is not None:
            final_len = as_int("final_len", final_len, 1)
            if final_len < num_tokens:
                raise ConfigError("final_len", final_len, f"must be >= num_tokens ({num_tokens})")
        mml = self.config.max_model_len
        # raises if the policy needs final_len; a fork reserves as its parent did
        reserved = self.reservation_for(final_len, num_tokens if prompt is None else prompt)
        final = reserved if final_len is None else final_len
        if max(num_tokens, final) > mml or num_tokens > reserved:
            return AllocStatus.NEVER, reserved, final
        if not self._space.can_ever_fit(reserved):
            return AllocStatus.NEVER, reserved, final
        status = AllocStatus.OK if self._space.fits_now(reserved) else AllocStatus.LATER
        return status, reserved, final

    def _place(self, seq_id: SeqId, reserved: int, tokens: int, final: int, prompt: int) -> int:
        start = self._space.alloc(reserved)
        if start is None:
            raise IntegrityError(f"the space refused {reserved} slots it said would fit")
        r = _Region(start, self._space.allocated_size(start), reserved, tokens, final, prompt)
        self._seqs[seq_id] = r
        self._count(r, +1)
        return start

    def _count(self, r: _Region, sign: int) -> None:
        t, res, internal = r.books()
        self._token_states += sign * t
        self._reservation += sign * res
        self._internal += sign * internal
        self._rounding += sign * r.rounding()

    def _get(self, seq_id: SeqId) -> _Region:
        """``seq_id``'s region, its tokens up to date (a grower's read settles it)."""
        try:
            r = self._seqs[seq_id]
        except KeyError:
            raise UnknownSequenceError(f"unknown sequence id {seq_id!r}") from None
        if self._growth.seqs and seq_id in self._growth.seqs:
            self._settle(seq_id, r)
        return r

    def _check_new(self, seq_id: SeqId) -> None:
        if seq_id in self._seqs:
            raise UnknownSequenceError(f"sequence id {seq_id!r} is already allocated")

"""The decode cohort: one lazy window through every finish and arrival to the next memory event.

While memory is *plain* (paged, every used block held by one sequence, no groups, no token ids,
no follow-ups) and nothing waits, a run is decode rounds, finishes and arrivals, each arrival
admitted by a prefill-only round (``Scheduler.admit_only``). The cohort runs all of it without
touching the running requests one by one: each *member* keeps the counters and block table it
had when it joined (round ``join``) and is brought up to date only when it finishes, or when
the cohort ends (a memory event or a queue: the scheduler takes over)::

    decode round:   join ........ d (now) ............ join + left (its finish)
    member:         tokens t      t + (d - join)       t + left   (lazy: computed on demand)
    its new blocks: at rounds join + room + 1 + q bs  (congruent mod bs: ``PeriodicCounts``)

So an event costs O(log n) (heaps of finishes and of last blocks) plus O(1) window sums,
however many requests decode and however many rounds pass; a finish or the cohort's end costs
what that member owes. Between events (a *window*, rounds a+1..b, same members throughout) the
step times follow one cost-model curve and every category integrates in closed form:

    token states  (U + n) T + n M            (T = sum d_j, M = sum j d_j, j = 0..k-1)
    allocated     A T + bs sum over new blocks i of (T - T(i-1))   (moments of PeriodicCounts)
    internal      I T + sum over last blocks z of frag (T - T(z-1))

The pool stays exact where it is read: a window only counts the blocks its members take
(``held``); before an admission the cohort takes that many from the pool (``spare``, given
back at the end, when the members' tables take as many) or gives back those of members that
finished since (``_settle``), so ``can_allocate`` (the watermark) sees the true free blocks.
The allocator's own books lag by the members' lag; ``_levels`` adds the lag back. A window stops
before the round whose new blocks do not fit (the scheduler preempts) and at the round an
arrival falls in. The cohort's rounds are summed apart and added to the engine's totals once,
at its end (``_flush``).
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, NamedTuple

from pagedkv.engine.batch_shape import BatchShape
from pagedkv.engine.ledger import Span, level_integrals
from pagedkv.engine.periodic import PeriodicCounts
from pagedkv.engine.request import Request, RequestStatus
from pagedkv.memory.interface import SeqId
from pagedkv.memory.manager import KVCacheManager
from pagedkv.memory.usage import MemoryUsage, categories

if TYPE_CHECKING:
    from pagedkv.engine.cost_model import CostModel
    from pagedkv.engine.engine import Engine
    from pagedkv.engine.scheduler import SchedulerOutput
    from pagedkv.engine.windows import StepCurve


_RUNNING = RequestStatus.RUNNING  # (a global: an enum member lookup costs 4x in CPython 3.11)


def plain(engine: Engine) -> bool:
    """May a cohort run? Paged memory where a finish frees exactly its own blocks, nothing is
    keyed on token ids, no groups, no follow-ups (a finish would release an arrival), no
    request waits or is swapped out, and no per-token times are asked for (a cohort never
    visits a member between its join and its finish)."""
    sched = engine.scheduler
    kv = sched.kv
    return (
        isinstance(kv, KVCacheManager)
        and not sched.has_queued()
        and not sched.has_groups
        and not sched.has_token_ids
        and not engine.followups
        and kv.all_blocks_private
        and engine.token_times is None
    )


class Member(NamedTuple):
    """A running request as of the round it joined; its counters and table lag since."""

    join: int  # decode rounds run before it joined
    tokens: int  # tokens computed (and in its table) then
    outputs: int  # output tokens then
    left: int  # rounds it decodes before it finishes
    residue: int  # its new blocks' rounds modulo bs
    taken: int  # blocks it takes by its finish
    frag: int  # internal fragmentation its last new block starts (0 if none)


class Cohort:
    """One cohort, from the running requests of a pure decode round to its end."""

    def __init__(self, engine: Engine, cost: CostModel, prices: dict[object, float]) -> None:
        kv = engine.scheduler.kv
        assert isinstance(kv, KVCacheManager), "plain() admits paged memory only"
        self.engine = engine
        self.cost = cost
        self.prices = prices  # admission rounds' durations by shape (``_duration``)
        self.kv = kv
        self.pool = kv.gpu
        self.bs = kv.block_size
        self.done = 0  # decode rounds run
        self.members: dict[Request, Member] = {}
        self.finishes: list[tuple[int, float, int, Request]] = []  # (round, arrival key, req)
        self.last_blocks: list[tuple[int, int]] = []  # (round, frag) of last new blocks to come
        self.blocks = PeriodicCounts(self.bs)
        self.held = 0  # blocks the members took since they joined (not in their tables yet)
        self.spare: list[int] = []  # blocks taken from the pool for them (see ``_settle``)
        self.sum_join = 0
        self.sum_tokens = 0
        self.frag_lagging = 0  # internal fragmentation the allocator's books do not know yet
        # Blocks saved by sharing: a constant while memory is plain (new blocks are private;
        # pinned prefixes, if any, stay as they are).
        self.saved = kv.blocks_saved_by_sharing
        self.windows = 0
        # What the cohort adds to the engine's totals (at its end, ``_flush``): the sums of
        # sequences over its windows' rounds (each runs and decodes them all), its admission
        # rounds (a queue left behind ends the cohort: that last one is recorded at once) and
        # their running and batched sequences, and the time integrals of the clock, token
        # states, allocated slots and internal fragmentation over all of them (nothing waits
        # in them, so unallocated slots are free).
        self.seq_rounds = self.admissions = self.admitted_running = self.admitted_seqs = 0
        self.max_running = 0
        self.time = self.token_time = self.alloc_time = self.internal_time = 0.0

    @property
    def rounds(self) -> int:
        """Decode rounds run in windows (they start at round 0)."""
        return self.done

    # ----- the loop ----------------------------------------------------------------------------
    def run(self) -> None:
        """Run to the cohort's end, then bring every member up to date."""
        for req in self.engine.scheduler.running:
            self._join(req)
        self._loop()
        self._sync()
        self._flush()

    def _loop(self) -> None:
        eng = self.engine
        finishes, blocks, pool = self.finishes, self.blocks, self.pool
        decode_curve = self.cost.decode_curve
        arrival = eng.next_arrival  # changes only when arrivals are handed over (``_admit``)
        while True:
            if arrival is not None and arrival <= eng.now:
                if not self._admit():
                    return
                arrival = eng.next_arrival
                continue
            if not finishes:  # nobody decodes
                if arrival is None:
                    return
                eng.ledger.wait_until(arrival)  # idle until it arrives
                continue
            n, d = len(self.members), self.done
            k = finishes[0][0] - d  # to the next finish (>= 1)
            curve = decode_curve(n, self.sum_tokens + n * d - self.sum_join)
            sums = curve.sums(k)
            if arrival is not None and arrival - eng.now <= sums[0]:  # it falls in round <= k
                k, sums = curve.reach(arrival - eng.now)
            taken = blocks.window(d, d + k)
            # Free blocks: the pool's, less those the members took that it still counts.
            free = pool.num_free - self.held + len(self.spare)
            short = taken[0] > free
            if short:  # the first round whose new blocks do not fit needs the scheduler
                k = blocks.first_over(d, free) - 1 - d
                sums, taken = curve.sums(k), blocks.window(d, d + k)
            if k > 0:
                self._decode(curve, k, sums, taken)
            if short:
                return
            self._finish()

    def _join(self, req: Request) -> None:
        """``req`` decodes from the next round on (its pending token is its only one)."""
        bs, d = self.bs, self.done
        tokens, outputs = req.num_computed_tokens, req.num_output_tokens
        room = -tokens % bs  # its table holds the blocks its tokens need, none shared
        left = req.output_len - outputs
        first, last = d + room + 1, d + left  # its first new block's round, its finish round
        residue = first % bs
        taken = frag = 0
        if last >= first:
            taken = (last - first) // bs + 1
            frag = room + taken * bs - left  # the last new block's slots past the final length
            if frag:
                heapq.heappush(self.last_blocks, (first + (taken - 1) * bs, frag))
        self.members[req] = Member(d, tokens, outputs, left, residue, taken, frag)
        heapq.heappush(self.finishes, (last, req.arrival_time, req.request_id, req))
        self.blocks.add(residue, 1)
        self.sum_join += d
        self.sum_tokens += tokens

    def _decode(
        self,
        curve: StepCurve,
        k: int,
        sums: tuple[float, float],
        taken: tuple[int, int, int],
    ) -> None:
        """Decode rounds done+1 .. done+k (no one finishes before the last): integrals,
        counters, clock, and the blocks the members take. ``sums``: ``curve.sums(k)``, the sum
        of d_j and of j d_j over j = 0..k-1 (round a+1+j); ``taken``: the blocks taken in these
        rounds, and their sums of x and x^2, x = j of the round (``PeriodicCounts.window``)."""
        a = self.done
        b = a + k
        n = len(self.members)
        # The levels now (``_levels``, inlined: once a window).
        tokens_now, reservation, internal_now = self.kv.books()
        alloc_now = tokens_now + reservation + internal_now + self.bs * self.held
        tokens_now += n * a - self.sum_join
        internal_now += self.frag_lagging
        total, moment = sums
        tokens = (tokens_now + n) * total + n * moment
        alloc = alloc_now * total
        h0, h1 = curve.head
        one_line = curve.split is None or k - 1 <= curve.split  # T(x) = h0 x + h1 x (x-1) / 2
        blocks, s1, s2 = taken
        if blocks:  # a block taken in round i = a+1+x is held from T(x) = sum_{j<x} d_j on
            if one_line:
                before = h0 * s1 + h1 * ((s2 - s1) // 2)
            else:
                before = sum(curve.totals([i - 1 - a for i in self.blocks.rounds(a, b)]))
            alloc += self.bs * (blocks * total - before)
        internal = internal_now * total
        last_blocks = self.last_blocks
        while last_blocks and last_blocks[0][0] <= b:  # internal fragmentation from T(z-1-a)
            z, frag = heapq.heappop(last_blocks)
            x = z - 1 - a
            start = x * h0 + h1 * (x * (x - 1) // 2) if one_line else curve.sums(x)[0]
            internal += frag * (total - start)
            self.frag_lagging += frag
        self.time += total
        self.token_time += tokens
        self.alloc_time += alloc
        self.internal_time += internal
        self.seq_rounds += n * k
        self.held += blocks
        self.done = b
        self.engine.ledger.advance(total)
        self.windows += 1

    def _finish(self) -> None:
        """Members whose last round was the one just run: counters up to date, tables freed
        (in running order); the blocks they took since joining are no longer held (the pool
        gets them back at the next ``_settle``)."""
        finishes, d = self.finishes, self.done
        group = []
        while finishes and finishes[0][0] == d:
            req = heapq.heappop(finishes)[3]
            m = self.members.pop(req)
            req.num_computed_tokens = m.tokens + m.left
            req.num_output_tokens = m.outputs + m.left
            self.blocks.add(m.residue, -1)
            self.sum_join -= m.join
            self.sum_tokens -= m.tokens
            self.frag_lagging -= m.frag  # its last block was taken by now
            self.held -= m.taken  # they go with it
            group.append(req)
        self.engine.finish(group)  # frees its (lagging) table: the books drop what they hold

    def _admit(self) -> bool:
        """Hand the arrivals to the scheduler and run its admission round; False: the cohort
        must end (someone still waits, or memory is no longer plain)."""
        eng = self.engine
        sched = eng.scheduler
        eng.admit_arrivals()
        if not sched.waiting:
            return True  # every arrival was rejected
        # Of ``plain``, an arrival can change only these two (``add_request`` sets them); and
        # without token ids an admission shares no block, so memory stays plain after it.
        if sched.has_groups or sched.has_token_ids:
            return False
        self._settle()  # admission reads the pool's free blocks
        batch = sched.admit_only()
        if batch is None:
            return False
        queued = sched.has_queued()
        duration = self._duration(batch)
        # Its memory is what the books and the members' lag say (``Engine.step`` would read
        # the lagging books alone).
        tokens, alloc, internal = self._levels()
        running = len(sched.running)
        if queued or eng.check_integrity:
            capacity = self.kv.capacity
            slots = categories(capacity, tokens, alloc - tokens - internal, internal, queued)
            if eng.check_integrity:
                MemoryUsage(capacity, *slots)  # every category >= 0, their sum the capacity
        if queued:  # the cohort's last round: its unallocated slots are external fragmentation
            eng.ledger.add(Span.of_slots(duration, slots, running, len(batch.chunks), self.saved))
        else:
            self.max_running = max(self.max_running, running)
            self.admissions += 1
            self.admitted_running += running
            self.admitted_seqs += len(batch.chunks)
            self.time += duration
            self.token_time += duration * tokens
            self.alloc_time += duration * alloc
            self.internal_time += duration * internal
        eng.apply(batch, duration)
        for chunk in batch.chunks:
            if chunk.request.status is _RUNNING:  # not finished by its prefill
                self._join(chunk.request)
        return not queued

    def _duration(self, batch: SchedulerOutput) -> float:
        """What ``SimExecutor.execute`` says of an admission round (no swap in it, so the cost
        model's step time), remembered by the batch's (new, cached) tokens per chunk: a cost
        model prices a shape and nothing else (the fast-forward relies on it throughout), and
        prompt lengths repeat (a long run prices each length once)."""
        chunks = batch.chunks  # one sequence each: no groups in a cohort
        if len(chunks) == 1:  # one arrival (the usual case): its pair is the key
            pair = (chunks[0].num_new_tokens, chunks[0].num_cached_tokens)
            duration = self.prices.get(pair)
            if duration is None:
                shape = BatchShape.from_chunks((pair,))
                duration = self.prices[pair] = self.cost.step_time(shape)
            return duration
        pairs = tuple([(c.num_new_tokens, c.num_cached_tokens) for c in chunks])
        duration = self.prices.get(pairs)
        if duration is None:
            duration = self.prices[pairs] = self.cost.step_time(BatchShape.from_chunks(pairs))
        return duration

    # ----- books -----------------------------------------------------------------------------
    def _levels(self) -> tuple[int, int, int]:
        """(token states, allocated, internal fragmentation) now: the allocator's books plus
        what the members' lag hides from them (their new tokens, the blocks they took, the
        internal fragmentation of last blocks taken since they joined)."""
        tokens, reservation, internal = self.kv.books()
        alloc = tokens + reservation + internal + self.bs * self.held
        tokens += len(self.members) * self.done - self.sum_join
        return tokens, alloc, internal + self.frag_lagging

    def _flush(self) -> None:
        """Add the cohort's rounds to the engine's totals: one span (nothing waits in it)."""
        weighted = level_integrals(
            self.kv.capacity,
            self.time,
            self.token_time,
            self.alloc_time,
            self.internal_time,
            waiting=False,
        )
        span = Span(
            self.done + self.admissions,
            self.time,
            self.seq_rounds + self.admitted_running,
            self.seq_rounds + self.admitted_seqs,
            self.max_running,
            weighted,
            self.saved * self.time,
        )
        self.engine.ledger.add(span)

    def _settle(self) -> None:
        """Make the pool's free blocks exact: take the blocks the members took since it was
        last settled, or give back those of members that finished since. (Windows and finishes
        only move counts; here only the net change since the last admission moves blocks.)"""
        owed = self.held - len(self.spare)
        if owed > 0:
            self.spare += self.pool.allocate_many(owed)
        elif owed < 0:
            self.pool.release(self.spare[owed:])
            del self.spare[owed:]

    def _sync(self) -> None:
        """Bring every member up to date: counters, and tables grown by their lag (the spare
        blocks go back to the pool first; the tables take ``held`` blocks, as many as it then
        counts beyond the true free ones)."""
        if self.spare:
            self.pool.release(self.spare)
            self.spare = []
        self.held = 0
        by_lag: dict[int, list[SeqId]] = {}
        for req, m in self.members.items():
            lag = self.done - m.join
            if lag:
                req.num_computed_tokens = m.tokens + lag
                req.num_output_tokens = m.outputs + lag
                by_lag.setdefault(lag, []).append(req.seq_ids[0])
        for lag, seq_ids in by_lag.items():
            self.kv.append_slots_all(seq_ids, lag)
        self.members.clear()
        self.frag_lagging = 0
        if self.engine.check_integrity:
            self.kv.check_integrity()

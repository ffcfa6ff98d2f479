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

The pool stays exact where it is read: the blocks taken in a window are taken at once and held
by the cohort (``spare``) until their member's table gets them (the end). A finisher's spare
blocks stay with the cohort as ``surplus`` for the next windows' growth, and any surplus goes
back to the pool before an admission, so ``can_allocate`` (the watermark) sees the true free
blocks. The allocator's own books lag by the members' lag; ``_levels`` adds the lag back. A
window stops before the round whose new blocks do not fit (the scheduler preempts) and at the
round an arrival falls in.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, NamedTuple

from pagedkv.engine.periodic import PeriodicCounts
from pagedkv.engine.request import Request, RequestStatus
from pagedkv.memory.interface import SeqId
from pagedkv.memory.manager import KVCacheManager
from pagedkv.memory.usage import MemoryUsage, categories

if TYPE_CHECKING:
    from pagedkv.engine.cost_model import CostModel
    from pagedkv.engine.engine import Engine
    from pagedkv.engine.windows import WindowCurve


def plain(engine: Engine) -> bool:
    """May a cohort run? Paged memory where a finish frees exactly its own blocks, nothing is
    keyed on token ids, no groups, no follow-ups (a finish would release an arrival), and no
    request waits or is swapped out."""
    sched = engine.scheduler
    kv = sched.kv
    return (
        isinstance(kv, KVCacheManager)
        and not sched.has_queued()
        and not sched.has_groups
        and not sched.has_token_ids
        and not engine.followups
        and kv.all_blocks_private
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

    def __init__(self, engine: Engine, cost: CostModel) -> None:
        kv = engine.scheduler.kv
        assert isinstance(kv, KVCacheManager), "plain() admits paged memory only"
        self.engine = engine
        self.cost = cost
        self.kv = kv
        self.pool = kv.gpu
        self.bs = kv.block_size
        self.done = 0  # decode rounds run
        self.members: dict[Request, Member] = {}
        self.finishes: list[tuple[int, float, int, Request]] = []  # (round, arrival key, req)
        self.last_blocks: list[tuple[int, int]] = []  # (round, frag) of last new blocks to come
        self.blocks = PeriodicCounts(self.bs)
        self.spare: list[int] = []  # blocks taken for members' growth, not in their tables yet
        self.surplus = 0  # of them, those no member holds (a finisher's): free in all but name
        self.sum_join = 0
        self.sum_tokens = 0
        self.frag_lagging = 0  # internal fragmentation the allocator's books do not know yet
        # Blocks saved by sharing: a constant while memory is plain (new blocks are private;
        # pinned prefixes, if any, stay as they are).
        self.saved = kv.blocks_saved_by_sharing
        self.windows = 0
        self.rounds = 0

    # ----- the loop ----------------------------------------------------------------------------
    def run(self) -> None:
        """Run to the cohort's end, then bring every member up to date."""
        for req in self.engine.scheduler.running:
            self._join(req)
        self._loop()
        self._sync()

    def _loop(self) -> None:
        eng = self.engine
        while True:
            arrival = eng.next_arrival
            if arrival is not None and arrival <= eng.now:
                if not self._admit():
                    return
                continue
            if not self.finishes:  # nobody decodes
                if arrival is None:
                    return
                eng.now = arrival  # idle until it arrives
                continue
            n, d = len(self.members), self.done
            k = self.finishes[0][0] - d  # to the next finish (>= 1)
            context = self.sum_tokens + n * d - self.sum_join
            curve = self.cost.decode_curve(n, context)
            sums = curve.sums(k)
            if arrival is not None and arrival - eng.now <= sums[0]:  # it falls in round <= k
                k = curve.steps_to_reach(arrival - eng.now)
                sums = curve.sums(k)
            taken = self.blocks.window(d, d + k)
            free = self.pool.num_free + self.surplus
            short = taken[0] > free
            if short:  # the first round whose new blocks do not fit needs the scheduler
                k = self.blocks.first_over(d, free) - 1 - d
                sums, taken = curve.sums(k), self.blocks.window(d, d + k)
            if k > 0:
                self._decode(curve, k, sums, taken)
            if short:
                return
            self._finish()

    def _join(self, req: Request) -> None:
        """``req`` decodes from the next round on (its pending token is its only one)."""
        bs, d = self.bs, self.done
        tokens = req.num_computed_tokens
        room = -tokens % bs  # its table holds the blocks its tokens need, none shared
        left = req.output_len - req.num_output_tokens
        first, last = d + room + 1, d + left  # its first new block's round, its finish round
        taken = (last - first) // bs + 1 if last >= first else 0
        frag = 0
        if taken:  # the last new block's slots past the final length
            frag = room + taken * bs - left
            if frag:
                heapq.heappush(self.last_blocks, (first + (taken - 1) * bs, frag))
        self.members[req] = Member(d, tokens, req.num_output_tokens, left, first % bs, taken, frag)
        heapq.heappush(self.finishes, (last, req.arrival_time, req.request_id, req))
        self.blocks.add(first % bs, 1)
        self.sum_join += d
        self.sum_tokens += tokens

    def _decode(
        self,
        curve: WindowCurve,
        k: int,
        sums: tuple[float, float],
        taken: tuple[int, int, int],
    ) -> None:
        """Decode rounds done+1 .. done+k (no one finishes before the last): integrals,
        counters, clock, and the blocks the members take. ``sums``: ``curve.sums(k)``, the sum
        of d_j and of j d_j over j = 0..k-1 (round a+1+j); ``taken``: the blocks taken in these
        rounds, and their sums of x and x^2, x = j of the round (``PeriodicCounts.window``)."""
        eng, bs = self.engine, self.bs
        a, b = self.done, self.done + k
        n = len(self.members)
        tokens_now, alloc_now, internal_now = self._levels()
        total, moment = sums
        tokens = (tokens_now + n) * total + n * moment
        alloc = alloc_now * total
        blocks, s1, s2 = taken
        if blocks:  # a block taken in round i = a+1+x is held from T(x) = sum_{j<x} d_j on
            split = curve.split
            if split is None or k - 1 <= split:  # one line: T(x) = h0 x + h1 x (x-1) / 2
                h0, h1 = curve.head
                before = h0 * s1 + h1 * ((s2 - s1) // 2)
            else:
                before = sum(curve.totals([i - 1 - a for i in self.blocks.rounds(a, b)]))
            alloc += bs * (blocks * total - before)
        internal = internal_now * total
        last_blocks = self.last_blocks
        if last_blocks and last_blocks[0][0] <= b:
            while last_blocks and last_blocks[0][0] <= b:
                z, frag = heapq.heappop(last_blocks)
                internal += frag * (total - curve.totals([z - 1 - a])[0])
                self.frag_lagging += frag
        t = eng.totals
        weighted = t.weighted  # external fragmentation: 0, nothing waits (unallocated is free)
        weighted["token_states"] += tokens
        weighted["reservation"] += alloc - tokens - internal
        weighted["internal_fragmentation"] += internal
        weighted["free"] += self.kv.capacity * total - alloc
        t.iterations += k
        t.busy_time += total
        t.sum_running += n * k
        t.sum_batched_seqs += n * k
        t.weighted_saved_blocks += self.saved * total
        if blocks > self.surplus:  # the surplus first, then the pool
            self.spare += self.pool.allocate_many(blocks - self.surplus)
        self.surplus = max(0, self.surplus - blocks)
        self.done = b
        eng.now += total
        self.windows += 1
        self.rounds += k

    def _finish(self) -> None:
        """Members whose last round was the one just run: counters up to date, tables freed
        (in running order), the spare blocks they took lagging kept as surplus."""
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
            self.surplus += m.taken
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
        self._return_surplus()  # admission reads the pool's free blocks
        batch = sched.admit_only()
        if batch is None:
            return False
        queued = sched.has_queued()
        result = eng.executor.execute(batch)
        # Its memory is what the books and the members' lag say (``Engine.step`` would read
        # the lagging books alone).
        tokens, alloc, internal = self._levels()
        slots = categories(self.kv.capacity, tokens, alloc - tokens - internal, internal, queued)
        if eng.check_integrity:  # every category >= 0, their sum the capacity
            MemoryUsage(self.kv.capacity, *slots)
        totals = eng.totals
        totals.record(result.duration, slots, len(sched.running), len(batch.chunks))
        totals.weighted_saved_blocks += result.duration * self.saved
        eng.apply(batch, result)
        for chunk in batch.chunks:
            if chunk.request.status is RequestStatus.RUNNING:  # not finished by its prefill
                self._join(chunk.request)
        return not queued

    # ----- books -----------------------------------------------------------------------------
    def _levels(self) -> tuple[int, int, int]:
        """(token states, allocated, internal fragmentation) now: the allocator's books plus
        what the members' lag hides from them (their new tokens, the spare blocks they hold, the
        internal fragmentation of last blocks taken since they joined)."""
        tokens, reservation, internal = self.kv.books()
        alloc = tokens + reservation + internal + self.bs * (len(self.spare) - self.surplus)
        tokens += len(self.members) * self.done - self.sum_join
        return tokens, alloc, internal + self.frag_lagging

    def _return_surplus(self) -> None:
        if self.surplus:
            self.pool.release(self.spare[-self.surplus :])
            del self.spare[-self.surplus :]
            self.surplus = 0

    def _sync(self) -> None:
        """Bring every member up to date: counters, and tables grown by their lag (the spare
        blocks go back to the pool first; the tables take as many again)."""
        if self.spare:
            self.pool.release(self.spare)
            self.spare = []
            self.surplus = 0
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

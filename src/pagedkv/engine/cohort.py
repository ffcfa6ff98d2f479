"""The decode cohort: the event loop over lazy decoding requests, the scheduler asked at events.

While memory is *plain* (paged, no token ids, no beams; parallel samples share their prompt's
blocks), a run is decode rounds between events: finishes, arrivals (follow-ups a finish released
among them), and the round whose new blocks do not fit. The cohort runs it without touching
the decoding requests one by one: each *member* keeps the counters it had when it joined
(round ``join``) and is brought up to date only when it finishes, is preempted, or the cohort
ends (its per-token times too, if asked for: the ends of the rounds it ran, kept as runs of
rounds); its memory grows in the books (``KVCacheManager.grow``: exact free blocks and
categories at every round, block ids chosen when read)::

    decode round:   join ........ d (now) ............ join + left (its finish)
    member:         tokens t      t + (d - join)       t + left   (lazy: computed on demand)

Whatever waits or is swapped belongs to the policy: at each event it plans the next round
(``Scheduler.plan_round``: admissions, else a decode of every member, with resumptions after
it), and when a round is short of blocks it names its victims (``growth_victim``), taken until
the others' blocks fit. With chunked prefill a round decodes every member and then runs the
policy's part (``Scheduler.fill``: prompts in chunks, which are not members, swap-ins,
admissions), priced from the whole shape. A policy that promises neither ends the cohort there
(the engine steps that round through ``schedule``).

So an event costs O(log n) (a heap of finishes; the memory's of last blocks) plus the plan and
O(1) window sums, however many requests decode and however many rounds pass; a finish or a
preemption costs what that member owes. Between events (a *window*, rounds a+1..b, same members
throughout) the step times follow one cost-model curve and every category integrates in closed
form:

    token states  (U + n) T + n M            (T = sum d_j, M = sum j d_j, j = 0..k-1)
    allocated     A T + bs sum over new blocks i of (T - T(i-1))   (``advance_rounds``' sums)
    internal      I T + sum over last blocks z of frag (T - T(z-1))

and unallocated slots are external fragmentation in rounds where a request waits, free in the
others. The cohort's rounds are summed apart and added to the ledger once, at its end
(``_flush``).
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from typing import TYPE_CHECKING, NamedTuple, cast

from pagedkv.engine.batch_shape import BatchShape
from pagedkv.engine.clock import to_seconds
from pagedkv.engine.ledger import Span, level_integrals
from pagedkv.engine.request import Request, RequestStatus
from pagedkv.engine.scheduler import RoundPlan, Scheduler, SchedulerOutput
from pagedkv.errors import IntegrityError
from pagedkv.memory.contiguous import ContiguousAllocator
from pagedkv.memory.manager import KVCacheManager
from pagedkv.memory.usage import MemoryUsage, categories

if TYPE_CHECKING:
    from pagedkv.engine.cost_model import CostModel
    from pagedkv.engine.engine import Engine
    from pagedkv.engine.windows import StepCurve


_RUNNING = RequestStatus.RUNNING  # (a global: an enum member lookup costs 4x in CPython 3.11)
_new = tuple.__new__  # a NamedTuple's own constructor is Python code (one member per request)


def plain(engine: Engine) -> bool:
    """May a cohort run? Paged memory without beams (they fork and free every round) and
    without parallel samples under prefix caching (``keyed``), or contiguous memory
    (``_plain_regions``). Queues, follow-ups, shared blocks and pinned prefixes are the
    policy's and the books' at each event: growth takes private blocks only."""
    sched = engine.scheduler
    kv = sched.kv
    if isinstance(kv, ContiguousAllocator):
        return _plain_regions(sched)
    return (
        isinstance(kv, KVCacheManager)
        and not sched.has_beams
        and not (sched.has_groups and keyed(kv))
    )


def keyed(kv: KVCacheManager) -> bool:
    """Prefix caching without pinned prefixes: blocks are shared only by prefix hits, and the
    members' blocks and keys are made in the rounds' order when the pool is read
    (memory/keyed_growth.py; a member's future ids are its planned outputs)."""
    config = kv.config
    return config.enable_prefix_caching and not config.enable_pinned_prefixes


def _plain_regions(sched: Scheduler) -> bool:
    """``plain`` on contiguous memory: decoding sequences grow inside their regions
    (``ContiguousAllocator.grow``), so a policy that plans its rounds (``plan_round``) runs in
    a cohort (a region a finished request still holds stops growing: ``_finish``). Token ids
    play no part in contiguous memory, and its policies refuse groups (beams among them)."""
    return type(sched).plan_round is not Scheduler.plan_round and not sched.supports_groups


def _decodes(req: Request) -> bool:
    """Does a running request decode (its next token is an output's, a prompt's first token
    sampled already)? A member of the cohort must."""
    return req.num_pending_tokens == 1 and req.num_computed_tokens >= req.prompt_len


def _arrival_key(req: Request) -> tuple[float, int]:
    return (req.arrival_time, req.request_id)


class Member(NamedTuple):
    """A running request as of the round it joined; its counters and table lag since."""

    join: int  # decode rounds run before it joined
    tokens: int  # tokens computed then
    outputs: int  # output tokens then
    left: int  # rounds it decodes before it finishes


class Cohort:
    """One cohort, from the running requests of a pure decode round to its end."""

    def __init__(self, engine: Engine, cost: CostModel, prices: dict[object, int]) -> None:
        kv = engine.scheduler.kv
        assert isinstance(kv, (KVCacheManager, ContiguousAllocator)), "as plain() admits"
        self.engine = engine
        self.ledger = engine.ledger
        self.cost = cost
        self.prices = prices  # admission rounds' durations by shape (``_duration``)
        self.kv: KVCacheManager | ContiguousAllocator = kv
        self.bs = kv.block_size
        # Contiguous memory: the placement's rounding (fixed between admissions and finishes)
        # integrated over the rounds, as the windows' and the reference's spans do.
        self.regions = kv if isinstance(kv, ContiguousAllocator) else None
        self.rounding_time = 0  # (ticks x slots)
        self.done = 0  # decode rounds run
        self.members: dict[Request, Member] = {}
        # (round, arrival key, req, member): a heap; an entry whose member left (preempted)
        # is dropped when it comes up
        self.finishes: list[tuple[int, float, int, Request, Member]] = []
        self.sum_join = 0
        self.sum_tokens = 0
        # Parallel samples: a member of s > 1 sequences (each decodes, each grows) counts s
        # times in the sums above; ``extra`` is the sequences beyond one per member.
        self.seqs: dict[Request, int] = {}
        self.extra = 0
        # Blocks saved by sharing: constant between events (growth's blocks are private);
        # with groups (forks, swaps, finishes) or prefix caching (hits, finishes) it moves at
        # events, so its time integral is summed piecewise between them (``_resaved``).
        self.saved = kv.blocks_saved_by_sharing
        self.saved_time = self.saved_at = 0  # (ticks x blocks, ticks)
        self.keyed = isinstance(kv, KVCacheManager) and keyed(kv)
        # Sharing that admissions and finishes move (prefix hits, pinned prefixes' blocks).
        self.resharing = self.keyed or (
            isinstance(kv, KVCacheManager) and kv.config.enable_pinned_prefixes
        )
        # (the keyed paths' memory: paged; contiguous memory never takes them)
        self.paged = cast(KVCacheManager, kv)
        # Under prefix caching the first allocation with token ids starts the cache, and every
        # grower then takes what it is owed and stops (``KVCacheManager.allocate``): a cohort
        # runs only once that has happened or while no request has ids (an arrival with the
        # first ends it).
        self.ids = engine.scheduler.has_token_ids
        self.holds = engine.scheduler.plans_every_event  # (a finished request's blocks too)
        self.by_seq: dict[object, Request] = {}  # (keyed: a member by its sequence)
        # Groups that sampled their first token and fork in their next decode round (a round
        # of its own: ``_fork``); with chunked prefill that round is schedule's (``unforked``:
        # the cohort ends at the next event).
        self.forking: list[Request] = []
        self.unforked = False
        self.windows = 0
        # Running requests that are not members (chunked prefill: prompts in chunks), in
        # running order; their counters are current. None has one prompt token left.
        self.prefilling: list[Request] = []
        self.victim_swaps = 0  # blocks the last preemption swapped out
        # What the cohort adds to the engine's totals (at its end, ``_flush``): the sums of
        # sequences over its decode rounds (each runs and decodes them all), its admission
        # rounds and their running and batched sequences, the time integrals of the clock,
        # token states, allocated slots and internal fragmentation over all of them, and the
        # clock's and allocated slots' over the rounds in which a request waited.
        self.seq_rounds = self.admissions = self.admitted_running = self.admitted_seqs = 0
        self.max_running = 0
        self.time = self.token_time = self.alloc_time = self.internal_time = 0  # (ticks)
        self.wait_time = self.wait_alloc = 0
        # Per-token times (``Engine(token_times=True)``): a member's tokens are sampled at the
        # ends of the decode rounds it ran, written when it is brought up to date. Every
        # decode round's end, as runs: from round firsts[i] + 1 on, rounds end at
        # ends[i] = (start, curve) at start + curve's totals, or (end, None) for one round.
        self.times = engine.token_times
        self.firsts: list[int] = []
        self.ends: list[tuple[int, StepCurve | None]] = []  # (ticks)

    # ----- the loop ----------------------------------------------------------------------------
    def run(self) -> bool:
        """Run to the cohort's end, then bring every member up to date. False, having only
        handed the arrivals to the scheduler, if memory is no longer plain or requests wait
        and the policy plans no round for them (``Scheduler.plan_round``)."""
        eng = self.engine
        sched = eng.scheduler
        eng.admit_arrivals()  # (what the engine's next round does first)
        if not plain(eng):
            return False
        self.ids = sched.has_token_ids  # (as of the arrivals just handed over)
        if self.ids and self.keyed and not self.paged.grows_keyed:
            return False  # (a request with ids not allocated yet: its allocation settles all)
        # (before the plan's admissions; a finished request a policy holds until the next
        # round's schedule, vllm-v1's async, is no member)
        decoding = [r for r in sched.running if _decodes(r) and r.status is _RUNNING]
        chunked = sched.config.chunked
        if sched.has_groups and chunked and any(len(r.seq_ids) < r.n for r in decoding):
            return False  # its next round forks it (and copies its shared last block)
        if len(decoding) < len(sched.running):  # chunked prefill: some still prefill
            if not chunked:
                return False
            self.prefilling = [r for r in sched.running if not _decodes(r)]
            if any(r.num_pending_tokens == 1 for r in self.prefilling):
                return False  # a prompt's last token, alone: decoded with the members
        queued = sched.has_queued() or bool(self.prefilling)
        every = sched.plans_every_event
        plan = sched.plan_round() if queued or every or self.regions is not None else None
        if plan is None and (queued or every):
            return False
        self._join(decoding)
        self._loop(plan)
        self._sync()
        sched.cohort_ends(self.done > 0)
        if eng.check_integrity:
            self.kv.check_integrity()
        self._flush()
        return True

    def _loop(self, plan: RoundPlan | None) -> None:
        """The events, one window of decode rounds to the next (the module docstring's sums,
        inlined: this is the cohort's hot path); ``plan``: the next round's, made already."""
        eng, ledger = self.engine, self.ledger
        finishes, kv, members = self.finishes, self.kv, self.members
        decode_curve = self.cost.decode_curve
        books, advance_rounds, advance_clock = kv.books, kv.advance_rounds, ledger.advance
        bs, checked = self.bs, eng.check_integrity
        sched = eng.scheduler
        plan_round = sched.plan_round
        growth_victim = sched.growth_victim
        arrival = eng.next_arrival  # changes only when arrivals are handed over, or
        chat = bool(eng.followups)  # when a finish releases follow-ups (chat turns)
        queued, swapped = sched.waiting, sched.swapped  # (the policy's queues: never replaced)
        preempted = False  # victims just left: the round they made room for runs next
        swap_cost = 0  # what swapping them out adds to that round
        replan = True  # an event since the last plan (a plan holds until the next)
        resume = False  # the next round resumes swapped requests after its decode
        mixed = False  # the next round runs the policy's part after its decode (``fill``)
        keyed, regions, times, resharing = self.keyed, self.regions, self.times, self.resharing
        # (On contiguous memory a plan at every event: static's decode closes its batch.)
        always = sched.plans_every_event or regions is not None
        while True:
            if chat:  # (any finish since may have released one)
                arrival = eng.next_arrival
            if sched.has_groups:
                if self.unforked:
                    return
                self._resaved()
            if preempted:  # that round is a decode of every member left (schedule's)
                waiting = True  # (the victims)
            else:
                if arrival is not None and arrival <= ledger.ticks:  # (``Ledger.arrived``)
                    eng.admit_arrivals()
                    arrival = eng.next_arrival
                    replan = True
                    # Of ``plain``, an arrival can change only these (``add_request`` sets
                    # them); unkeyed token ids play no part in growth. (Contiguous memory:
                    # none of them.)
                    if regions is None and (sched.has_beams or (keyed and sched.has_groups)):
                        return
                    if keyed and sched.has_token_ids != self.ids:
                        return
                waiting = bool(queued or swapped)
                if plan is not None or (replan and (waiting or always or bool(self.prefilling))):
                    # the policy's round: admissions, else a decode of every member (and
                    # resumptions after it)
                    if plan is None:
                        plan = plan_round()
                        if plan is None:
                            return
                    replan = False
                    admitted, decodes, resumes, chunked = plan
                    if not decodes:
                        self._admission(admitted)
                        plan, replan = None, True
                        continue
                    if keyed and waiting and self._growth_may_hit():
                        return  # (the engine steps until the key is made)
                    resume, mixed, plan = resumes, chunked, None
                    waiting = bool(queued or swapped)
            while finishes and members.get(finishes[0][3]) is not finishes[0][4]:
                heapq.heappop(finishes)  # a member preempted since
            if mixed or (preempted and self.prefilling):  # a chunked round (``_mixed``)
                mixed = False
                if not members and not preempted:
                    return  # only prompts in chunks: the engine steps it
                if members and not preempted and advance_rounds(1, upto=True).k == 0:
                    short_keyed = keyed and self.paged.grows_keyed
                    victim = None if short_keyed else growth_victim()  # short of blocks
                    if victim is None:
                        return  # (the scheduler preempts)
                    swap_cost = self.cost.swap_ticks(self._preempt(victim))
                    preempted = replan = mixed = True
                    continue
                if preempted and members:
                    advance_rounds(1)  # the victims made room
                went = self._mixed(preempted)
                ended = bool(finishes) and finishes[0][0] == self.done
                if ended:
                    self._finish()
                if went is None:
                    return  # a request the cohort does not take on: the engine steps on
                replan = bool(went or preempted or ended)
                preempted = False
                continue
            forking = self.forking  # (their round is one of its own, if their blocks fit)
            if forking and not self._forks_fit():
                return  # (the scheduler's, who may preempt for them)
            if not finishes and not forking:  # nobody decodes
                if arrival is None or waiting:
                    return  # (the engine waits, or reports a deadlock)
                ledger.wait_until(arrival)  # idle until it arrives
                continue
            r, a = len(members), self.done  # members (requests), the round
            n = r + self.extra  # sequences: each decodes
            one = preempted or resume or bool(forking)  # a round of its own
            k = 1 if one else finishes[0][0] - a  # to the next finish (>= 1)
            context = self.sum_tokens + n * a - self.sum_join
            curve = decode_curve(n, context)
            sums = curve.sums(k)
            if arrival is not None and not one:
                until = arrival - ledger.ticks  # (``Ledger.until``)
                if until <= sums[0]:
                    k, sums = curve.reach(until)  # it falls in round <= k
            # The levels at the window's start, then the rounds whose new blocks fit; if fewer
            # than k, the next needs the scheduler.
            tokens_now, reservation, internal_now = books()
            split = curve.split
            one_line = split is None or k - 1 <= split  # T(x) = h0 x + h1 x (x-1) / 2
            # (a ``Window``, unpacked once: its fields are descriptors)
            fit, blocks, s1, s2, lasts, listed = advance_rounds(k, rounds=not one_line, upto=True)
            short = fit < k
            if short:
                k = fit
                sums = curve.sums(k)
            elif resume or forking:
                out = SchedulerOutput()
                if forking:
                    self._fork(out)
                if resume:
                    resume = False
                    sched.resume(out, members.keys())
                if out.swap_in or out.chunks:  # this round is theirs too: priced whole
                    self._resumed(out, n, context)
                    if finishes and finishes[0][0] == self.done:
                        self._finish()
                    replan = True  # (a resumed request may have finished too)
                    continue
            elif preempted and swap_cost:
                sums = (sums[0] + swap_cost, sums[1])  # (one round: its moment is 0)
            if k > 0:  # decode rounds a+1 .. a+k (no one finishes before the last)
                total, moment = sums  # sum of d_j and of j d_j over j = 0..k-1 (round a+1+j)
                tokens = (tokens_now + n) * total + n * moment
                alloc = tokens_now + reservation + internal_now  # (slots, then their integral)
                h0, h1 = curve.head
                if blocks:  # a block taken in round a+1+x is held from T(x) on
                    if one_line:
                        before = h0 * s1 + h1 * ((s2 - s1) // 2)
                    else:
                        assert listed is not None  # asked for: k only shrinks
                        before = sum(curve.totals([i - 1 for i in listed]))
                    alloc = (alloc + bs * blocks) * total - bs * before
                else:
                    alloc *= total
                internal = internal_now * total
                for x, frag in lasts:  # internal fragmentation from T(x), x = z-1-a
                    start = x * h0 + h1 * (x * (x - 1) // 2) if one_line else curve.sums(x)[0]
                    internal += frag * (total - start)
                if resharing:  # (hits, pinned admissions and finishes since the last event)
                    self._resaved()
                self.time += total
                self.token_time += tokens
                self.alloc_time += alloc
                self.internal_time += internal
                if regions is not None:
                    self.rounding_time += total * regions.allocator_rounding
                if waiting:
                    self.wait_time += total
                    self.wait_alloc += alloc
                if r > self.max_running:
                    self.max_running = r
                self.seq_rounds += r * k
                self.done = a + k
                if times is not None:
                    self._ran(a, ledger.ticks + total if k == 1 else ledger.ticks, curve, k)
                advance_clock(total)
                self.windows += 1
                if checked:  # the books hold at every event (tests)
                    self._check()
            preempted = resume = False
            if short:
                # With prefix caching a short round's victims are freed amid its appends
                # (``_decode_running``): ``_short_keyed`` runs it so.
                victim = growth_victim()
                if keyed and self.paged.grows_keyed:
                    if victim is None or self.prefilling:
                        return  # (the scheduler preempts)
                    self._short_keyed()
                    replan = True
                    continue
                if victim is None:
                    return  # (the scheduler preempts)
                swaps = self._preempt(victim)
                swap_cost = self.cost.swap_ticks(swaps) if swaps else 0
                preempted = replan = True
                continue
            if finishes[0][0] == self.done:  # (a window an arrival cut may end before it)
                self._finish()
                replan = True

    def _join(self, reqs: list[Request]) -> None:
        """``reqs`` decode from the next round on (each one's pending token is its only one);
        their memory grows in the books from then on (one call for them all)."""
        d = self.done
        members, finishes = self.members, self.finishes
        push = heapq.heappush
        grouped = self.engine.scheduler.has_groups
        if grouped:
            reqs = self._forked(reqs)
        for req in reqs:
            outputs = req.num_output_tokens
            left = req.output_len - outputs
            tokens = req.num_computed_tokens
            member = members[req] = _new(Member, (d, tokens, outputs, left))
            push(finishes, (d + left, req.arrival_time, req.request_id, req, member))
            self.sum_tokens += tokens
        self.sum_join += d * len(reqs)
        if grouped:
            self.kv.grow([s for req in reqs for s in req.seq_ids])
            for req in reqs:
                more = len(req.seq_ids) - 1
                if more:
                    self.seqs[req] = more
                    self.extra += more
                    self.sum_join += d * more
                    self.sum_tokens += req.num_computed_tokens * more
        elif self.keyed:  # each one's future ids (its planned outputs) and running order
            seq_ids = [req.seq_ids[0] for req in reqs]  # one sequence each (no groups here)
            for seq_id, req in zip(seq_ids, reqs, strict=True):
                self.by_seq[seq_id] = req
            ids = [r.token_slice(r.num_computed_tokens, r.max_kv_tokens) for r in reqs]
            order = self.engine.scheduler.append_order(reqs)
            self.paged.grow(seq_ids, token_ids=ids, order=order)
        else:  # one sequence each
            self.kv.grow([reqs[0].seq_ids[0]] if len(reqs) == 1 else [r.seq_ids[0] for r in reqs])

    def _growth_may_hit(self) -> bool:
        """Could a decode round before the next event key a block that the waiting head's
        lookup, or the swapped head's swap-in, would find (a prompt that continues a member's
        tokens)? Its admission or resumption would then get cheaper inside the window: the
        plan would not hold (``Scheduler.plan_round``)."""
        sched = self.engine.scheduler
        head = sched.waiting[0] if sched.waiting else None
        ids = None if head is None else head.known_token_ids
        swapped = sched.swapped[0].seq_ids if sched.swapped else ()
        return self.paged.growth_may_hit(ids, swapped)

    def _finish(self, also: list[Request] | None = None) -> list[Request]:
        """Members whose last round was the one just run: counters up to date, memory freed
        (in running order; blocks growth took for them but never chose stay free); ``also``:
        the round's other requests that finished (chunks of it), in one running order."""
        finishes, d, members = self.finishes, self.done, self.members
        group = also or []
        pop = heapq.heappop
        while finishes and finishes[0][0] == d:
            _, _, _, req, member = pop(finishes)
            if members.get(req) is not member:
                continue  # preempted since
            self._part(req, members.pop(req), member.left)
            group.append(req)
        if len(group) > 1:  # in the round's order, as its chunks finish them
            order = self.engine.scheduler.append_order(group)
            group = [group[i] for i in sorted(range(len(group)), key=order.__getitem__)]
        self.engine.finish(group)
        # A policy may hold a finished request's memory: static its region, vllm-v1 (async)
        # its blocks until the next round's schedule; it stops growing.
        if self.regions is not None:
            self.regions.stop_growing([s for req in group for s in req.seq_ids])
        elif self.holds:
            self.paged.stop_growing([s for req in group for s in req.seq_ids])
        if self.engine.check_integrity:
            self._check()
        return group

    def _preempt(self, victim: Request) -> int:
        """The next decode round's new blocks do not all fit: the policy's victims (from
        ``victim`` on) leave, counters up to date, and are preempted until the others' do (a
        decode round short of blocks takes its victims until the rest fit: those left decode
        in it, the round ``_loop`` runs next). A victim may be a prompt in chunks or a finished
        request whose memory the policy holds (neither needs a block to decode). Returns the
        blocks swapped out (``victim_swaps`` too)."""
        sched = self.engine.scheduler
        kv, members = self.kv, self.members
        out = SchedulerOutput()
        while True:
            self._leave(victim, out)
            if kv.next_round_fits() or not members:
                break
            got = sched.growth_victim()
            assert got is not None, "a policy that preempted one preempts the next"
            victim = got
        assert members or self.prefilling, "the oldest request fits alone"
        self.ledger.preempted(out.preempted, len(out.swap_out))
        if self.engine.check_integrity:
            self._check()
        self.victim_swaps = len(out.swap_out)
        return self.victim_swaps

    def _leave(self, victim: Request, out: SchedulerOutput) -> None:
        """One victim leaves, counters up to date, and is preempted (its blocks freed, or
        swapped out: growth's included)."""
        member = self.members.pop(victim, None)
        if member is None:  # a prompt in chunks: its counters are current
            if victim.status is _RUNNING:  # (else finished, its memory held: vllm-v1's async)
                self.prefilling.remove(victim)
        else:
            self._part(victim, member, self.done - member.join)
        self.engine.scheduler.preempt(victim, out)

    def _short_keyed(self) -> None:
        """A decode round short of blocks under prefix caching, as ``_decode_running`` runs
        it: the members append in running order, and one that finds no free block preempts
        the latest running request (``growth_victim``) until one is, or it is itself the
        victim (``KVCacheManager.short_round``: only members that start or fill a block are
        visited). Priced as a decode of those left, plus the swaps; accounted at the books
        after it."""
        sched = self.engine.scheduler
        out = SchedulerOutput()
        by_seq = self.by_seq

        def make_room(seq_id: object) -> bool:
            victim = sched.growth_victim()
            assert victim is not None, "a policy that preempted one preempts the next"
            self._leave(victim, out)
            return victim is not by_seq[seq_id]

        members = self.members
        self.paged.short_round(make_room)
        assert members, "the oldest request fits alone"
        self.ledger.preempted(out.preempted, len(out.swap_out))
        n = len(members)
        context = self.sum_tokens + n * self.done - self.sum_join
        duration = self.cost.decode_curve(n, context).sums(1)[0]
        if out.swap_out:
            duration += self.cost.swap_ticks(len(out.swap_out))
        self.seq_rounds += n
        self._round(duration, None)
        finishes = self.finishes
        while finishes and members.get(finishes[0][3]) is not finishes[0][4]:
            heapq.heappop(finishes)  # a member preempted since
        if finishes and finishes[0][0] == self.done:
            self._finish()
        elif self.engine.check_integrity:
            self._check()

    def _resumed(self, out: SchedulerOutput, n: int, context: int) -> None:
        """The decode round just taken by the ``n`` members' sequences (their tokens before
        it: ``context``) also forked groups (``_fork``) or resumed swapped requests, each
        computing its next token (every sample of a group): the round is priced as one decode
        of them all plus the swaps, and accounted at the books after it (as ``_admission``)."""
        chunks = out.chunks
        m = len(chunks)
        seqs = sum([len(c.request.seq_ids) for c in chunks])  # (a group: each of its samples)
        cached = sum([c.num_cached_tokens * len(c.request.seq_ids) for c in chunks])
        duration = self.cost.decode_curve(n + seqs, context + cached).sums(1)[0]
        duration += self.cost.swap_ticks(len(out.swap_in) + len(out.swap_out))
        if out.preempted:  # (a group that went straight back out: its fork needs more)
            self.ledger.preempted(out.preempted, len(out.swap_out))
        r = len(self.members)
        self.seq_rounds += r + m
        if r + m > self.max_running:
            self.max_running = r + m
        self._round(duration, out)
        joined = [c.request for c in chunks if c.request.status is _RUNNING]
        if joined:
            self._join(joined)

    def _mixed(self, preempted: bool) -> bool | None:
        """A chunked round whose decodes (every member's) took their blocks: the policy's part
        (``Scheduler.fill``: prefill chunks, swap-ins, admissions) in the rest of the budget,
        the round priced from its whole shape (the members' decodes and those chunks, plus the
        swaps: ``SimExecutor``'s sum), accounted at the books after it, the chunks applied. A
        request whose prompt completes samples its first token and joins. Returns whether the
        policy's part did anything (if not, the rounds after it repeat it until an event), or
        None if the round leaves a request the cohort cannot take on (a prompt's last token
        alone, a request resumed without a chunk): the cohort must end."""
        sched, members = self.engine.scheduler, self.members
        n = len(members) + self.extra  # their sequences
        context = self.sum_tokens + n * self.done - self.sum_join  # the members' tokens
        out = SchedulerOutput()
        sched.fill(out, self.prefilling, members.keys(), preempted)
        chunks = out.chunks
        assert n or chunks, "a round after preemptions runs someone (the oldest fits alone)"
        part = BatchShape.from_chunks(
            [(c.num_new_tokens, c.num_cached_tokens) for c in chunks for _ in c.request.seq_ids]
        )
        shape = BatchShape(
            n + part.num_tokens,
            n + part.num_seqs,
            context + n + part.attn_pairs,
            context + n + part.kv_read_tokens,
        )
        duration = self.cost.step_ticks(shape)
        swaps = (self.victim_swaps if preempted else 0) + len(out.swap_out) + len(out.swap_in)
        if swaps:
            duration += self.cost.swap_ticks(swaps)
        if out.preempted:
            self.ledger.preempted(out.preempted, len(out.swap_out))
        self.admitted_running += len(sched.running)
        self.admitted_seqs += len(members) + len(chunks)
        held = self._round(duration, out, hold=True)
        finishes = self.finishes
        while finishes and members.get(finishes[0][3]) is not finishes[0][4]:
            heapq.heappop(finishes)  # a member preempted since
        ended: list[Request] = []
        if held or (finishes and finishes[0][0] == self.done):
            ended = self._finish(held)  # the round's members and chunks, in one order
        joined: list[Request] = []
        rest: list[Request] = []
        for req in dict.fromkeys([*self.prefilling, *[c.request for c in chunks]]):
            if req.status is _RUNNING:
                (joined if _decodes(req) else rest).append(req)
        if len(rest) > 1:
            rest.sort(key=_arrival_key)
        self.prefilling = rest
        if joined:
            self._join(joined)
        lone = any(r.num_pending_tokens == 1 for r in rest)
        held_on = sum(1 for r in ended if r in sched.running)  # (a policy holds them: async)
        if lone or len(sched.running) != len(members) + len(rest) + held_on:
            return None
        return bool(chunks or out.preempted or out.swap_in or out.released or ended)

    def _round(
        self, duration: int, out: SchedulerOutput | None, hold: bool = False
    ) -> list[Request]:
        """A decode round of the members on its own, of ``duration``, with ``out``'s chunks
        (None: the members alone): accounted at the books after it, then applied. With
        ``hold``, the chunks' requests that finished are returned, not finished."""
        self.done += 1
        self.windows += 1
        self._account(duration, len(self.engine.scheduler.running))
        held: list[Request] = []
        if out is None:
            self.ledger.advance(duration)
        elif hold:
            held = self.engine.advance(out, duration)
        else:
            self.engine.apply(out, duration)
        if self.times is not None:
            self._ran(self.done - 1, self.ledger.ticks, None, 1)
        return held

    def _account(self, duration: int, running: int) -> None:
        """A round of ``duration`` at the books as they are now (its allocations made)."""
        sched = self.engine.scheduler
        tokens, reservation, internal = self.kv.books()
        alloc = tokens + reservation + internal
        if self.engine.check_integrity:
            queued = sched.has_queued()
            capacity = self.kv.capacity
            # every category >= 0, their sum the capacity
            MemoryUsage(capacity, *categories(capacity, tokens, reservation, internal, queued))
            self._check()
        if running > self.max_running:
            self.max_running = running
        if sched.has_groups or self.resharing:  # (the round's forks, swaps, copies, hits made)
            self._resaved()
        self.time += duration
        self.token_time += duration * tokens
        self.alloc_time += duration * alloc
        self.internal_time += duration * internal
        if self.regions is not None:
            self.rounding_time += duration * self.regions.allocator_rounding
        if sched.waiting or sched.swapped:  # its unallocated slots are external fragmentation
            self.wait_time += duration
            self.wait_alloc += duration * alloc

    def _admission(self, batch: SchedulerOutput) -> None:
        """Run the policy's admission round (its slots allocated already): priced by shape,
        accounted at the books after it, its requests' counters applied; those it leaves
        decoding join."""
        eng = self.engine
        sched = eng.scheduler
        chunks = batch.chunks  # one sequence each (a group's prompt is one until it forks)
        duration = self._duration(batch)
        running = len(sched.running)
        self._account(duration, running)
        self.admissions += 1
        self.admitted_running += running
        self.admitted_seqs += len(chunks)
        eng.apply(batch, duration)
        if len(chunks) == 1:  # (one arrival: no comprehension)
            req = chunks[0][0]
            joined = [req] if req.status is _RUNNING else []
        else:
            joined = [c.request for c in chunks if c.request.status is _RUNNING]
        if joined:  # (one not finished by its prefill)
            if self.regions is not None:  # (static holds a finished one as running)
                joined = [r for r in joined if r.num_output_tokens < r.output_len]
            self._join(joined)

    def _duration(self, batch: SchedulerOutput) -> int:
        """What ``SimExecutor.execute`` says of an admission round (no swap in it, so the cost
        model's step time), remembered by the batch's (new, cached) tokens per chunk: a cost
        model prices a shape and nothing else (the fast-forward relies on it throughout), and
        prompt lengths repeat (a long run prices each length once)."""
        chunks = batch.chunks  # one sequence each (a group's prompt is one until it forks)
        if len(chunks) == 1:  # one arrival (the usual case): its pair is the key
            _, new, cached = chunks[0]
            pair = (new, cached)
            duration = self.prices.get(pair)
            if duration is None:
                shape = BatchShape.from_chunks((pair,))
                duration = self.prices[pair] = self.cost.step_ticks(shape)
            return duration
        pairs = tuple([(c.num_new_tokens, c.num_cached_tokens) for c in chunks])
        duration = self.prices.get(pairs)
        if duration is None:
            duration = self.prices[pairs] = self.cost.step_ticks(BatchShape.from_chunks(pairs))
        return duration

    # ----- parallel samples ----------------------------------------------------------------
    def _forked(self, reqs: list[Request]) -> list[Request]:
        """Those of ``reqs`` that may join: one sequence, or a group forked (its samples'
        last blocks their own since the fork round's copy-on-write). A group that sampled
        its first token but has not forked yet forks in its next decode round: it stays out
        until then (``forking``; under chunked prefill ``fill`` would not decode it, so the
        cohort ends at the next event: ``unforked``)."""
        ready = [r for r in reqs if len(r.seq_ids) == r.n]
        if len(ready) < len(reqs):
            if self.engine.scheduler.config.enable_chunked_prefill:
                self.unforked = True  # (``fill`` would not decode it)
            else:
                self.forking += [r for r in reqs if len(r.seq_ids) < r.n]
        return ready

    def _forks_fit(self) -> bool:
        """Do the forking groups' first appends fit with the members' next round? Each of n
        samples takes a block: a new one, or (a shared partial last block) a copy but the
        last (``can_append_all``). Then no one is short and no order of appends matters."""
        bs = self.bs
        assert isinstance(self.kv, KVCacheManager), "groups run on paged memory only"
        need = sum([r.n - 1 if r.num_computed_tokens % bs else r.n for r in self.forking])
        if need > self.kv.num_free_blocks:
            return False
        fit = self.kv.rounds_that_fit(need)
        return fit is None or fit >= 1

    def _fork(self, out: SchedulerOutput) -> None:
        """The forking groups' round, taken by the members' decode too (``_forks_fit``): each
        forks and appends its next token (``Scheduler._append``: the copies of a shared last
        block), into ``out``, and joins after it (``_resumed``)."""
        sched = self.engine.scheduler
        for req in self.forking:
            if not sched._append(req, 1, out):  # (``_forks_fit`` said they fit)
                raise IntegrityError(f"group {req.request_id}: no room for its fork")
            out.chunks.append(sched._chunk(req, 1))
        self.forking = []

    def _part(self, req: Request, member: Member, lag: int) -> None:
        """``req`` leaves (finished, preempted, the cohort's end; its ``members`` entry is the
        caller's) after ``lag`` rounds as a member: counters up to date, its sums taken out."""
        join, tokens, outputs, _ = member
        if self.times is not None:
            self._stamp(req, join, outputs, lag)
        req.num_computed_tokens = tokens + lag
        req.num_output_tokens = outputs + lag
        more = 1 + self.seqs.pop(req, 0) if self.seqs else 1
        self.extra -= more - 1
        self.sum_join -= join * more
        self.sum_tokens -= tokens * more

    def _resaved(self) -> None:
        """Blocks saved by sharing may have moved (a group forked, swapped, finished): the
        time integral so far at the old count, the new count from now on."""
        saved = self.kv.blocks_saved_by_sharing
        if saved != self.saved:
            self.saved_time += self.saved * (self.time - self.saved_at)
            self.saved_at = self.time
            self.saved = saved

    # ----- per-token times ----------------------------------------------------------------
    def _ran(self, a: int, time: int, curve: StepCurve | None, k: int) -> None:
        """Decode rounds a+1 .. a+k ran: one round ending at ``time`` (ticks), or k from
        ``time`` on with step times ``curve``'s."""
        self.firsts.append(a)
        self.ends.append((time, None if k == 1 else curve))

    def _stamp(self, req: Request, join: int, outputs: int, lag: int) -> None:
        """``req`` sampled its tokens ``outputs`` + 1 .. ``outputs`` + ``lag`` at the ends of
        rounds join+1 .. join+lag (``Engine._stamp``'s rule, for tokens after the first: each
        replaces any time an earlier run of it left there)."""
        assert self.times is not None
        times = self.times.setdefault(req.request_id, [])
        del times[outputs:]
        firsts, ends, done = self.firsts, self.ends, self.done
        i = bisect_right(firsts, join) - 1  # the run of round join + 1
        r, last = join, join + lag
        while r < last:
            time, curve = ends[i]
            if curve is None:
                times.append(to_seconds(time))
                r += 1
            else:
                a = firsts[i]
                upto = min(firsts[i + 1] if i + 1 < len(firsts) else done, last)
                times += [
                    to_seconds(time + t) for t in curve.totals(list(range(r - a + 1, upto - a + 1)))
                ]
                r = upto
            i += 1

    # ----- the end ---------------------------------------------------------------------------
    def _flush(self) -> None:
        """Add the cohort's rounds to the engine's totals: one span."""
        capacity, waited = self.kv.capacity, self.wait_time
        # the rounds in which a request waited (their allocated slots only), then the others
        part = level_integrals(capacity, waited, 0, self.wait_alloc, 0, True)
        rest = level_integrals(
            capacity,
            self.time - waited,
            self.token_time,
            self.alloc_time - self.wait_alloc,
            self.internal_time,
            False,
        )
        a, b, c, d, e = map(int.__add__, part, rest)
        span = Span(
            self.done + self.admissions,
            self.time,
            self.seq_rounds + self.admitted_running,
            self.seq_rounds + self.admitted_seqs,
            self.max_running,
            (a, b, c, d, e),
            self.saved_time + self.saved * (self.time - self.saved_at),
            self.rounding_time,
        )
        self.engine.ledger.add(span)

    def _sync(self) -> None:
        """Bring every member's counters up to date; their memory stays in the books' growth
        (it no longer advances; the next read of their blocks takes what they are owed)."""
        d = self.done
        for req, m in self.members.items():
            if d != m.join:
                self._part(req, m, d - m.join)
        self.members.clear()
        self.forking = []
        self.seqs.clear()
        self.extra = 0
        if self.engine.check_integrity:
            self.kv.check_integrity()

    def _check(self) -> None:
        """The books hold, and every member's memory grows in them (the engine's integrity
        hook, at every event: tests)."""
        self.kv.check_integrity()
        growing = self.kv.is_growing
        lost = [r.request_id for r in self.members if not all(map(growing, r.seq_ids))]
        if lost:
            raise IntegrityError(f"members whose memory no longer grows: {lost[:10]}")

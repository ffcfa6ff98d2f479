"""Closed-form fast-forward over decode rounds: simulation cost grows with events, not tokens.

After a *pure decode round* (every running request computed exactly one token; nothing was
admitted, preempted, swapped, copied or finished), the next rounds repeat it until an event:

* a request finishes (memory is freed, admission may change),
* a request arrives,
* growth needs more blocks than are free (the scheduler must preempt).

Nothing structural changes in between: admission stays refused (free blocks only shrink),
budgets hold, every request gains one token per round. So the engine advances k rounds at once:

    round i (1..k) shape  = base + (i-1) * delta        (every context grows by one)
    duration d_i          = cost model, summed in closed form (arithmetic series per regime)
    token states during i = U.token_states + B*i
    allocated during i    = U.allocated + block_size * (#block allocations at rounds <= i)
    internal frag. during i = U.internal + (each request's last-block tail, once allocated)
    reservation           = allocated - token states - internal

so every time-weighted category integrates exactly, with work per block allocation, not per
token. ``Engine(reference=True)`` steps every round instead; a differential test checks both.

Where ``cohort.plain`` holds (paged memory, no beams, no block shared with a pinned prefix, no
token ids unless prefix caching keys them, no groups under prefix caching; or contiguous memory
under a policy that plans its rounds: every built-in one)
the decode cohort (``cohort.py``) runs from here through every event, follow-ups,
per-token times and forked parallel samples included. Contiguous memory runs there or steps
(a policy that plans no round; a chunked round the cohort does not take on). The windows here
(``_window``, one per event, visiting every running request) serve only paged memory that the
cohort cannot:

* token ids without prefix caching (chat turns), and prefix caching with groups (a window keys
  the blocks it fills);
* a block shared with a pinned prefix;
* a queue, or a chunked round, under a policy that plans no round (``Scheduler.plan_round``,
  ``fill``: greedy-nopreempt, whose rounds admit and decode at once; reserve with groups
  running; a user's opted-in policy without them).

(A group's fork round, with its copy-on-write, is the cohort's when its blocks fit beside the
members' without chunked prefill, else ``schedule()``'s.)

Beams never run in bulk (they fork and free every round: ``_pure_decode``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedkv.engine import cohort
from pagedkv.engine.batch_shape import BatchShape
from pagedkv.engine.clock import to_seconds
from pagedkv.engine.executor import SimExecutor
from pagedkv.engine.ledger import Span, level_integrals
from pagedkv.engine.scheduler import Scheduler, SchedulerOutput, new_token_ids
from pagedkv.engine.windows import StepCurve, add_new_blocks

if TYPE_CHECKING:
    from pagedkv.engine.engine import Engine

_NO_FILL = Scheduler.fill  # a policy that plans no chunked round


class FastForward:
    """Advances an engine over runs of identical decode rounds in closed form."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        executor = engine.executor
        self.cost = executor.cost_model if isinstance(executor, SimExecutor) else None
        config = getattr(engine.scheduler.kv, "config", None)  # the memory's, fixed for the run
        self.caches_prefixes = bool(getattr(config, "enable_prefix_caching", False))
        self.windows = 0
        self.rounds = 0
        self.prices: dict[object, int] = {}  # the cohorts' admission rounds, by shape

    def after(self, batch: SchedulerOutput, finished: bool) -> None:
        """Called after every round; skips ahead if the next rounds are pure decodes: the round
        just run was one and finished nobody, or the policy promises the next one is
        (``Scheduler.decodes_next``: then the admission round of an arrival needs no decode
        round after it to start a window).

        With plain memory, a decode cohort (``cohort.py``) runs from here through every event
        the policy plans (``Scheduler.plan_round``). Otherwise windows chain
        while nothing can change the schedule: after a window that ended with a finish, if no
        request waits (nothing to admit or resume) and none has arrived, the next round is
        again a pure decode of those still running.
        """
        if self.cost is None:
            return
        eng = self.engine
        sched = eng.scheduler
        decodes = not (finished or not self._pure_decode(batch)) or sched.decodes_next()
        if not decodes:
            # With chunked prefill a policy that fills chunked rounds (``Scheduler.fill``) runs
            # them in a cohort too, whoever prefills; if it cannot, the engine steps on.
            chunked = sched.config.chunked and type(sched).fill is not _NO_FILL
            if not chunked or not cohort.plain(eng):
                return
            run = cohort.Cohort(eng, self.cost, self.prices)
            if run.run():
                self.windows += run.windows
                self.rounds += run.rounds
            return
        while True:
            if cohort.plain(eng):  # one lazy window through every event to come
                queued = sched.has_queued()
                run = cohort.Cohort(eng, self.cost, self.prices)
                if run.run():
                    self.windows += run.windows
                    self.rounds += run.rounds
                    return
                if not queued and sched.has_queued():
                    return  # an arrival into an empty queue: the scheduler may admit it
            if sched.kv.growth_block_size is None:
                return  # contiguous memory: the cohort's, or the scheduler's round by round
            if self.caches_prefixes and sched.has_queued():
                # Decoding requests key new blocks every block_size rounds, and a waiting or
                # swapped request may hit them: its admission or swap-in gets cheaper within
                # what a window assumes is a run of identical rounds (the cohort checks that
                # it cannot: ``Cohort._growth_may_hit``). Step round by round instead.
                return
            if sched.plans_every_event:
                return  # (no window without the policy's plan: the cohort's, or a stepped round)
            stop = self._window()
            if stop is not None or not sched.running or sched.has_queued():
                return
            arrival = eng.next_arrival
            if arrival is not None and eng.ledger.arrived(arrival):
                return

    def _window(self) -> str | None:
        """Plan and run one window; returns why the chain must stop (None: a finish ended it).

        While a request waits, arrivals cannot change the schedule (they queue behind a head
        that cannot be admitted, and memory only shrinks), so they do not end the window: they
        are handed to the scheduler when it ends.
        """
        eng = self.engine
        sched = eng.scheduler
        running = sched.running
        kv = sched.kv
        assert self.cost is not None
        queued = sched.has_queued()
        # One member per sequence: a forked group (parallel sampling) decodes n of them.
        members = running
        if sched.has_groups and any(r.n > 1 for r in running):
            members = [r for r in running for _ in r.seq_ids]
            seq_ids = [s for r in running for s in r.seq_ids]
        else:
            seq_ids = [r.seq_ids[0] for r in running]
        n = len(members)
        rooms = kv.rooms(seq_ids)
        # One pass for the first finish (inclusive) and the decode batch's shape: n decodes,
        # each after its computed tokens (BatchShape.from_chunks of (1, c) per request).
        k = running[0].output_len - running[0].num_output_tokens
        context = 0
        for r in running:
            left = r.output_len - r.num_output_tokens
            if left < k:
                k = left
            context += r.num_computed_tokens
        if members is not running:  # a group: each sample holds the same computed tokens
            context = sum(r.num_computed_tokens for r in members)
        base = BatchShape(n, n, context + n, context + n)
        stop: str | None = None
        curve = self.cost.curve(base, BatchShape.decode_growth(n))
        arrival = eng.next_arrival
        if arrival is not None and not queued:
            k_arrival = curve.steps_to_reach(eng.ledger.until(arrival))
            if k_arrival <= k:
                k, stop = k_arrival, "arrival"
        # The round of every block allocation in the window, and the internal fragmentation
        # that the allocations of a round start (a last block that passes the final length).
        bs = kv.growth_block_size
        assert bs is not None, "contiguous memory never runs in windows"
        cross: list[int] = []
        frag: dict[int, int] = {}
        for r, room in zip(members, rooms, strict=True):
            if room >= k:
                continue  # no new block within the window
            computed = r.num_computed_tokens
            if room == 0 and computed % bs:
                return "copy-on-write"  # a shared partial last block: the scheduler copies
            final = r.prompt_len + r.output_len - 1  # max_kv_tokens
            add_new_blocks(cross, frag, computed, room, final, k, bs)
        free = getattr(kv, "num_free_blocks", None)
        if free is not None and len(cross) > free:
            cross.sort()
            # The (free + 1)-th block is taken in round cross[free]: that round needs a
            # preemption (the scheduler's); every earlier round's blocks fit.
            k, stop = cross[free] - 1, "memory"
        if k <= 0:
            return stop or "empty"
        self._advance(curve, k, cross, frag, queued, seq_ids)
        if queued:
            eng.admit_arrivals()
        return stop

    def _pure_decode(self, batch: SchedulerOutput) -> bool:
        running = self.engine.scheduler.running
        if batch.preempted or batch.swap_in or batch.swap_out or batch.copies:
            return False
        if len(batch.chunks) != len(running) or not running:
            return False
        if self.engine.scheduler.has_groups and any(r.beam is not None for r in running):
            return False  # beam groups fork and free every round: never skipped in bulk
        # A decode computes a generated token (index >= prompt_len); a one-token prompt's
        # prefill also computes one token but is not a decode (policies may act on the first
        # decode round, e.g. static closes its batch).
        return all(
            c.num_new_tokens == 1 and c.num_cached_tokens >= c.request.prompt_len
            for c in batch.chunks
        ) and all(r.num_pending_tokens == 1 for r in running)

    def _advance(
        self,
        curve: StepCurve,
        k: int,
        cross: list[int],
        frag: dict[int, int],
        waiting: bool,
        seq_ids: list[object],
    ) -> None:
        eng = self.engine
        sched = eng.scheduler
        kv = sched.kv
        assert self.cost is not None
        u = kv.usage(waiting_for_memory=waiting)
        saved = kv.blocks_saved_by_sharing  # new blocks are private: constant in the window
        n = len(seq_ids)  # each sequence gains one token state a round
        total, moment = curve.sums(k)  # sum d_j, sum j*d_j, j = 0..k-1
        # Integrals of the categories over the window, each weighted by round duration.
        tokens = (u.token_states + n) * total + n * moment
        alloc = u.allocated * total
        internal = u.internal_fragmentation * total
        # A block taken in round i is held for rounds i..k: total - (time before round i).
        before = curve.totals([i - 1 for i in cross if i <= k])
        bs = kv.growth_block_size
        assert bs is not None, "contiguous memory never runs in windows"
        alloc += bs * (len(before) * total - sum(before))
        if frag:
            rounds = [i for i in frag if i <= k]
            for i, start in zip(rounds, curve.totals([i - 1 for i in rounds]), strict=True):
                internal += frag[i] * (total - start)
        weighted = level_integrals(u.capacity, total, tokens, alloc, internal, waiting)
        # Apply: slots, counters, clock, totals.
        running = sched.running
        ids = new_token_ids(running, k) if sched.has_token_ids else None
        if ids is not None and len(seq_ids) != len(running):  # a group's samples: ids unknown
            ids = [
                None if r.n > 1 else i for r, i in zip(running, ids, strict=True) for _ in r.seq_ids
            ]
        kv.append_slots_all(seq_ids, k, ids)
        if eng.token_times is not None:  # round i's token is sampled at now + sum_{j<i} d_j
            start = eng.ledger.ticks
            stamps = [to_seconds(start + t) for t in curve.totals(list(range(1, k + 1)))]
            for r in running:
                eng.token_times.setdefault(r.request_id, []).extend(stamps)
        finished = []
        for r in running:
            r.num_computed_tokens += k
            r.num_output_tokens += k
            if r.num_output_tokens == r.output_len:
                finished.append(r)
        eng.ledger.advance(total)
        n_run = len(running)
        eng.ledger.add(Span(k, total, n_run * k, n_run * k, n_run, weighted, saved * total))
        self.windows += 1
        self.rounds += k
        eng.finish(finished)
        if eng.check_integrity:
            kv.check_integrity()

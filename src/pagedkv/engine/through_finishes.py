"""Windows that run through finishes: one plan from one arrival (or memory event) to the next.

While nothing waits, a finish changes only who decodes: the survivors go on decoding one token
a round. So instead of ending a window at each finish and planning the next one from scratch
(a pass over every running request each time), one window runs through all of them, in
*segments* between finishes::

    round:     1 ......... f1 | f1+1 ......... f2 | f2+1 .... K
    decoding:  n requests     | n - (done at f1)  | ...
    step time: curve 0        | curve 1           | curve 2        (one line pair per segment)

Request m (c_m tokens computed, l_m tokens left) finishes in round f_m = l_m and frees its
blocks, all of them, provided memory is *plain*: paged, every used block held by one sequence
(no fork, prefix hit or pinned prefix shared), no token ids (nothing keyed on free), no groups,
no follow-ups (a finish would release an arrival). Every category is then a sum of terms
"value v held during rounds a..b", which integrates to v (T(b) - T(a-1)), with T(x) the time of
rounds 1..x, summed per segment in closed form; the growth of token states, one per running
request a round, integrates with M(x) = sum over rounds i <= x of i d_i.

The window stops early where the chained windows would have: at the round an arrival falls in
(the scheduler admits it), or before the round whose new blocks do not fit (the scheduler
preempts). Blocks freed by a finish are free for the rounds after it.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from pagedkv.engine.batch_shape import BatchShape
from pagedkv.engine.metrics import CATEGORIES
from pagedkv.engine.windows import WindowCurve, add_new_blocks

if TYPE_CHECKING:
    from pagedkv.engine.cost_model import CostModel
    from pagedkv.engine.engine import Engine
    from pagedkv.engine.request import Request
    from pagedkv.memory.interface import KVAllocator
    from pagedkv.memory.usage import MemoryUsage


class Timeline:
    """T(x) and M(x) of a window whose step-time curve changes at segment starts."""

    def __init__(self) -> None:
        self.starts: list[int] = []  # rounds before each segment
        self.curves: list[WindowCurve] = []
        self.alive: list[int] = []  # requests decoding in each segment
        self.ends: list[int] = []  # each segment's last round
        self.t0: list[float] = [0.0]  # T at each segment start (and at the end)
        self.m0: list[float] = [0.0]  # M at each segment start (and at the end)
        self.reached = False  # cut short by an arrival

    def add(self, start: int, length: int, curve: WindowCurve, alive: int) -> None:
        """Segment of rounds start+1 .. start+length, ``alive`` requests decoding, whose step
        times follow ``curve``."""
        total, moment = curve.sums(length)  # local j = 0.. is round start + 1 + j
        self.starts.append(start)
        self.ends.append(start + length)
        self.curves.append(curve)
        self.alive.append(alive)
        self.t0.append(self.t0[-1] + total)
        self.m0.append(self.m0[-1] + (start + 1) * total + moment)

    @property
    def end_time(self) -> float:
        return self.t0[-1]

    def time_at_ends(self) -> dict[int, float]:
        """T(end) for each segment's last round."""
        return dict(zip(self.ends, self.t0[1:], strict=True))

    def sum_times_before(self, rounds: list[int], weights: list[int] | None = None) -> float:
        """The sum of T(i - 1), the time at which round i starts, over ``rounds`` (each
        1 <= i <= the last segment's end), each times its weight if given. A window may hold
        hundreds of block allocations, so per segment it is summed in closed form::

            T(start + x) = T(start) + sum_{j<x} d_j,  sum_{j<x} d_j = a x + b x (x-1) / 2

        (the segment's head line a + b j), or x by x (``WindowCurve.totals``) for the rare
        segment whose steps pass the switch to its other line.
        """
        total = 0.0
        if len(self.starts) > 1:  # sort once, then each segment is a slice
            if weights is None:
                rounds = sorted(rounds)
            else:
                pairs = sorted(zip(rounds, weights, strict=True))
                rounds, weights = [i for i, _ in pairs], [w for _, w in pairs]
        hi = 0
        for s, start in enumerate(self.starts):
            if len(self.starts) == 1:
                lo, hi = 0, len(rounds)
            else:
                lo, hi = hi, bisect.bisect_right(rounds, self.ends[s], hi)
            xs = [i - 1 - start for i in rounds[lo:hi]]
            ws = None if weights is None else weights[lo:hi]
            if not xs:
                continue
            curve = self.curves[s]
            split = curve.split
            if split is not None and max(xs) > split:
                befores = curve.totals(xs)
                if ws is None:
                    total += len(xs) * self.t0[s] + sum(befores)
                else:
                    total += sum(w * (self.t0[s] + t) for w, t in zip(ws, befores, strict=True))
                continue
            a, b = curve.head
            if ws is None:
                count, s1, s2 = len(xs), sum(xs), sum(x * x for x in xs)
            else:
                count = sum(ws)
                s1 = sum(w * x for w, x in zip(ws, xs, strict=True))
                s2 = sum(w * x * x for w, x in zip(ws, xs, strict=True))
            total += count * self.t0[s] + a * s1 + b * ((s2 - s1) // 2)
        return total


def plain(engine: Engine) -> bool:
    """May the window run through finishes? (The conditions of the module docstring.)"""
    sched = engine.scheduler
    kv = sched.kv
    return (
        not sched.has_queued()
        and not sched.has_groups
        and not sched.has_token_ids
        and not engine.followups
        and kv.growth_block_size is not None
        and bool(getattr(kv, "all_blocks_private", False))
    )


def run_window(engine: Engine, cost: CostModel) -> tuple[str | None, int]:
    """Plan and run one window through finishes; returns (why it stopped, rounds run).

    The reason is None when every running request finished; "arrival" or "memory" as for a
    plain window, and the rounds are 0 when the very first round needs the scheduler."""
    sched = engine.scheduler
    kv = sched.kv
    running = list(sched.running)
    n = len(running)
    bs = kv.growth_block_size
    assert bs is not None
    rooms = kv.rooms([r.seq_ids[0] for r in running])
    computed = [r.num_computed_tokens for r in running]
    lefts = [r.output_len - r.num_output_tokens for r in running]
    order = sorted(range(n), key=lefts.__getitem__)  # ties keep the running order
    # The segments up to the arrival (or the last finish): they bound the rounds to plan.
    arrival = engine.next_arrival
    timeline, k = _segments(cost, computed, lefts, order, max(lefts), arrival, engine.now)
    stop = "arrival" if timeline.reached else None
    # Block allocations (the round of each) up to round k, the internal fragmentation a
    # round's new last blocks start, and the blocks each request holds when it finishes.
    cross: list[int] = []
    frag: dict[int, int] = {}
    held: list[int] = []
    for c, room, left in zip(computed, rooms, lefts, strict=True):
        final = c + left  # max_kv_tokens: the tokens held when it finishes
        held.append(-(-final // bs))
        if room < left and room < k:
            add_new_blocks(cross, frag, c, room, final, min(left, k), bs)
    free: int = getattr(kv, "num_free_blocks")  # noqa: B009 (paged: ``plain`` checked it)
    if len(cross) > free:  # (frees only help: fewer allocations than free blocks always fit)
        # A finish in round f frees its blocks for rounds f+1..; at one round frees go first.
        events = sorted(
            [(i, 1) for i in cross] + [(f + 1, -h) for f, h in zip(lefts, held, strict=True)]
        )
        used = 0
        for i, delta in events:
            used += delta
            if delta > 0 and used > free:  # round i needs a preemption: the scheduler's
                k, stop = i - 1, "memory"
                timeline, _ = _segments(cost, computed, lefts, order, k, None, 0.0)
                break
    if k <= 0:
        return stop, 0
    _account(engine, kv.usage(), timeline, k, cross, frag, computed, lefts, held, bs)
    _apply(engine, running, lefts, order, timeline, k)
    return stop, k


def _segments(
    cost: CostModel,
    computed: list[int],
    lefts: list[int],
    order: list[int],
    bound: int,
    arrival: float | None,
    now: float,
) -> tuple[Timeline, int]:
    """The segments of rounds 1..bound between finishes (``order``: by rounds left), cut at
    the round an arrival at ``arrival`` falls in (``timeline.reached``); and the last round."""
    timeline = Timeline()
    n = len(order)
    alive, context, start, pos = n, sum(computed), 0, 0
    while start < bound:
        end = min(lefts[order[pos]], bound)
        ctx = context + alive * start
        curve = cost.curve(
            BatchShape(alive, alive, ctx + alive, ctx + alive), BatchShape.decode_growth(alive)
        )
        length = end - start
        if arrival is not None:
            left = arrival - (now + timeline.end_time)
            if left <= curve.sums(length)[0]:  # it falls in this segment
                reach = curve.steps_to_reach(left)
                if reach <= length:
                    timeline.reached = True
                    if reach:
                        timeline.add(start, reach, curve, alive)
                    return timeline, start + reach
        timeline.add(start, length, curve, alive)
        while pos < n and lefts[order[pos]] == end:  # those finishing in round ``end``
            context -= computed[order[pos]]
            alive -= 1
            pos += 1
        start = end
    return timeline, bound


def _account(
    engine: Engine,
    u: MemoryUsage,
    timeline: Timeline,
    k: int,
    cross: list[int],
    frag: dict[int, int],
    computed: list[int],
    lefts: list[int],
    held: list[int],
    bs: int,
) -> None:
    """Add the window's time-weighted categories and counters to the engine's totals."""
    tk = timeline.end_time
    t_end = timeline.time_at_ends()
    tokens = u.token_states * tk
    alloc = u.allocated * tk
    internal = u.internal_fragmentation * tk
    running_rounds = 0
    # Growth: each request alive in round i holds i more tokens than it started with.
    for s, alive in enumerate(timeline.alive):
        tokens += alive * (timeline.m0[s + 1] - timeline.m0[s])
        running_rounds += alive * (timeline.ends[s] - timeline.starts[s])
    # Blocks taken in round i, held to the end (a finish takes them back, below).
    taken = cross if not cross or max(cross) <= k else [i for i in cross if i <= k]
    alloc += bs * (len(taken) * tk - timeline.sum_times_before(taken))
    rounds = [i for i in frag if i <= k]
    if rounds:
        weights = [frag[i] for i in rounds]
        internal += sum(weights) * tk - timeline.sum_times_before(rounds, weights)
    # A finish in round f < k frees everything the request held for rounds f+1..k.
    for c, left, h in zip(computed, lefts, held, strict=True):
        if left < k:
            after = tk - t_end[left]
            tokens -= c * after
            alloc -= bs * h * after
            internal -= (bs * h - (c + left)) * after
    integrals = {
        "token_states": tokens,
        "reservation": alloc - tokens - internal,
        "internal_fragmentation": internal,
        "external_fragmentation": 0.0,  # nothing waits: unallocated memory is free
        "free": u.capacity * tk - alloc,
    }
    t = engine.totals
    t.iterations += k
    t.busy_time += tk
    t.sum_running += running_rounds
    t.sum_batched_seqs += running_rounds
    for name in CATEGORIES:
        t.weighted[name] += integrals[name]
    # Private blocks: nothing shared now or later in the window (pinned prefixes may count).
    t.weighted_saved_blocks += engine.scheduler.kv.blocks_saved_by_sharing * tk


def _apply(
    engine: Engine,
    running: list[Request],
    lefts: list[int],
    order: list[int],
    timeline: Timeline,
    k: int,
) -> None:
    """Slots and counters: each finisher up to its round (then it finishes and frees), the
    others for all k rounds; the clock moves with them."""
    kv = engine.scheduler.kv
    now = engine.now
    pos, n = 0, len(order)
    t_end = timeline.time_at_ends()
    while pos < n and lefts[order[pos]] <= k:
        f = lefts[order[pos]]
        group = []
        while pos < n and lefts[order[pos]] == f:
            group.append(running[order[pos]])
            pos += 1
        _advance(kv, group, f)
        engine.now = now + t_end[f]
        engine.finish(group)
    if pos < n:
        _advance(kv, [running[i] for i in sorted(order[pos:])], k)
    engine.now = now + timeline.end_time


def _advance(kv: KVAllocator, requests: list[Request], rounds: int) -> None:
    kv.append_slots_all([r.seq_ids[0] for r in requests], rounds)
    for r in requests:
        r.num_computed_tokens += rounds
        r.num_output_tokens += rounds

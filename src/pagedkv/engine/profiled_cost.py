"""ProfiledCost: an iteration's time as the sum of its operators' measured times (a ``Profile``).

Per step of shape (T tokens, S sequences, P attention pairs, R K/V tokens read), L layers split
over tp GPUs (per-layer terms divided by tp)::

    per_iteration + per_sequence S + per_token T + embedding(T) + lm_head(S) + all-reduces(T)
      + L / tp x [ linear(T) + residual(T) + attention ]
    attention = decode(R) + decode.per_sequence S                   if T = S (decode only)
              = per_call + per_sequence S + per_pair P + per_read R  otherwise (a prefill in it)

``embedding``, ``lm_head``, ``linear``, ``residual`` and ``decode`` are piecewise-linear curves
of measured points (``Profile``; ``residual`` is ``layer_residual``, what whole forwards measured
less their operators' sum, 0 in a profile without it); the decode curve is the one measured at
the run's block size, so the paged kernel's per-block cost is in it. A swap of m blocks costs
L x (fixed + per_block m / tp), the per-layer copies of K and V measured at that block size;
recompute is the prefill it repeats. Under tensor parallelism the all-reduces are the
roofline's (two ring all-reduces of T x hidden per layer over the GPU link, ``RooflineConfig``):
the profile is of one device.

Over a window of decode rounds (T, S fixed, R growing by S a round) only decode(R) moves, and it
stays on one line between measured points: the step time is piecewise linear in the round, and
``SegmentCurve`` sums it in closed form, one segment per measured point crossed.

Prices are integer ticks (``clock.py``): every constant, and each curve's lines (value at 0 and
slope, times its weight: the layers for per-layer curves), is quantised to ticks once, at
construction, so a step's price is an exact integer and the window sums are exact series.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import groupby

from pagedkv.engine.batch_shape import BatchShape
from pagedkv.engine.clock import to_ticks
from pagedkv.engine.cost_model import CostModel, RooflineConfig
from pagedkv.engine.profile import Curve, Profile
from pagedkv.engine.segments import SegmentCurve, segment_starts
from pagedkv.errors import ConfigError
from pagedkv.models.gpus import GPUSpec
from pagedkv.models.models import ModelSpec, check_tensor_parallel
from pagedkv.validation import check_int


class TickCurve:
    """A profile ``Curve`` times a weight, in ticks: line i is ``a_i + b_i x`` with integer
    a_i, b_i (each the float line's value at 0 and slope, weighted, quantised once), holding
    where the curve's line i does (``Curve.segment``)."""

    __slots__ = ("curve", "lines", "x")

    def __init__(self, curve: Curve, weight: float) -> None:
        self.curve, self.x = curve, curve.x
        lines = [curve.line(i) for i in range(len(curve.x) - 1)]
        self.lines = [(to_ticks(weight * a), to_ticks(weight * b)) for a, b in lines]

    def segment(self, x: int) -> int:
        return self.curve.segment(x)

    def at(self, x: int) -> int:
        a, b = self.lines[self.curve.segment(x)]
        return a + b * x


_Term = tuple[TickCurve, int, int]  # a weighted curve and its argument x0 + dx j


class ProfiledCost(CostModel):
    """Step and swap times from an operator profile, for one model at one block size."""

    def __init__(
        self,
        profile: Profile,
        model: ModelSpec,
        block_size: int,
        tensor_parallel_size: int = 1,
        gpu: GPUSpec | None = None,
        config: RooflineConfig | None = None,
    ) -> None:
        profile.check_model(model)
        check_int("block_size", block_size, 1)
        profile.check_block_size(block_size)
        tp = check_tensor_parallel(model, tensor_parallel_size)
        self.profile, self.model, self.block_size = profile, model, block_size
        self.tensor_parallel_size = tp
        self.layers = model.num_layers / tp
        p = profile
        self._decode = p.decode_attention[block_size]
        self._swap = p.swap[block_size]
        self._prefill = p.prefill_attention
        self._allreduce = (0.0, 0.0)  # (per step, per token)
        if tp > 1:
            if gpu is None:
                raise ConfigError(
                    "gpu", None, "tensor parallelism needs a GPU preset for its all-reduces"
                )
            cfg = config or RooflineConfig(block_size=block_size)
            count = 2 * model.num_layers
            ring = 2 * (tp - 1) / tp * model.hidden_size * model.dtype_bytes
            link = gpu.peer_bandwidth * cfg.interconnect_efficiency
            self._allreduce = (count * cfg.allreduce_latency_s, count * ring / link)
        # linear(T) + residual(T): one curve, the residual's points added (None: no residual)
        linear = p.linear if p.layer_residual is None else _add(p.linear, p.layer_residual)
        layers = self.layers
        # The prices in ticks, each coefficient quantised once (the module docstring).
        self._constant = to_ticks(p.per_iteration_s + self._allreduce[0])
        self._per_sequence = to_ticks(p.per_sequence_s)
        self._per_token = to_ticks(p.per_token_s + self._allreduce[1])
        self._embedding = TickCurve(p.embedding, 1.0)
        self._lm_head = TickCurve(p.lm_head, 1.0)
        self._linear = TickCurve(linear, layers)  # linear(T) + residual(T), all layers
        self._context = TickCurve(self._decode.context, layers)
        self._decode_per_sequence = to_ticks(layers * self._decode.per_sequence_s)
        a = self._prefill
        self._prefill_ticks = (
            to_ticks(layers * a.per_call_s),
            to_ticks(layers * a.per_sequence_s),
            to_ticks(layers * a.per_pair_s),
            to_ticks(layers * a.per_read_token_s),
        )
        m = model.num_layers
        self._swap_fixed = to_ticks(m * self._swap.fixed_s)
        self._swap_per_block = to_ticks(m * self._swap.per_block_s / tp)
        self._fixed: dict[int, int] = {}  # decode_curve's constant part, by batch size
        self._ctx_lines = self._context.lines
        self._ctx_last = len(self._ctx_lines) - 1  # the line that goes on past the last point

    # ----- one step -----------------------------------------------------------------------------
    def step_ticks(self, shape: BatchShape) -> int:
        t, s, pairs, reads = (
            shape.num_tokens,
            shape.num_seqs,
            shape.attn_pairs,
            shape.kv_read_tokens,
        )
        if t == s:
            attention = self._context.at(reads) + self._decode_per_sequence * s
        else:
            call, per_seq, per_pair, per_read = self._prefill_ticks
            attention = call + per_seq * s + per_pair * pairs + per_read * reads
        return (
            self._constant
            + self._per_sequence * s
            + self._per_token * t
            + self._embedding.at(t)
            + self._lm_head.at(s)
            + self._linear.at(t)
            + attention
        )

    def swap_ticks(self, num_blocks: int) -> int:
        """L x (fixed + per_block x blocks / tp); nothing for no blocks."""
        m = check_int("num_blocks", num_blocks, 0)
        if m == 0:
            return 0
        return self._swap_fixed + self._swap_per_block * m

    # ----- windows ------------------------------------------------------------------------------
    def curve(self, base: BatchShape, delta: BatchShape) -> SegmentCurve:
        """The window's step times, base + j delta: the curves' arguments grow linearly."""
        t0, s0, p0, r0 = base.as_tuple()
        dt, ds, dp, dr = delta.as_tuple()
        decode = t0 == s0
        if _kind_changes(t0 - s0, dt - ds):
            raise ConfigError(
                "delta", delta, "must keep every step of the window decode-only or not"
            )
        per_seq, per_tok = self._per_sequence, self._per_token
        c0 = self._constant + per_seq * s0 + per_tok * t0
        c1 = per_seq * ds + per_tok * dt
        terms: list[_Term] = [
            (self._embedding, t0, dt),
            (self._lm_head, s0, ds),
            (self._linear, t0, dt),
        ]
        if decode:
            per_seq = self._decode_per_sequence
            c0, c1 = c0 + per_seq * s0, c1 + per_seq * ds
            terms.append((self._context, r0, dr))
        else:
            call, seq, pair, read = self._prefill_ticks
            c0 += call + seq * s0 + pair * p0 + read * r0
            c1 += seq * ds + pair * dp + read * dr
        return _build(terms, c0, c1)

    def decode_curve(self, num_seqs: int, context: int) -> SegmentCurve:
        """``curve`` of decode rounds of ``num_seqs`` sequences holding ``context`` tokens."""
        n = num_seqs
        fixed = self._fixed.get(n)
        if fixed is None:
            fixed = self._fixed[n] = (
                self._constant
                + (self._per_sequence + self._per_token + self._decode_per_sequence) * n
                + self._embedding.at(n)
                + self._lm_head.at(n)
                + self._linear.at(n)
            )
        # The head line and the first breakpoint now; the other segments only if a sum
        # reaches past it (the lines ``curve`` gives: exact integers).
        r0 = context + n
        xs = self._context.x
        lines, last = self._ctx_lines, self._ctx_last
        s = bisect_right(xs, r0) - 1
        if s >= last:  # on the last line: one segment
            ga, gb = lines[last]
            return SegmentCurve((fixed + ga + gb * r0, gb * n), None)
        ga, gb = lines[s]
        head = (fixed + ga + gb * r0, gb * n)

        def rest() -> tuple[list[int], list[tuple[int, int]]]:
            starts, out = [0], [head]
            for i in range(s + 1, len(lines)):
                j = -((r0 - xs[i]) // n)  # the first round whose context reaches xs[i]
                a, b = lines[i]
                line = (fixed + a + b * r0, b * n)
                if j == starts[-1]:  # two points crossed in one round: the later line holds
                    out[-1] = line
                else:
                    starts.append(j)
                    out.append(line)
            return starts, out

        return SegmentCurve(head, -((r0 - xs[s + 1]) // n), rest)


def _add(a: Curve, b: Curve) -> Curve:
    """The curve a + b: both piecewise linear, so the sum is, with the points of either (the
    later last line holds beyond; both last lines rise or stay, so the sum's does)."""
    xs = sorted({*a.x, *b.x})
    return Curve(tuple(xs), tuple(a.at(x) + b.at(x) for x in xs), monotone=False)


def _kind_changes(gap: int, growth: int) -> bool:
    """Does gap + growth j (tokens - sequences of step j) hit 0 at some j >= 0 or leave it?"""
    if growth == 0:
        return False
    if gap == 0:
        return True  # decode-only at j = 0, not after
    return gap * growth < 0 and gap % growth == 0


def _build(terms: list[_Term], c0: int, c1: int) -> SegmentCurve:
    """The curve of c0 + c1 j + sum of curve(x0 + dx j) (ticks)."""
    return SegmentCurve.of(*_segments(terms, c0, c1))


def _segments(terms: list[_Term], c0: int, c1: int) -> tuple[list[int], list[tuple[int, int]]]:
    """The segments (starts, lines) of c0 + c1 j + sum of curve(x0 + dx j)."""
    lines_of = [curve.segment(x0) for curve, x0, _ in terms]
    events = []
    for index, (curve, x0, dx) in enumerate(terms):
        events += [(j, index, i) for j, i in segment_starts(x0, dx, curve.x, lines_of[index])]

    def line() -> tuple[int, int]:
        a, b = c0, c1
        for (curve, x0, dx), i in zip(terms, lines_of, strict=True):
            ga, gb = curve.lines[i]
            a += ga + gb * x0
            b += gb * dx
        return a, b

    starts, lines = [0], [line()]
    events.sort()
    for j, group in groupby(events, key=lambda e: e[0]):
        for _, index, i in group:
            lines_of[index] = i
        starts.append(j)
        lines.append(line())
    return starts, lines

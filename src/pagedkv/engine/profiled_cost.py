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
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import groupby

from pagedkv.engine.batch_shape import BatchShape
from pagedkv.engine.cost_model import RooflineConfig
from pagedkv.engine.profile import Curve, Profile
from pagedkv.engine.segments import SegmentCurve, segment_starts
from pagedkv.errors import ConfigError
from pagedkv.models.gpus import GPUSpec
from pagedkv.models.models import ModelSpec, check_tensor_parallel
from pagedkv.validation import check_int

_Term = tuple[Curve, int, int, float]  # a curve, its argument x0 + dx j, its weight


class ProfiledCost:
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
        self._linear = p.linear if p.layer_residual is None else _add(p.linear, p.layer_residual)
        self._fixed: dict[int, float] = {}  # decode_curve's constant part, by batch size
        ctx = self._decode.context
        self._ctx_lines = [ctx.line(i) for i in range(len(ctx.x) - 1)]
        self._ctx_last = len(self._ctx_lines) - 1  # the line that goes on past the last point

    # ----- one step -----------------------------------------------------------------------------
    def step_time(self, shape: BatchShape) -> float:
        t, s, pairs, reads = (
            shape.num_tokens,
            shape.num_seqs,
            shape.attn_pairs,
            shape.kv_read_tokens,
        )
        p = self.profile
        if t == s:
            attention = self._decode.context.at(reads) + self._decode.per_sequence_s * s
        else:
            a = self._prefill
            attention = (
                a.per_call_s
                + a.per_sequence_s * s
                + a.per_pair_s * pairs
                + a.per_read_token_s * reads
            )
        return (
            p.per_iteration_s
            + p.per_sequence_s * s
            + p.per_token_s * t
            + p.embedding.at(t)
            + p.lm_head.at(s)
            + self._allreduce[0]
            + self._allreduce[1] * t
            + self.layers * (self._linear.at(t) + attention)
        )

    def swap_time(self, num_blocks: int) -> float:
        """L x (fixed + per_block x blocks / tp); nothing for no blocks."""
        m = check_int("num_blocks", num_blocks, 0)
        if m == 0:
            return 0.0
        tp = self.tensor_parallel_size
        return self.model.num_layers * (self._swap.fixed_s + self._swap.per_block_s * m / tp)

    # ----- windows ------------------------------------------------------------------------------
    def window(self, base: BatchShape, delta: BatchShape, k: int) -> tuple[float, float]:
        check_int("k", k, 0)
        return self.curve(base, delta).sums(k)

    def steps_to_reach(self, base: BatchShape, delta: BatchShape, duration: float) -> int:
        return self.curve(base, delta).steps_to_reach(duration)

    def curve(self, base: BatchShape, delta: BatchShape) -> SegmentCurve:
        """The window's step times, base + j delta: the curves' arguments grow linearly."""
        t0, s0, p0, r0 = base.as_tuple()
        dt, ds, dp, dr = delta.as_tuple()
        decode = t0 == s0
        if _kind_changes(t0 - s0, dt - ds):
            raise ConfigError(
                "delta", delta, "must keep every step of the window decode-only or not"
            )
        p, layers = self.profile, self.layers
        ar0, ar1 = self._allreduce
        c0 = p.per_iteration_s + p.per_sequence_s * s0 + p.per_token_s * t0 + ar0 + ar1 * t0
        c1 = p.per_sequence_s * ds + p.per_token_s * dt + ar1 * dt
        terms: list[_Term] = [
            (p.embedding, t0, dt, 1.0),
            (p.lm_head, s0, ds, 1.0),
            (self._linear, t0, dt, layers),
        ]
        if decode:
            per_seq = self._decode.per_sequence_s * layers
            c0, c1 = c0 + per_seq * s0, c1 + per_seq * ds
            terms.append((self._decode.context, r0, dr, layers))
        else:
            a = self._prefill
            c0 += layers * (
                a.per_call_s + a.per_sequence_s * s0 + a.per_pair_s * p0 + a.per_read_token_s * r0
            )
            c1 += layers * (a.per_sequence_s * ds + a.per_pair_s * dp + a.per_read_token_s * dr)
        return _build(terms, c0, c1)

    def decode_curve(self, num_seqs: int, context: int) -> SegmentCurve:
        """``curve`` of decode rounds of ``num_seqs`` sequences holding ``context`` tokens."""
        n = num_seqs
        fixed = self._fixed.get(n)
        if fixed is None:
            p, layers = self.profile, self.layers
            fixed = self._fixed[n] = (
                p.per_iteration_s
                + (p.per_sequence_s + p.per_token_s) * n
                + p.embedding.at(n)
                + p.lm_head.at(n)
                + self._allreduce[0]
                + self._allreduce[1] * n
                + layers * (self._linear.at(n) + self._decode.per_sequence_s * n)
            )
        # The head line and the first breakpoint now; the other segments only if a sum
        # reaches past it (the lines ``curve`` gives, in the same float operations).
        r0, w = context + n, self.layers
        xs = self._decode.context.x
        lines, last = self._ctx_lines, self._ctx_last
        s = bisect_right(xs, r0) - 1
        if s >= last:  # on the last line: one segment
            ga, gb = lines[last]
            return SegmentCurve((fixed + w * (ga + gb * r0), w * (gb * n)), None)
        ga, gb = lines[s]
        head = (fixed + w * (ga + gb * r0), w * (gb * n))

        def rest() -> tuple[list[int], list[tuple[float, float]]]:
            starts, out = [0], [head]
            for i in range(s + 1, len(lines)):
                j = -((r0 - xs[i]) // n)  # the first round whose context reaches xs[i]
                a, b = lines[i]
                line = (fixed + w * (a + b * r0), w * (b * n))
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


def _build(terms: list[_Term], c0: float, c1: float) -> SegmentCurve:
    """The curve of c0 + c1 j + sum of w x curve(x0 + dx j)."""
    return SegmentCurve.of(*_segments(terms, c0, c1))


def _segments(
    terms: list[_Term], c0: float, c1: float
) -> tuple[list[int], list[tuple[float, float]]]:
    """The segments (starts, lines) of c0 + c1 j + sum of w x curve(x0 + dx j)."""
    lines_of = [curve.segment(x0) for curve, x0, _, _ in terms]
    events = []
    for index, (curve, x0, dx, _) in enumerate(terms):
        events += [(j, index, i) for j, i in segment_starts(x0, dx, curve.x, lines_of[index])]

    def line() -> tuple[float, float]:
        a, b = c0, c1
        for (curve, x0, dx, w), i in zip(terms, lines_of, strict=True):
            ga, gb = curve.line(i)
            a += w * (ga + gb * x0)
            b += w * (gb * dx)
        return a, b

    starts, lines = [0], [line()]
    events.sort()
    for j, group in groupby(events, key=lambda e: e[0]):
        for _, index, i in group:
            lines_of[index] = i
        starts.append(j)
        lines.append(line())
    return starts, lines

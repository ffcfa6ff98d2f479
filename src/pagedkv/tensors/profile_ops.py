"""The operators ``pagedkv profile`` times (``profiler.py`` fits and writes them): a decoder of
the model's shapes holding layer 0 and the other layers a real step streams between two runs of
it (``extra_layers``), and one method per term of the profile that registers its points and
returns their fit. ``Timer`` times every registered point in the same round-robin passes (a
warm-up pass, then 3 to 25 passes, as many as the budget holds), each timing after an untimed
run of the same point and then the other layers and the lm head on one token; a point's time is
its median over the passes (one call that spends a point's share of the budget alone is its
timing)."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from pagedkv.engine.batch_shape import BatchShape
from pagedkv.memory.interface import SwapMapping
from pagedkv.tensors.attention import paged_attention
from pagedkv.tensors.kv_cache import PagedKVCache
from pagedkv.tensors.model import Decoder, ModelInput
from pagedkv.tensors.model_shapes import resolve_model
from pagedkv.tensors.profile_config import ProfileConfig
from pagedkv.tensors.profile_fit import curve, line_curve, nonnegative_lstsq

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


class _NoAttention(Decoder):
    """The decoder with attention left out (the K/V write kept): the layer's other operators."""

    def _attend(
        self,
        i: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        inp: ModelInput,
        cache: PagedKVCache,
    ) -> torch.Tensor:
        cache.write(i, inp.slot_mapping, k.contiguous(), v.contiguous())
        return q.reshape(q.shape[0], -1)


MIN_PASSES = 3
MAX_PASSES = 25
"""Timed passes over every point: at least 3 (a median), at most 25 (a small model's points
take microseconds; more passes add little beside the drift they span)."""


@dataclasses.dataclass
class Point:
    """One measured point: what it runs, the term it belongs to, its timings."""

    fn: Callable[[], object]
    group: str
    samples: list[float] = dataclasses.field(default_factory=list)

    @property
    def value(self) -> float:
        """The median of its timings (the point's measured time)."""
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        """(75th - 25th percentile) / median of its timings: 0 for one timing."""
        if len(self.samples) < 2:
            return 0.0
        q1, _, q3 = statistics.quantiles(self.samples, n=4, method="inclusive")
        return (q3 - q1) / self.value if self.value > 0 else 0.0


class Timer:
    """Registers points (``__call__``), then times them all in round-robin passes (``run``):
    one warm-up pass, then the same passes over every point; each timing comes after an
    untimed lead run of the same point, then ``flush``; each point's time is the median over
    the passes. A machine whose speed drifts from minute to minute (other tenants in its caches
    and memory) then slows every point a little, where timing each point to the end before the
    next would slow a few by the whole drift and bend the fitted curves. The lead run: a real
    step follows a step of its own kind (its code, buffers and allocator warm), where a point
    in a pass follows another term's largest (tiny-llama's whole decode of one sequence, timed
    after a 2048-token prefill or linear layer, measured about twice what it does after its
    own kind); ``flush`` then evicts its weights as the other layers do. The lead runs double
    a pass's time beside what ``budget_s`` counts (the timed runs)."""

    def __init__(
        self,
        clock: Callable[[], float],
        budget_s: float,
        per_point_s: float,
        tick: Callable[[int], None],
        flush: Callable[[], None],
    ) -> None:
        self.clock, self.budget_s, self.per_point_s = clock, budget_s, per_point_s
        self.tick, self.flush = tick, flush
        self.points: list[Point] = []
        self.passes = 0

    def __call__(self, fn: Callable[[], object], group: str) -> Point:
        point = Point(fn, group)
        self.points.append(point)
        return point

    def _time(self, point: Point, lead: bool = True) -> float:
        if lead:  # the lead run (class docstring), untimed
            point.fn()
        self.flush()
        start = self.clock()
        point.fn()
        return self.clock() - start

    def run(self) -> int:
        """Time every registered point; returns the timed passes (``MIN_PASSES`` to
        ``MAX_PASSES``: as many as ``budget_s`` holds at the warm-up pass's times)."""
        total = len(self.points)
        warm = []
        for p in self.points:  # warm-up: allocations, a kernel's first build, the caches
            w = self._time(p, lead=False)
            if w >= self.per_point_s:  # one call spends the point's budget: first-call
                p.samples.append(w)  # costs are small beside it (a large layer on a CPU)
            warm.append(w)
            self.tick(total)
        live = [p for p in self.points if not p.samples]
        per_pass = sum(w for p, w in zip(self.points, warm, strict=True) if not p.samples)
        fit = int(self.budget_s / per_pass) if per_pass > 0 else MAX_PASSES
        self.passes = min(max(fit, MIN_PASSES), MAX_PASSES) if live else 0
        total += self.passes * len(live)
        for _ in range(self.passes):
            for p in live:
                p.samples.append(self._time(p))
                self.tick(total)
        return self.passes

    def spreads(self) -> dict[str, dict[str, list[Any]]]:
        """Per term, in measurement order: each point's timings and spread (``Point.spread``)."""
        out: dict[str, dict[str, list[Any]]] = {}
        for p in self.points:
            g = out.setdefault(p.group, {"runs": [], "spread": []})
            g["runs"].append(len(p.samples))
            g["spread"].append(p.spread)
        return out


def _grid(top: int, start: int = 1) -> list[int]:
    """Powers of two from ``start`` below ``top``, and ``top``: a GEMM's time bends between
    them (the curves interpolate linearly)."""
    out, x = [], start
    while x < top:
        out.append(x)
        x *= 2
    return [*out, top]


DENSE_UP_TO = 16
"""Token and row counts timed one by one up to here (decode batches): a GEMM's kernel and
blocking change with the row count, so its time is not linear between powers of two there."""


def _dense_grid(top: int) -> list[int]:
    """Every count up to ``DENSE_UP_TO`` (and ``top``), then ``_grid``'s points beyond."""
    return sorted({*range(1, min(top, DENSE_UP_TO) + 1), *_grid(top)})


EMBEDDING_TOKENS = 256
"""The embedding is timed up to this many tokens (a gather, linear in them: its curve's last
line goes on); beyond, a whole forward costs a large model seconds for a small difference."""

CACHE_SCALE = 256 * 2**20
"""Bytes beyond any CPU or GPU cache: the other layers whose weights a timing streams first."""


def extra_layers(layer_bytes: int, num_layers: int, lm_head_bytes: int) -> int:
    """How many more layers the profiling model holds, so that the layers and lm head run
    between two timings of layer 0 stream about what the rest of the model streams in a real
    step, up to ``CACHE_SCALE`` (none if one layer alone is that large)."""
    if layer_bytes >= CACHE_SCALE:
        return 0
    rest = min((num_layers - 1) * layer_bytes + lm_head_bytes, CACHE_SCALE)
    return min(num_layers - 1, -(-rest // layer_bytes))


class OperatorBench:
    """The one-layer model and its inputs at the profiled shapes."""

    def __init__(
        self, cfg: ProfileConfig, device: torch.device, clock: Callable[[], float], tick: Any
    ) -> None:
        full, self.spec = resolve_model(cfg.model, cfg.dtype)
        bytes_ = self.spec.dtype_bytes
        extra = extra_layers(
            self.spec.layer_params * bytes_, full.num_layers, self.spec.lm_head_params * bytes_
        )
        self.config = dataclasses.replace(full, num_layers=1 + extra)
        self.cfg, self.device = cfg, device
        self.dtype = DTYPES[cfg.dtype]
        self.model = Decoder.random(self.config, seed=cfg.seed, dtype=self.dtype, device=device)
        self.bare = _NoAttention(self.config, self.model.weights, self.model.layers)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.max_len = self.config.max_position
        self.max_tokens = min(cfg.max_tokens, 4 * self.max_len)
        per_point = cfg.budget_s / max(points(cfg), 1)
        self.timer = Timer(clock, cfg.budget_s, per_point, tick, self._rest)
        small = self.cache(1, 1)
        self._rest_input = (self.tokens_input(1, small), small, self.randn(1, full.hidden_size))

    def _rest(self) -> None:
        """The other layers (without attention) and the lm head on one token: what a real step
        streams between two runs of one layer's operators (``extra_layers``)."""
        inp, cache, x = self._rest_input
        rope = self.bare.rotary(inp) if self.config.arch == "llama" else None
        for p in self.bare.layers[1:]:
            if rope is not None:
                self.bare._llama_layer(0, p, x, inp, cache, rope)
            else:
                self.bare._gpt2_layer(0, p, x, inp, cache)
        self.model.logits(x)

    def randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=self.gen).to(self.dtype).to(self.device)

    def cache(self, blocks: int, bs: int, cpu_blocks: int = 0, layers: int = 1) -> PagedKVCache:
        c = self.config
        cache = PagedKVCache(
            layers, blocks, bs, c.num_kv_heads, c.head_dim, dtype=self.dtype, device=self.device,
            num_cpu_blocks=cpu_blocks,
        )  # fmt: skip
        for t in (*cache.k_caches, *cache.v_caches):
            t.copy_(torch.randn(t.shape, generator=self.gen).to(self.dtype))
        return cache

    def tokens_input(self, t: int, cache: PagedKVCache) -> ModelInput:
        d = self.device
        return ModelInput(
            token_ids=torch.randint(0, self.config.vocab_size, (t,), generator=self.gen).to(d),
            positions=(torch.arange(t) % self.max_len).to(d),
            slot_mapping=torch.arange(t).to(d),
            block_tables=[],
            context_lens=[],
            query_lens=[],
            logits_indices=torch.zeros(0, dtype=torch.long, device=d),
        )

    # ----- the operators ----------------------------------------------------------------------
    # Each method registers its points with the timer and returns what fits them once the
    # timer has run (``profiler.profile``: every term's points in the same passes). A point's
    # call binds its arguments now (``partial``): a closure over the loop's variables would
    # run every point at the loop's last shape.
    def linear_and_embedding(self) -> Callable[[], tuple[dict[str, Any], dict[str, Any]]]:
        bs = self.cfg.block_sizes[0]
        held = self.config.num_layers
        cache = self.cache(-(-self.max_tokens // bs) + 1, bs, layers=held)
        xs, layers, wholes = [], [], []
        for t in _dense_grid(self.max_tokens):
            inp = self.tokens_input(t, cache)
            x = self.randn(t, self.config.hidden_size) * 0.02
            p = self.bare.layers[0]
            if self.config.arch == "llama":
                rope = self.bare.rotary(inp)
                fn = partial(self.bare._llama_layer, 0, p, x, inp, cache, rope)
            else:
                fn = partial(self.bare._gpt2_layer, 0, p, x, inp, cache)
            xs.append(t)
            layers.append(self.timer(fn, "linear"))
            if t <= EMBEDDING_TOKENS:
                wholes.append(self.timer(partial(self.bare, inp, cache), "embedding"))

        def fit() -> tuple[dict[str, Any], dict[str, Any]]:
            layer_t = [p.value for p in layers]
            embed_t = [max(w.value - held * t, 0.0) for w, t in zip(wholes, layer_t, strict=False)]
            # a gather and a norm, linear in the tokens: a line through the differences of two
            # timings (their noise would otherwise stay in a running maximum)
            return curve(xs, layer_t, monotone=False), line_curve(xs[: len(embed_t)], embed_t)

        return fit

    def lm_head(self) -> Callable[[], dict[str, Any]]:
        xs, ys = [], []
        for s in _dense_grid(self.cfg.max_seqs):
            x = self.randn(s, self.config.hidden_size)
            xs.append(s)
            ys.append(self.timer(partial(self.model.logits, x), "lm_head"))
        return lambda: curve(xs, [p.value for p in ys], monotone=False)

    def attention(self, cache: PagedKVCache, pairs: list[tuple[int, int]], group: str) -> Point:
        """Time ``paged_attention`` on sequences of (query, context) over scattered blocks."""
        bs = cache.block_size
        order = torch.randperm(cache.num_blocks, generator=self.gen).tolist()
        tables, used = [], 0
        for _, ctx in pairs:
            need = -(-ctx // bs)
            tables.append(order[used : used + need])
            used += need
        c = self.config
        q = self.randn(sum(n for n, _ in pairs), c.num_heads, c.head_dim)
        qlens, ctxs = [n for n, _ in pairs], [ctx for _, ctx in pairs]
        k, v = cache.k_caches[0], cache.v_caches[0]
        return self.timer(lambda: paged_attention(q, k, v, tables, ctxs, qlens), group)

    def decode_attention(self, bs: int) -> Callable[[], dict[str, Any]]:
        contexts = [c for c in _grid(self.max_len, 16) if c <= self.max_len]
        wide = max(self.cfg.max_seqs, 8)
        # room for the largest batch: ``wide`` short sequences or 8 of the longest
        cache = self.cache(max(wide * -(-64 // bs), 8 * -(-self.max_len // bs)) + 1, bs)
        rows, points, at_eight = [], [], []
        for c in contexts:
            for n in (2, 8, wide) if c <= 64 else (2, 8):
                # contexts spread over a block's offsets, as a running batch has them
                ctxs = [max(c - i % bs, 1) for i in range(n)]
                t = self.attention(cache, [(1, x) for x in ctxs], f"decode_attention.{bs}")
                rows.append([1.0, float(sum(ctxs)), float(n)])
                points.append(t)
                if n == 8:
                    at_eight.append((sum(ctxs), t))

        def fit() -> dict[str, Any]:
            per_seq = nonnegative_lstsq(rows, [p.value for p in points])[2]
            xs = [x for x, _ in at_eight]
            ys = [t.value - per_seq * 8 for _, t in at_eight]
            return {"context": curve(xs, ys), "per_sequence_s": per_seq}

        return fit

    def prefill_attention(self) -> Callable[[], dict[str, float]]:
        bs = self.cfg.block_sizes[0]
        top = min(self.max_len, self.max_tokens)
        cache = self.cache(4 * -(-self.max_len // bs) + 64 * -(-128 // bs) + 1, bs)
        rows, times = [], []
        batches: list[list[tuple[int, int]]] = []
        for q in [x for x in (16, 64, 256, 1024) if x <= top]:
            for cached in (0, 64, 256, 1024):
                if q + cached <= self.max_len:
                    batches.append([(q, q + cached)])
        ctx = min(128, self.max_len)
        for m in (2, 8, 32):
            batches.append([(min(64, top), min(64, top)), *[(1, ctx)] * m])
        for batch in batches:
            shape = BatchShape.from_chunks((n, c - n) for n, c in batch)
            rows.append([1.0, shape.num_seqs, shape.attn_pairs, shape.kv_read_tokens])
            times.append(self.attention(cache, batch, "prefill_attention"))
        names = ("per_call_s", "per_sequence_s", "per_pair_s", "per_read_token_s")
        return lambda: dict(
            zip(names, nonnegative_lstsq(rows, [p.value for p in times]), strict=True)
        )

    def swap(self, bs: int) -> Callable[[], dict[str, float]]:
        cache = self.cache(65, bs, cpu_blocks=64)
        rows, times = [], []
        for m in (1, 4, 16, 64):
            maps = [SwapMapping(i, i) for i in range(m)]
            rows.append([1.0, float(m)])
            times.append(self.timer(partial(cache.swap_out, maps), f"swap.{bs}"))

        def fit() -> dict[str, float]:
            fixed, per_block = nonnegative_lstsq(rows, [p.value for p in times])
            return {"fixed_s": fixed, "per_block_s": per_block}

        return fit

    def whole_steps(self) -> Callable[[], list[tuple[BatchShape, float]]]:
        """Whole forwards of the profiling model (its layers with attention, the embedding and
        the lm head, as one step runs them) at ``whole_step_tokens``: decode batches over
        contexts near 64 spread over a block's offsets up to ``max_seqs`` sequences, single
        prefills beyond. What they measure less the operators' sum is ``layer_residual``."""
        bs = self.cfg.block_sizes[0]
        c = self.config
        decodes, prefills = whole_step_tokens(self.cfg, self.max_len)
        ctx = min(64, self.max_len - 1)
        per_seq = -(-(ctx + 1) // bs)
        blocks = max(max(decodes, default=0) * per_seq, -(-max(prefills, default=0) // bs)) + 1
        cache = self.cache(blocks, bs, layers=c.num_layers)
        order = torch.randperm(cache.num_blocks, generator=self.gen).tolist()
        d = self.device
        out = []
        for n, decode in [*((n, True) for n in decodes), *((t, False) for t in prefills)]:
            if decode:
                lens = [max(ctx - i % bs, 1) for i in range(n)]  # each sequence's context
                tables = [order[i * per_seq : (i + 1) * per_seq] for i in range(n)]
                positions = [x - 1 for x in lens]
                shape = BatchShape.from_chunks((1, x - 1) for x in lens)
            else:
                lens, tables, positions = [n], [order[: -(-n // bs)]], list(range(n))
                shape = BatchShape.from_chunks([(n, 0)])
            slots = [t[p // bs] * bs + p % bs for t, x in zip(tables, lens, strict=True)
                     for p in (range(x - 1, x) if decode else range(x))]  # fmt: skip
            inp = ModelInput(
                token_ids=torch.randint(0, c.vocab_size, (len(slots),), generator=self.gen).to(d),
                positions=torch.tensor(positions, dtype=torch.long, device=d),
                slot_mapping=torch.tensor(slots, dtype=torch.long, device=d),
                block_tables=tables,
                context_lens=lens,
                query_lens=[1] * n if decode else [n],
                logits_indices=torch.tensor(
                    list(range(n)) if decode else [n - 1], dtype=torch.long, device=d
                ),
            )
            out.append((shape, self.timer(partial(self.model, inp, cache), "whole_steps")))
        return lambda: [(shape, p.value) for shape, p in out]

    def rates(self) -> Callable[[], dict[str, float]]:
        """The roofline's rates, timed in passes of their own once the others are done: their
        128 MiB of streaming left the point after them in the shared passes (the whole decode
        of one sequence) slow even after its lead run: tiny-llama's ``layer_residual`` at one
        token came out +185 to +218 us a layer against +17 to +80 at two, in every profile
        with them in the passes, and flat at one to two tokens with them apart."""
        c = self.config
        src = torch.ones(16 * 2**20, dtype=torch.float32, device=self.device)  # 64 MiB
        dst = torch.empty_like(src)
        t = self.timer
        timer = Timer(t.clock, t.per_point_s * 3, t.per_point_s, lambda total: None, t.flush)
        read = timer(src.sum, "rates")
        copy = timer(lambda: dst.copy_(src), "rates")
        a, b = self.randn(64, c.hidden_size), self.randn(c.hidden_size, c.intermediate_size)
        matmul = timer(lambda: a @ b, "rates")
        flop = 2 * 64 * c.hidden_size * c.intermediate_size

        def fit() -> dict[str, float]:
            timer.run()
            return {
                "matmul_flops": flop / matmul.value,
                "read_bandwidth": src.numel() * 4 / read.value,
                "copy_bandwidth": src.numel() * 4 / copy.value,
            }

        return fit


def whole_step_tokens(cfg: ProfileConfig, max_len: int) -> tuple[list[int], list[int]]:
    """The whole forwards ``whole_steps`` times: decode batches of every size up to
    ``DENSE_UP_TO`` and powers of two up to ``max_seqs`` (as the linear curve is measured),
    then single prefills of powers of two above them up to the largest prefill that fits."""
    decodes = _dense_grid(cfg.max_seqs)
    top = min(max_len, cfg.max_tokens)
    prefills = [t for t in _grid(top) if t > decodes[-1]]
    return decodes, prefills


def points(cfg: ProfileConfig) -> int:
    """How many points the shared passes time (for the progress bar and the per-point
    budget; the rates' passes of their own are not counted)."""
    _, spec = resolve_model(cfg.model, cfg.dtype)
    top = min(cfg.max_tokens, 4 * spec.max_model_len)
    contexts = [c for c in _grid(spec.max_model_len, 16) if c <= spec.max_model_len]
    decode = sum(3 if c <= 64 else 2 for c in contexts)
    q_top = min(spec.max_model_len, top)
    prefill = sum(
        1
        for q in (16, 64, 256, 1024)
        if q <= q_top
        for c in (0, 64, 256, 1024)
        if q + c <= spec.max_model_len
    )
    per_bs = decode + 4  # decode points, swap points
    tokens = _dense_grid(top)
    embedding = sum(t <= EMBEDDING_TOKENS for t in tokens)
    rows = len(_dense_grid(cfg.max_seqs))
    fixed = len(tokens) + embedding + rows + prefill + 3  # and the mixed batches
    whole = sum(len(x) for x in whole_step_tokens(cfg, spec.max_model_len))
    return fixed + whole + per_bs * len(cfg.block_sizes)

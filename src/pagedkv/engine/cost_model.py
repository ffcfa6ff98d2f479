"""Cost models: what one iteration of the serving loop costs, what a swap costs.

A step is summarised by a ``BatchShape``. Two models: ``UnitCost`` (1 tick per step, the course
lesson's step counts) and ``RooflineCost`` (seconds from a GPU x model roofline). Both give the
simulator a closed-form fast-forward over k steps whose shapes grow linearly (a decode-only batch:
each step every sequence's context grows by one): ``window`` sums the step times and
``steps_to_reach`` finds when a duration is used up, in O(1) and O(log k) evaluations.
Recompute has no separate price: it is the prefill step that redoes the tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pagedkv.engine.specs import GPUSpec, ModelSpec, check_tensor_parallel
from pagedkv.errors import ConfigError
from pagedkv.validation import check_int, help_field

_SHAPE_FIELDS = ("num_tokens", "num_seqs", "attn_pairs", "kv_read_tokens")


@dataclass(frozen=True)
class BatchShape:
    """What one step computes, in the four counts a step's cost depends on."""

    num_tokens: int = 0
    """Tokens computed this step: prefill chunks and decodes together."""
    num_seqs: int = 0
    """Sequences with at least one token computed (each gets logits at its last position)."""
    attn_pairs: int = 0
    """Sum over computed tokens of the positions each attends to, itself included."""
    kv_read_tokens: int = 0
    """K/V tokens read: each sequence reads its whole context (cached + new) once."""

    def __post_init__(self) -> None:
        for field in _SHAPE_FIELDS:
            check_int(field, getattr(self, field), 0)

    @classmethod
    def from_chunks(cls, chunks: Iterable[tuple[int, int]]) -> BatchShape:
        """From (num_new_tokens, num_cached_tokens) per sequence.

        n new tokens after c cached ones attend to n*c + n*(n+1)/2 positions (causal) and read
        c + n K/V tokens; a decode is n = 1. Sequences with n = 0 compute nothing and are skipped.
        """
        tokens = seqs = pairs = reads = 0
        for n, c in chunks:
            if n < 0 or c < 0:
                raise ConfigError("chunk", (n, c), "needs num_new_tokens, num_cached_tokens >= 0")
            if n:
                tokens, seqs = tokens + n, seqs + 1
                pairs += n * c + n * (n + 1) // 2
                reads += c + n
        return cls(tokens, seqs, pairs, reads)

    @classmethod
    def decode(cls, num_seqs: int, context: int) -> BatchShape:
        """``num_seqs`` decodes, each after ``context`` cached tokens."""
        return cls(num_seqs, num_seqs, num_seqs * (context + 1), num_seqs * (context + 1))

    @classmethod
    def decode_growth(cls, num_seqs: int) -> BatchShape:
        """The per-step delta of a decode-only batch: each context grows by one token."""
        return cls(0, 0, num_seqs, num_seqs)

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (self.num_tokens, self.num_seqs, self.attn_pairs, self.kv_read_tokens)

    def __add__(self, other: BatchShape) -> BatchShape:
        return BatchShape(*(a + b for a, b in zip(self.as_tuple(), other.as_tuple(), strict=True)))

    def __mul__(self, k: int) -> BatchShape:
        return BatchShape(*(a * k for a in self.as_tuple()))

    __rmul__ = __mul__


@runtime_checkable
class CostModel(Protocol):
    """Prices steps and swaps. Step ``i`` of a window has shape ``base + i * delta``."""

    def step_time(self, shape: BatchShape) -> float:
        """Duration of one step (seconds; ticks for the unit model)."""
        ...

    def swap_time(self, num_blocks: int) -> float:
        """Duration of moving ``num_blocks`` blocks between GPU and CPU (one direction)."""
        ...

    def window(self, base: BatchShape, delta: BatchShape, k: int) -> tuple[float, float]:
        """(sum of d_i, sum of i * d_i) over steps i = 0..k-1, in closed form."""
        ...

    def steps_to_reach(self, base: BatchShape, delta: BatchShape, duration: float) -> int:
        """The smallest k >= 0 with sum_{i<k} d_i >= duration."""
        ...

    def curve(self, base: BatchShape, delta: BatchShape) -> WindowCurve:
        """The window's step-time lines, for many cheap prefix sums (fast-forward)."""
        ...


def _check_duration(duration: float) -> float:
    if isinstance(duration, bool) or not isinstance(duration, (int, float)):
        raise ConfigError("duration", duration, "must be a finite number")
    if not math.isfinite(duration):
        raise ConfigError("duration", duration, "must be a finite number")
    return float(duration)


def search_steps(total: Callable[[int], float], duration: float) -> int:
    """Smallest k >= 0 with total(k) >= duration, for a nondecreasing total with total(0) = 0.

    Exponential search for an upper bound, then bisection: O(log k) calls of ``total``.
    """
    if _check_duration(duration) <= 0:
        return 0
    lo, hi = 0, 1  # invariant: total(lo) < duration
    while total(hi) < duration:
        lo, hi = hi, 2 * hi
        if hi > 2**62:
            raise ConfigError("duration", duration, "is never reached: the steps cost nothing")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if total(mid) >= duration else (mid, hi)
    return hi


def _power_sums(lo: int, hi: int) -> tuple[int, int, int]:
    """(count, sum of i, sum of i^2) over i in [lo, hi), exactly."""

    def s1(n: int) -> int:
        return n * (n - 1) // 2

    def s2(n: int) -> int:
        return (n - 1) * n * (2 * n - 1) // 6

    return hi - lo, s1(hi) - s1(lo), s2(hi) - s2(lo)


def linear_window(a: float, b: float, lo: int, hi: int) -> tuple[float, float]:
    """(sum of a + b*i, sum of i * (a + b*i)) over i in [lo, hi)."""
    n, s1, s2 = _power_sums(lo, hi)
    return n * a + b * s1, a * s1 + b * s2


def max_linear_window(
    f: tuple[float, float], g: tuple[float, float], k: int
) -> tuple[float, float]:
    """The window sums of max(f0 + f1*i, g0 + g1*i) over i in [0, k).

    The difference of two linear functions changes sign at most once, so the range splits into
    at most two pieces, each a linear window.
    """
    if k <= 0:
        return 0.0, 0.0
    d0, d1 = f[0] - g[0], f[1] - g[1]

    def f_wins(i: int) -> bool:
        return d0 + d1 * i >= 0

    first = f_wins(0)
    split = k
    if f_wins(k - 1) != first:  # one switch, in (0, k-1]: estimate it, then settle rounding
        root = -d0 / d1
        split = min(max(math.floor(root) + 1 if first else math.ceil(root), 1), k - 1)
        while split > 1 and f_wins(split - 1) != first:
            split -= 1
        while split < k and f_wins(split) == first:
            split += 1
    a, b = (f, g) if first else (g, f)
    head = linear_window(a[0], a[1], 0, split)
    tail = linear_window(b[0], b[1], split, k)
    return head[0] + tail[0], head[1] + tail[1]


class WindowCurve:
    """Step times d_j = max(f0 + f1*j, g0 + g1*j) + e0 + e1*j of one window (j = 0, 1, ...),
    with the lines worked out once so that many prefix sums cost a few float operations each.
    """

    __slots__ = ("e", "f", "g")

    def __init__(
        self, f: tuple[float, float], g: tuple[float, float], e: tuple[float, float]
    ) -> None:
        self.f, self.g, self.e = f, g, e

    def sums(self, k: int) -> tuple[float, float]:
        """(sum of d_j, sum of j * d_j) over j in [0, k)."""
        if k <= 0:
            return 0.0, 0.0
        peak = max_linear_window(self.f, self.g, k)
        extra = linear_window(self.e[0], self.e[1], 0, k)
        return peak[0] + extra[0], peak[1] + extra[1]

    def steps_to_reach(self, duration: float) -> int:
        """Smallest k >= 0 with sum_{j<k} d_j >= duration."""
        return search_steps(lambda k: self.sums(k)[0], duration)


class UnitCost:
    """Every step costs 1 tick, swaps nothing: the course lesson's clock counts iterations."""

    def step_time(self, shape: BatchShape) -> float:
        return 1.0

    def swap_time(self, num_blocks: int) -> float:
        check_int("num_blocks", num_blocks, 0)
        return 0.0

    def window(self, base: BatchShape, delta: BatchShape, k: int) -> tuple[float, float]:
        check_int("k", k, 0)
        return float(k), float(k * (k - 1) // 2)

    def steps_to_reach(self, base: BatchShape, delta: BatchShape, duration: float) -> int:
        return max(0, math.ceil(_check_duration(duration)))

    def curve(self, base: BatchShape, delta: BatchShape) -> WindowCurve:
        return WindowCurve((0.0, 0.0), (0.0, 0.0), (1.0, 0.0))


def _check_efficiency(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ConfigError(field, value, "must be a number in (0, 1]")
    return float(value)


def _check_seconds(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, value, "must be a finite number of seconds >= 0")
    if not (math.isfinite(value) and value >= 0):
        raise ConfigError(field, value, "must be a finite number of seconds >= 0")
    return float(value)


@dataclass(frozen=True)
class RooflineConfig:
    """The roofline's constants: what fraction of the datasheet peaks a serving engine reaches."""

    compute_efficiency: float = help_field(
        0.6,
        "Fraction of peak FLOP/s reached, in (0, 1]. Large cuBLAS GEMMs reach 70-80% on A100; "
        "end-to-end prefill with attention, norms and launches is nearer 50-60%.",
    )
    memory_efficiency: float = help_field(
        0.8,
        "Fraction of peak memory bandwidth reached, in (0, 1]. Streaming kernels reach 80-90% "
        "of HBM peak; decode GEMVs and paged attention somewhat less.",
    )
    step_overhead_s: float = help_field(
        2e-3,
        "Fixed seconds per step (>= 0): CPU time for scheduling, input preparation, sampling "
        "and kernel launches, not overlapped with the GPU (a few ms per step in vLLM v0).",
    )
    pcie_efficiency: float = help_field(
        0.8,
        "Fraction of one-way PCIe bandwidth a pinned-memory copy reaches, in (0, 1] "
        "(about 25 of 32 GB/s on PCIe 4.0 x16).",
    )
    swap_block_overhead_s: float = help_field(
        1e-5,
        "Fixed seconds per swapped block (>= 0): vLLM issues a copy per block per layer, so "
        "small blocks swap slowly (vLLM paper, Sec. 7.2); an order-of-magnitude guess.",
    )
    block_size: int = help_field(16, "Token slots per block (>= 1), for a block's bytes.")
    interconnect_efficiency: float = help_field(
        0.75,
        "Fraction of one-way NVLink/PCIe bandwidth a ring all-reduce reaches, in (0, 1] "
        "(nccl-tests bus bandwidth is about 230 of 300 GB/s on DGX A100).",
    )
    allreduce_latency_s: float = help_field(
        1e-5,
        "Fixed seconds per all-reduce (>= 0) under tensor parallelism; two per layer per step.",
    )

    def __post_init__(self) -> None:
        for field in ("compute_efficiency", "memory_efficiency"):
            _check_efficiency(field, getattr(self, field))
        for field in ("pcie_efficiency", "interconnect_efficiency"):
            _check_efficiency(field, getattr(self, field))
        for field in ("step_overhead_s", "swap_block_overhead_s", "allreduce_latency_s"):
            _check_seconds(field, getattr(self, field))
        check_int("block_size", self.block_size, 1)


@dataclass(frozen=True)
class _Linear:
    """const + coef . (num_tokens, num_seqs, attn_pairs, kv_read_tokens)."""

    const: float
    coef: tuple[float, float, float, float]

    def at(self, shape: BatchShape) -> float:
        return self.const + self.slope(shape)

    def slope(self, shape: BatchShape) -> float:
        return sum(c * x for c, x in zip(self.coef, shape.as_tuple(), strict=True))


class RooflineCost:
    """Step time = max(compute, memory) + overhead (+ all-reduces), per GPU of a tp group.

    Per step, on one GPU (everything divided by tp, as heads and weight matrices are split):

    * FLOPs = 2 x non-embedding params x num_tokens (every token through every matrix)
      + 2 x vocab x hidden x num_seqs (the lm head on each sequence's last position; vLLM
      computes these logits even for a partial prefill chunk)
      + 4 x layers x heads x head_dim x attn_pairs (QK^T and AV, 2 FLOPs per multiply-add);
    * bytes = weights streamed once (non-embedding params + lm head; the embedding table is only
      gathered) + K/V per token per GPU x (kv_read_tokens + num_tokens written);
    * with tp > 1: two ring all-reduces of num_tokens x hidden per layer, each moving
      2 (tp-1)/tp of its bytes over the GPU link, plus a fixed latency, not overlapped.

    An empty shape still pays the weights and the overhead; the engine never runs one.
    """

    def __init__(
        self,
        gpu: GPUSpec,
        model: ModelSpec,
        tensor_parallel_size: int = 1,
        config: RooflineConfig | None = None,
    ) -> None:
        self.gpu, self.model = gpu, model
        self.tensor_parallel_size = tp = check_tensor_parallel(model, tensor_parallel_size)
        self.config = cfg = RooflineConfig() if config is None else config
        flop_s = gpu.bf16_flops * cfg.compute_efficiency * tp
        byte_s = gpu.mem_bandwidth * cfg.memory_efficiency
        attn_flops = 4 * model.num_layers * model.num_heads * model.head_dim
        self._compute = _Linear(
            0.0,
            (
                2 * model.non_embedding_params / flop_s,
                2 * model.lm_head_params / flop_s,
                attn_flops / flop_s,
                0.0,
            ),
        )
        weights = (model.non_embedding_params + model.lm_head_params) * model.dtype_bytes / tp
        kv = model.kv_bytes_per_token_per_gpu(tp)
        self._memory = _Linear(weights / byte_s, (kv / byte_s, 0.0, 0.0, kv / byte_s))
        allreduces = 2 * model.num_layers if tp > 1 else 0
        ring_bytes = 2 * (tp - 1) / tp * model.hidden_size * model.dtype_bytes
        link = gpu.peer_bandwidth * cfg.interconnect_efficiency
        self._extra = _Linear(
            cfg.step_overhead_s + allreduces * cfg.allreduce_latency_s,
            (allreduces * ring_bytes / link, 0.0, 0.0, 0.0),
        )
        self.block_bytes_per_gpu = cfg.block_size * kv
        self._swap_per_block = (
            self.block_bytes_per_gpu / (gpu.pcie_bandwidth * cfg.pcie_efficiency)
            + cfg.swap_block_overhead_s
        )

    def compute_time(self, shape: BatchShape) -> float:
        """FLOPs / (peak x compute_efficiency)."""
        return self._compute.at(shape)

    def memory_time(self, shape: BatchShape) -> float:
        """Bytes / (bandwidth x memory_efficiency)."""
        return self._memory.at(shape)

    def step_time(self, shape: BatchShape) -> float:
        return max(self._compute.at(shape), self._memory.at(shape)) + self._extra.at(shape)

    def swap_time(self, num_blocks: int) -> float:
        """Blocks x (a block's bytes on one GPU / effective PCIe + per-block overhead).

        Each GPU swaps its own share of every block over its own link, in parallel.
        """
        return check_int("num_blocks", num_blocks, 0) * self._swap_per_block

    def window(self, base: BatchShape, delta: BatchShape, k: int) -> tuple[float, float]:
        check_int("k", k, 0)
        c, m, e = self._compute, self._memory, self._extra
        peak = max_linear_window((c.at(base), c.slope(delta)), (m.at(base), m.slope(delta)), k)
        extra = linear_window(e.at(base), e.slope(delta), 0, k)
        return peak[0] + extra[0], peak[1] + extra[1]

    def steps_to_reach(self, base: BatchShape, delta: BatchShape, duration: float) -> int:
        return self.curve(base, delta).steps_to_reach(duration)

    def curve(self, base: BatchShape, delta: BatchShape) -> WindowCurve:
        c, m, e = self._compute, self._memory, self._extra
        return WindowCurve(
            (c.at(base), c.slope(delta)), (m.at(base), m.slope(delta)), (e.at(base), e.slope(delta))
        )

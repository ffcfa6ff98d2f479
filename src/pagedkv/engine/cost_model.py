"""Cost models: what one iteration of the serving loop costs, what a swap costs.

A step is summarised by a ``BatchShape`` (``batch_shape.py``). Two models: ``UnitCost`` (one
second per step: the course lesson's step counts) and ``RooflineCost`` (seconds from a GPU x
model roofline). Both give the fast-forward the step times of a window of decode rounds as
integer lines (``windows.WindowCurve``), so its sums are closed forms. Recompute has no
separate price: it is the prefill step that redoes the tokens.

Prices are integer ticks (``clock.py``): each line's coefficients (per token, sequence, pair,
K/V token read, and the constant) are quantised to ticks once, at construction, so a step's
price is an exact integer and every window sum is an exact integer series. ``step_time`` and
``swap_time`` read them as seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pagedkv.engine.batch_shape import BatchShape
from pagedkv.engine.clock import TICKS_PER_SECOND, to_seconds, to_ticks
from pagedkv.engine.windows import StepCurve, WindowCurve
from pagedkv.memory.config import MAX_BLOCK_SIZE
from pagedkv.models.gpus import GPUSpec
from pagedkv.models.models import ModelSpec, check_tensor_parallel
from pagedkv.validation import check_bounds, check_int, float_field, int_field


@runtime_checkable
class CostModel(Protocol):
    """Prices steps and swaps. Step ``i`` of a window has shape ``base + i * delta``.

    Units: the engine's clock counts integer ticks (``clock.TICKS_PER_SECOND`` a second; the
    unit model's step is one second). ``step_ticks``, ``swap_ticks``, the window sums, the
    curves' lines and ``steps_to_reach``'s duration are exact ints of ticks: a window's sums
    must equal adding its steps' ``step_ticks`` one by one (the fast path and the reference
    loop then agree to the bit). A model defines ``step_ticks``, ``swap_ticks`` and ``curve``;
    a class that subclasses the protocol inherits the rest (``decode_curve`` may be
    overridden with a faster way to the same lines)."""

    def step_ticks(self, shape: BatchShape) -> int:
        """Duration of one step, in ticks."""
        ...

    def swap_ticks(self, num_blocks: int) -> int:
        """Duration of moving ``num_blocks`` blocks between GPU and CPU (one direction), in
        ticks."""
        ...

    def curve(self, base: BatchShape, delta: BatchShape) -> StepCurve:
        """The window's step-time lines, for many cheap prefix sums (fast-forward)."""
        ...

    def step_time(self, shape: BatchShape) -> float:
        """``step_ticks`` in seconds."""
        return to_seconds(self.step_ticks(shape))

    def swap_time(self, num_blocks: int) -> float:
        """``swap_ticks`` in seconds."""
        return to_seconds(self.swap_ticks(num_blocks))

    def window(self, base: BatchShape, delta: BatchShape, k: int) -> tuple[int, int]:
        """(sum of d_i, sum of i * d_i) over steps i = 0..k-1 (ticks), in closed form."""
        return self.curve(base, delta).sums(check_int("k", k, 0))

    def steps_to_reach(self, base: BatchShape, delta: BatchShape, duration: int) -> int:
        """The smallest k >= 0 with sum_{i<k} d_i >= duration (ticks)."""
        return self.curve(base, delta).steps_to_reach(duration)

    def decode_curve(self, num_seqs: int, context: int) -> StepCurve:
        """``curve`` of decode rounds of ``num_seqs`` sequences that hold ``context`` tokens
        in all: base ``BatchShape(n, n, context + n, context + n)``, delta
        ``BatchShape.decode_growth(n)`` (the fast-forward's one kind of window)."""
        n, read = num_seqs, context + num_seqs
        return self.curve(BatchShape(n, n, read, read), BatchShape.decode_growth(n))


class UnitCost(CostModel):
    """Every step costs one second, swaps nothing: the course lesson's clock counts
    iterations."""

    def step_ticks(self, shape: BatchShape) -> int:
        return TICKS_PER_SECOND

    def swap_ticks(self, num_blocks: int) -> int:
        check_int("num_blocks", num_blocks, 0)
        return 0

    def curve(self, base: BatchShape, delta: BatchShape) -> WindowCurve:
        return _UNIT_CURVE

    def decode_curve(self, num_seqs: int, context: int) -> WindowCurve:
        return _UNIT_CURVE  # (one curve for every window: it is never changed)


_UNIT_CURVE = WindowCurve(0, 0, 0, 0, TICKS_PER_SECOND, 0)


MAX_SECONDS = 3600.0
"""A fixed cost per step, block or all-reduce: anything up to an hour is a finite clock."""
KERNEL_REFERENCE_BLOCK = 16
"""The block size at which the paged kernel's overhead was measured (vLLM paper, Fig. 18a)."""


def expected_blocks(num_seqs: int, kv_read_tokens: int, block_size: int) -> float:
    """Blocks that ``num_seqs`` sequences holding ``kv_read_tokens`` tokens touch, on average:
    ceil(c / B) = (c + (B - 1) - ((c - 1) mod B)) / B for c >= 1, and (c - 1) mod B averages
    (B - 1) / 2 over where a sequence's last block is cut, so R / B + S (B - 1) / (2B)."""
    b = block_size
    return kv_read_tokens / b + num_seqs * (b - 1) / (2 * b)


@dataclass(frozen=True)
class RooflineConfig:
    """The roofline's constants: what fraction of the datasheet peaks a serving engine reaches."""

    compute_efficiency: float = float_field(
        0.6,
        "Fraction of peak FLOP/s reached. Large cuBLAS GEMMs reach 70-80% on A100; "
        "end-to-end prefill with attention, norms and launches is nearer 50-60%.",
        0.0,
        1.0,
        lo_open=True,
    )
    memory_efficiency: float = float_field(
        0.8,
        "Fraction of peak memory bandwidth reached. Streaming kernels reach 80-90% "
        "of HBM peak; decode GEMVs and paged attention somewhat less.",
        0.0,
        1.0,
        lo_open=True,
    )
    step_overhead_s: float = float_field(
        2e-3,
        "Fixed seconds per step: CPU time for scheduling, input preparation, sampling "
        "and kernel launches, not overlapped with the GPU (a few ms per step in vLLM v0).",
        0.0,
        MAX_SECONDS,
    )
    pcie_efficiency: float = float_field(
        0.8,
        "Fraction of one-way PCIe bandwidth a pinned-memory copy reaches "
        "(about 25 of 32 GB/s on PCIe 4.0 x16).",
        0.0,
        1.0,
        lo_open=True,
    )
    swap_copy_overhead_s: float = float_field(
        6e-6,
        "Fixed seconds per host-device copy of a swap: vLLM swaps a block as one copy of K and "
        "one of V per layer (2 x layers copies per block), each a cudaMemcpyAsync of 5-7 us "
        "for small chunks (Wu et al., DualPath, arXiv 2602.21548, Sec. 5.2).",
        0.0,
        MAX_SECONDS,
    )
    paged_block_overhead: float = float_field(
        0.23,
        "Extra attention time per K/V block read, as a fraction of the time to read a "
        "16-token block's K/V: the paged kernel is 20-26% slower than FasterTransformer's "
        "contiguous one at block size 16 (vLLM paper, Sec. 7.1, Fig. 18a), the block-table "
        "indirection, paid per block, so small blocks pay more per token.",
        0.0,
        100.0,
    )
    per_sequence_s: float = float_field(
        7.5e-6,
        "Seconds per sequence per step on the host (input preparation, sampling): this "
        "project's executor measured 7.5 us (pagedkv profile, tiny-llama, one CPU thread, "
        "2026-12-01; the built-in profiles' per_sequence_s).",
        0.0,
        MAX_SECONDS,
    )
    block_size: int = int_field(
        16, "Token slots per block, for a block's bytes.", 1, MAX_BLOCK_SIZE
    )
    interconnect_efficiency: float = float_field(
        0.75,
        "Fraction of one-way NVLink/PCIe bandwidth a ring all-reduce reaches "
        "(nccl-tests bus bandwidth is about 230 of 300 GB/s on DGX A100).",
        0.0,
        1.0,
        lo_open=True,
    )
    allreduce_latency_s: float = float_field(
        1e-5,
        "Fixed seconds per all-reduce under tensor parallelism; two per layer per step.",
        0.0,
        MAX_SECONDS,
    )

    def __post_init__(self) -> None:
        check_bounds(self)


@dataclass(frozen=True)
class _Linear:
    """const + coef . (num_tokens, num_seqs, attn_pairs, kv_read_tokens), in ticks."""

    const: int
    coef: tuple[int, int, int, int]

    @classmethod
    def of_seconds(cls, const: float, coef: tuple[float, float, float, float]) -> _Linear:
        """The line with each coefficient (seconds) quantised to ticks once."""
        a, b, c, d = coef
        return cls(to_ticks(const), (to_ticks(a), to_ticks(b), to_ticks(c), to_ticks(d)))

    def at(self, shape: BatchShape) -> int:
        return self.const + self.slope(shape)

    def slope(self, shape: BatchShape) -> int:
        c = self.coef  # spelled out: called for every window, a generator costs 3x
        return (
            c[0] * shape.num_tokens
            + c[1] * shape.num_seqs
            + c[2] * shape.attn_pairs
            + c[3] * shape.kv_read_tokens
        )


class RooflineCost(CostModel):
    """Step time = max(compute, memory) + overhead (+ all-reduces), per GPU of a tp group.

    Per step, on one GPU (everything divided by tp, as heads and weight matrices are split):

    * FLOPs = 2 x active non-embedding params x num_tokens (every token through every matrix;
      of a mixture of experts only the experts it is routed to)
      + 2 x vocab x hidden x num_seqs (the lm head on each sequence's last position; vLLM
      computes these logits even for a partial prefill chunk)
      + 4 x layers x heads x head_dim x attn_pairs (QK^T and AV, 2 FLOPs per multiply-add;
      multi-head latent attention: ``MLASpec.flops_per_pair``);
    * bytes = weights streamed once (non-embedding params + lm head; the embedding table is only
      gathered; every expert, as a batch of a few tokens already routes to most of them)
      + K/V per token per GPU x (kv_read_tokens + num_tokens written), in the KV cache dtype;
    * the paged kernel's per-block cost on the memory side: ``paged_block_overhead`` x the
      time to read a 16-token block, per K/V block read, averaged over where each sequence's
      last block is cut (``expected_blocks``): linear in the counts (docs/clock.md);
    * with tp > 1: two ring all-reduces of num_tokens x hidden per layer, each moving
      2 (tp-1)/tp of its bytes over the GPU link, plus a fixed latency, not overlapped;
    * on the host, not overlapped: ``step_overhead_s`` per step and ``per_sequence_s`` per
      sequence (input preparation, sampling).

    Sliding-window layers attend to at most their window: ``windowed_step_time`` takes their
    counts apart (``sliding.py``); ``step_time`` prices them as full layers, exact while no
    sequence is longer than the window.

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
        attn_flops = model.num_layers * model.attention_flops_per_pair_per_layer
        self._compute = _Linear.of_seconds(
            0.0,
            (
                2 * model.active_non_embedding_params / flop_s,
                2 * model.lm_head_params / flop_s,
                attn_flops / flop_s,
                0.0,
            ),
        )
        weights = (model.non_embedding_params + model.lm_head_params) * model.dtype_bytes / tp
        kv = model.kv_bytes_per_token_per_gpu(tp)
        bs = cfg.block_size
        block = cfg.paged_block_overhead * KERNEL_REFERENCE_BLOCK * kv / byte_s
        self.block_overhead_s = block  # seconds per K/V block read, all layers, one GPU
        self._memory = _Linear.of_seconds(
            weights / byte_s,
            (kv / byte_s, block * (bs - 1) / (2 * bs), 0.0, kv / byte_s + block / bs),
        )
        sliding = model.num_sliding_layers  # their share of the attention and K/V read terms
        self._sliding_attn = to_ticks(sliding * model.attention_flops_per_pair_per_layer / flop_s)
        read = 1 + cfg.paged_block_overhead * KERNEL_REFERENCE_BLOCK / bs  # bytes + blocks
        self._sliding_read = to_ticks(
            sliding * model.kv_bytes_per_layer_per_gpu(tp) / byte_s * read
        )
        allreduces = 2 * model.num_layers if tp > 1 else 0
        ring_bytes = 2 * (tp - 1) / tp * model.hidden_size * model.dtype_bytes
        link = gpu.peer_bandwidth * cfg.interconnect_efficiency
        self._extra = _Linear.of_seconds(
            cfg.step_overhead_s + allreduces * cfg.allreduce_latency_s,
            (allreduces * ring_bytes / link, cfg.per_sequence_s, 0.0, 0.0),
        )
        # decode_curve's terms: a decode's tokens, sequences and pairs are n, n and its reads
        # (the coefficients that are 0 by construction left out; integers: regrouped exactly).
        c0, c1, c2, _ = self._compute.coef
        m0, m1, _, m3 = self._memory.coef
        e0, e1, _, _ = self._extra.coef
        self._decode_terms = (
            c0 + c1,
            c2,
            self._memory.const,
            m0 + m1,
            m3,
            self._extra.const,
            e0 + e1,
        )
        self.block_bytes_per_gpu = bs * kv
        self._swap_per_block = to_ticks(
            self.block_bytes_per_gpu / (gpu.pcie_bandwidth * cfg.pcie_efficiency)
            + 2 * model.num_layers * cfg.swap_copy_overhead_s
        )

    def compute_time(self, shape: BatchShape) -> float:
        """FLOPs / (peak x compute_efficiency), seconds."""
        return to_seconds(self._compute.at(shape))

    def memory_time(self, shape: BatchShape) -> float:
        """Bytes / (bandwidth x memory_efficiency), seconds."""
        return to_seconds(self._memory.at(shape))

    def step_ticks(self, shape: BatchShape) -> int:
        return max(self._compute.at(shape), self._memory.at(shape)) + self._extra.at(shape)

    def windowed_step_ticks(self, shape: BatchShape, windowed: BatchShape) -> int:
        """``step_ticks`` with the sliding-window layers' attention pairs and K/V reads taken
        from ``windowed`` (the counts clipped at the window) instead of ``shape``."""
        compute = self._compute.at(shape)
        compute -= self._sliding_attn * (shape.attn_pairs - windowed.attn_pairs)
        memory = self._memory.at(shape)
        memory -= self._sliding_read * (shape.kv_read_tokens - windowed.kv_read_tokens)
        return max(compute, memory) + self._extra.at(shape)

    def windowed_step_time(self, shape: BatchShape, windowed: BatchShape) -> float:
        """``windowed_step_ticks`` in seconds."""
        return to_seconds(self.windowed_step_ticks(shape, windowed))

    def swap_ticks(self, num_blocks: int) -> int:
        """Blocks x (a block's bytes on one GPU / effective PCIe + 2 x layers copy overheads:
        one copy of K and one of V per layer). Each GPU swaps its own share of every block over
        its own link, in parallel."""
        return check_int("num_blocks", num_blocks, 0) * self._swap_per_block

    def curve(self, base: BatchShape, delta: BatchShape) -> WindowCurve:
        c, m, e = self._compute, self._memory, self._extra
        return WindowCurve(
            c.at(base), c.slope(delta), m.at(base), m.slope(delta), e.at(base), e.slope(delta)
        )

    def decode_curve(self, num_seqs: int, context: int) -> WindowCurve:
        # n decodes reading ``read`` K/V tokens: at(BatchShape(n, n, read, read)) and
        # slope(BatchShape(0, 0, n, n)) of each line (exact integers: any order).
        n, read = num_seqs, context + num_seqs
        per_seq, per_pair, mem, mem_seq, per_read, extra, extra_seq = self._decode_terms
        return WindowCurve(
            per_seq * n + per_pair * read,
            per_pair * n,
            mem + mem_seq * n + per_read * read,
            per_read * n,
            extra + extra_seq * n,
            0,
        )

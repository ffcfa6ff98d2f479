"""Derive the built-in GPU profiles from public operator measurements (run once, by hand).

``python -m pagedkv.profiles.derive VIDUR_CHECKOUT COMMIT`` reads the per-operator medians that
the Vidur project publishes (microsoft/vidur, ``data/profiling/compute/{a100,h100}/<model>/
mlp.csv``: milliseconds per operator of one layer against the batched tokens, at tensor
parallelism 1) and writes one ``pagedkv-profile`` file per GPU preset and preset model into
this package. What was measured and what was derived, and how, is written into each file's
``source``; nothing of Vidur's is copied into the package but the numbers fitted from it.

* ``linear`` (one layer without attention): the sum of Vidur's norms, QKV, RoPE, output
  projection, MLP up / activation / down and the two residual adds, at 13 token counts. A model
  Vidur did not profile takes each GEMM from the profiled layer with the closest shapes, scaled
  by the ratio of the GEMM's weights (the time of a GEMM with the same token count: weight
  streaming below the knee, FLOPs above it, both proportional to the weights); element-wise
  operators scale with their widths. OPT has no RoPE and adds learned positions (x 2 embedding).
* ``lm_head``: no Vidur measurement; the GEMM time of the profiled MLP up projection at as many
  rows, scaled by vocab x hidden over its weights.
* attention, swap and the host terms: no published measurement was available to us (Vidur's
  ``attention.csv`` files are Git LFS objects, absent from the snapshot read, and Vidur times the
  paged kernel at block size 16 only): the roofline's terms (``RooflineConfig``), written out per
  block size.
* A100-40GB: Vidur's ``a100`` is an A100-80GB (its QKV GEMM at 1 token streams 1.54 TB/s, more
  than the 40GB's 1.555 TB/s peak allows at any realistic efficiency); the 40GB's operators are
  the 80GB's, each at least its one-token (weight-streaming) time x the bandwidth ratio.
"""

from __future__ import annotations

import csv
import statistics
import sys
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from pagedkv.engine.cost_model import KERNEL_REFERENCE_BLOCK, RooflineConfig
from pagedkv.engine.profile import (
    SHAPE_FIELDS,
    Curve,
    DecodeAttention,
    DeviceRates,
    PrefillAttention,
    Profile,
    SwapCost,
)
from pagedkv.models.gpus import GPUS, GPUSpec
from pagedkv.models.models import MODELS, Architecture, ModelSpec

HERE = Path(__file__).parent
REPOSITORY = "microsoft/vidur"
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CONTEXT_END = 1 << 24  # the decode curve is one line; its second point only fixes the slope

GPU_DIRS = {"A100-40GB": "a100", "A100-80GB": "a100", "H100-SXM": "h100"}
"""Each GPU preset and the Vidur SKU directory measured on it (Vidur's h100 is an SXM DGX)."""

SOURCES: dict[str, tuple[str, ...]] = {
    # preset model -> Vidur models to take its layer from, first one present on that SKU
    "Llama-2-7B": ("meta-llama/Llama-2-7b-hf",),
    "Llama-2-13B": ("internlm/internlm-20b",),  # the same layer: 5120 hidden, 40 heads, 13824
    "Llama-2-70B": ("meta-llama/Llama-2-70b-hf",),
    "Llama-3-8B": ("meta-llama/Meta-Llama-3-8B", "meta-llama/Llama-2-7b-hf"),
    "Mistral-7B": ("meta-llama/Meta-Llama-3-8B", "meta-llama/Llama-2-7b-hf"),  # Llama-3's layer
    "OPT-13B": ("internlm/internlm-20b",),  # 5120 hidden, 40 heads: attention GEMMs the same
    "OPT-66B": ("Qwen/Qwen-72B",),  # the closest full-attention layer (8192 hidden)
    "OPT-175B": ("Qwen/Qwen-72B",),  # extrapolated 2.25x in weights: no larger layer measured
}
OPS = (
    "emb",
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)


@dataclass(frozen=True)
class Layer:
    """The shapes of one measured (or wanted) layer."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    gated: bool
    rope: bool

    def scale(self, source: Layer) -> dict[str, float]:
        """Operator time ratios self / source at the same token count."""

        def qkv(x: Layer) -> int:
            return x.hidden * (x.heads + 2 * x.kv_heads) * x.head_dim

        def up(x: Layer) -> int:
            return x.hidden * x.ffn * (2 if x.gated else 1)

        width = self.hidden / source.hidden
        return {
            "emb": width,
            "input_layernorm": width,
            "attn_pre_proj": qkv(self) / qkv(source),
            "attn_rope": (
                (self.heads + self.kv_heads)
                * self.head_dim
                / (source.heads + source.kv_heads)
                / source.head_dim
                if self.rope
                else 0.0
            ),
            "attn_post_proj": self.hidden
            * self.heads
            * self.head_dim
            / (source.hidden * source.heads * source.head_dim),
            "post_attention_layernorm": width,
            "mlp_up_proj": up(self) / up(source),
            "mlp_act": up(self) / up(source) * source.hidden / self.hidden,
            "mlp_down_proj": self.ffn * self.hidden / (source.ffn * source.hidden),
            "add": width,
        }


def layer_of(model: ModelSpec) -> Layer:
    llama = model.architecture is Architecture.LLAMA
    return Layer(
        model.hidden_size,
        model.num_heads,
        model.num_kv_heads,
        model.head_dim,
        model.intermediate_size,
        gated=llama,
        rope=llama,
    )


def read_vidur(path: Path) -> tuple[Layer, dict[str, dict[int, float]]]:
    """The layer's shapes and each operator's median seconds by token count (tp = 1)."""
    rows = [r for r in csv.DictReader(path.open()) if r["num_tensor_parallel_workers"] == "1"]
    r = rows[0]
    hidden, heads = int(r["n_embd"]), int(r["n_head"])
    layer = Layer(
        hidden,
        heads,
        int(r["n_kv_head"]),
        hidden // heads,
        int(r["n_expanded_embd"]),
        r["use_gated_mlp"] == "True",
        rope=True,
    )
    times: dict[str, dict[int, list[float]]] = {op: {} for op in OPS}
    for row in rows:
        t = int(row["num_tokens"])
        for op in OPS:
            times[op].setdefault(t, []).append(float(row[f"time_stats.{op}.median"]) * 1e-3)
    return layer, {op: {t: statistics.median(v) for t, v in by.items()} for op, by in times.items()}


def curve(ys: list[float]) -> Curve:
    """Through (0, y at 1 token) and the TOKENS points, made nondecreasing (a running max:
    a median a few percent below its neighbour is noise, not a faster GEMM)."""
    out, top = [], 0.0
    for y in [ys[0], *ys]:
        top = max(top, y)
        out.append(top)
    return Curve((0, *TOKENS), tuple(out)).check("curve")


def derive(gpu: GPUSpec, model: ModelSpec, vidur: Path, commit: str) -> Profile:
    sku = GPU_DIRS[gpu.name]
    name = next(s for s in SOURCES[model.name] if (vidur / _csv(sku, s)).exists())
    source_layer, times = read_vidur(vidur / _csv(sku, name))
    ratio = layer_of(model).scale(source_layer)
    slow = GPUS["A100-80GB"].mem_bandwidth / gpu.mem_bandwidth if gpu.name == "A100-40GB" else 1

    def op(o: str, t: int) -> float:
        return max(times[o][t], times[o][1] * slow) * ratio[o]

    layer_ops = [o for o in OPS if o != "emb"]
    linear = [sum(op(o, t) * (2 if o == "add" else 1) for o in layer_ops) for t in TOKENS]
    positions = 2 if model.architecture is Architecture.OPT else 1
    embedding = [op("emb", t) * positions for t in TOKENS]
    head = model.vocab_size * model.hidden_size / (source_layer.hidden * source_layer.ffn * 2)
    if not source_layer.gated:
        head *= 2
    lm_head = [
        (max(times["mlp_up_proj"][t], times["mlp_up_proj"][1] * slow) * head)
        + op("input_layernorm", t)
        for t in TOKENS
    ]
    cfg = RooflineConfig()
    flop_s = gpu.bf16_flops * cfg.compute_efficiency
    byte_s = gpu.mem_bandwidth * cfg.memory_efficiency
    kv_layer = model.kv_bytes_per_layer_per_gpu(1)
    read = kv_layer / byte_s
    block = cfg.paged_block_overhead * KERNEL_REFERENCE_BLOCK * read  # per block read, a layer
    decode = {
        bs: DecodeAttention(
            Curve((0, CONTEXT_END), (0.0, CONTEXT_END * (read + block / bs))),
            block * (bs - 1) / (2 * bs),
        )
        for bs in BLOCK_SIZES
    }
    link = gpu.pcie_bandwidth * cfg.pcie_efficiency
    swap = {
        bs: SwapCost(0.0, 2 * cfg.swap_copy_overhead_s + bs * kv_layer / link) for bs in BLOCK_SIZES
    }
    big = TOKENS[-1]
    path = _csv(sku, name)
    return Profile(
        source={
            "kind": "built-in, derived from published measurements",
            "device": "cuda",
            "device_name": gpu.name,
            "repository": REPOSITORY,
            "path": path,
            "commit": commit,
            "derived": date.today().isoformat(),
            "linear": f"Vidur's per-operator medians of {name} at tp 1 on {sku}, ops scaled "
            + ", ".join(f"{o} x {r:.4g}" for o, r in ratio.items())
            + (f"; at least the 1-token time x {slow:.4g} (bandwidth)" if slow != 1 else ""),
            "lm_head": "not measured by Vidur: mlp_up_proj's GEMM time at as many rows, scaled "
            f"by vocab x hidden over its weights (x {head:.4g}), plus a norm",
            "attention": "no published measurement available: the roofline's terms "
            "(RooflineConfig: K/V bytes over memory bandwidth x efficiency, pairs over peak "
            "x efficiency, the paged kernel's per-block overhead of the vLLM paper, Fig. 18a)",
            "swap": "no published measurement available: 2 copies (K, V) per block per layer, "
            "each RooflineConfig.swap_copy_overhead_s plus its bytes over PCIe x efficiency",
            "host": "per_iteration_s and per_sequence_s are RooflineConfig's step_overhead_s and "
            "per_sequence_s",
        },
        model={
            "name": model.name,
            "arch": model.architecture.value,
            **{f: getattr(model, f) for f in SHAPE_FIELDS},
        },
        dtype="float16",
        block_sizes=BLOCK_SIZES,
        per_iteration_s=cfg.step_overhead_s,
        per_sequence_s=cfg.per_sequence_s,
        per_token_s=0.0,
        embedding=curve(embedding),
        linear=curve(linear),
        lm_head=curve(lm_head),
        prefill_attention=PrefillAttention(
            0.0, 0.0, model.attention_flops_per_pair_per_layer / flop_s, read
        ),
        decode_attention=decode,
        swap=swap,
        rates=DeviceRates(
            2 * _weights(source_layer) * big / sum(times[o][big] for o in _GEMMS),
            2 * _weights(source_layer) / sum(times[o][1] * slow for o in _GEMMS),
            link,
            cfg.step_overhead_s,
        ),
    )


_GEMMS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")


def _weights(x: Layer) -> int:
    """Weights of the four GEMMs of a layer (FLOPs per token / 2, bytes at fp16 / 2)."""
    up = x.hidden * x.ffn * (2 if x.gated else 1)
    return x.hidden * (x.heads + 2 * x.kv_heads) * x.head_dim + x.hidden**2 + up + x.ffn * x.hidden


def _csv(sku: str, name: str) -> str:
    return f"data/profiling/compute/{sku}/{name}/mlp.csv"


def main(argv: list[str]) -> None:
    vidur, commit = Path(argv[0]), argv[1]
    for gpu_name in GPU_DIRS:
        for model_name in SOURCES:
            profile = derive(GPUS[gpu_name], MODELS[model_name], vidur, commit)
            out = HERE / gpu_name.lower() / f"{model_name.lower()}.json"
            out.parent.mkdir(exist_ok=True)
            profile.write(out)
            print(f"wrote {out.relative_to(HERE)}")


if __name__ == "__main__":
    main(sys.argv[1:])

"""End-to-end tokens/s of the real executor against Hugging Face, on the same tiny models.

    python benchmarks/bench_e2e.py [--prompts 16] [--new-tokens 32] [--json PATH]

For a tiny GPT-2 and a tiny Llama (GQA), random weights from a seed, fp32 on the CPU, the same
prompts (random lengths) go through, in one run:

* pagedkv: the simulator's Engine and vllm Scheduler driving the ``TorchExecutor`` (paged K/V);
* HF ``generate``: one left-padded batch, dynamic cache, greedy;
* HF ``generate_batch``: transformers' own continuous batching with its paged cache, where the
  installed version has it.

Each path runs once to warm up, then is timed (best of ``--repeats``). Reported: generated
tokens per wall second and pagedkv's ratio to each, and whether the greedy tokens agree with
pagedkv's (HF's batched path pads, so a disagreement there can be rounding, not a bug: the
tests compare unpadded, in float64). Needs torch and transformers; one torch thread unless
``--threads``.
"""

from __future__ import annotations

import argparse
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from pagedkv.engine.config import SchedulerConfig
from pagedkv.io import atomic_write_json
from pagedkv.memory.block_table import cdiv
from pagedkv.tensors.executor import build_real_engine
from pagedkv.tensors.model import Decoder
from pagedkv.workloads.spec import RequestSpec

VOCAB = 512
MAX_POSITION = 256
BLOCK_SIZE = 16


def hf_model(arch: str) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    common: dict[str, Any] = {"vocab_size": VOCAB, "bos_token_id": None, "eos_token_id": None}
    model: Any
    if arch == "gpt2":
        gpt2 = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=MAX_POSITION, **common)
        model = GPT2LMHeadModel(gpt2)
        return model.eval()
    llama = LlamaConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=MAX_POSITION,
        **common,
    )
    model = LlamaForCausalLM(llama)
    return model.eval()


def make_prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(16, 65, (n,), generator=g).tolist()
    return [torch.randint(0, VOCAB, (k,), generator=g).tolist() for k in lens]


def run_pagedkv(model: Any, prompts: list[list[int]], new: int) -> list[list[int]]:
    decoder = Decoder.from_hf(model)
    specs = [RequestSpec(i, len(p), new, token_ids=tuple(p)) for i, p in enumerate(prompts)]
    blocks = sum(cdiv(len(p) + new, BLOCK_SIZE) for p in prompts)
    engine = build_real_engine(
        decoder,
        specs,
        num_gpu_blocks=blocks,
        block_size=BLOCK_SIZE,
        scheduler=SchedulerConfig(max_model_len=MAX_POSITION),
    )
    run = engine.run()
    return [list(r.output_token_ids) for r in sorted(run.requests, key=lambda r: r.request_id)]


def run_hf_generate(model: Any, prompts: list[list[int]], new: int) -> list[list[int]]:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])  # left padding
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=new,
            min_new_tokens=new,
            pad_token_id=0,
        )
    return [row[width:].tolist() for row in out]


def run_hf_generate_batch(model: Any, prompts: list[list[int]], new: int) -> list[list[int]]:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    blocks = sum(cdiv(len(p) + new, BLOCK_SIZE) for p in prompts)
    # a pool sized like pagedkv's: unsized, it probes memory (and on a CPU without psutil
    # allocates for a minute)
    cb = ContinuousBatchingConfig(num_blocks=blocks, block_size=BLOCK_SIZE, max_batch_tokens=2048)
    gen = GenerationConfig(  # type: ignore[no-untyped-call]
        max_new_tokens=new, min_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    out = model.generate_batch(
        prompts, generation_config=gen, continuous_batching_config=cb, progress_bar=False
    )
    return [list(out[f"req_{i}"].generated_tokens) for i in range(len(prompts))]


def timed(fn: Callable[[], list[list[int]]], repeats: int) -> tuple[float, list[list[int]]]:
    fn()  # warm-up
    best, result = float("inf"), []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for every path (default 1: on a shared machine, idle OpenMP "
        "threads spin and several threads time the neighbours, not the code)",
    )
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    # generate_batch logs an ERROR per call on a CPU without psutil; the run is unaffected
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.CRITICAL)
    prompts = make_prompts(args.prompts)
    new = args.new_tokens
    tokens = len(prompts) * new
    rows: list[dict[str, Any]] = []
    for arch in ("gpt2", "llama"):
        model = hf_model(arch)
        runners = [run_pagedkv, run_hf_generate]
        if hasattr(model, "generate_batch"):
            runners.append(run_hf_generate_batch)
        names = ("pagedkv", "hf generate", "hf generate_batch")
        paths: dict[str, Callable[[], list[list[int]]]] = {
            name: functools.partial(run, model, prompts, new)
            for name, run in zip(names, runners, strict=False)
        }
        ours: list[list[int]] = []
        ours_s = 0.0
        for name, fn in paths.items():
            seconds, out = timed(fn, args.repeats)
            if name == "pagedkv":
                ours, ours_s = out, seconds
            rows.append(
                {
                    "model": arch,
                    "path": name,
                    "seconds": seconds,
                    "tokens_per_s": tokens / seconds,
                    "pagedkv_speedup": seconds / ours_s,
                    "tokens_agree": out == ours,
                }
            )

    table = Table(
        title=f"end-to-end: {len(prompts)} prompts (16-64 tokens), {new} new tokens each, fp32, "
        f"{torch.get_num_threads()} threads"
    )
    for col in ("model", "path", "wall s", "tokens/s", "pagedkv x faster", "same tokens"):
        table.add_column(col, justify="left" if col in ("model", "path") else "right")
    for r in rows:
        table.add_row(
            r["model"],
            r["path"],
            f"{r['seconds']:.3f}",
            f"{r['tokens_per_s']:.0f}",
            f"{r['pagedkv_speedup']:.2f}",
            "yes" if r["tokens_agree"] else "no",
        )
    Console(width=120).print(table)
    if args.json:
        atomic_write_json(args.json, {"rows": rows, "threads": torch.get_num_threads()})


if __name__ == "__main__":
    main()

"""Subcommands of ``pagedkv`` for this package (see ``pagedkv.cli.COMMAND_MODULES``):
``generate``, ``profile``, ``fidelity``. torch is imported only when the command runs."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

_FLAGS = {  # GenerateConfig field -> argparse type (None: a switch)
    "model": str,
    "config": str,
    "prompts": str,
    "num_prompts": int,
    "prompt_len": int,
    "max_new_tokens": int,
    "block_size": int,
    "num_gpu_blocks": int,
    "num_cpu_blocks": int,
    "scheduler": str,
    "preemption_mode": str,
    "enable_chunked_prefill": None,
    "max_num_batched_tokens": int,
    "temperature": float,
    "num_beams": int,
    "dtype": str,
    "seed": int,
}


def _cmd_generate(args: argparse.Namespace) -> int:
    from pagedkv.io import atomic_write_json
    from pagedkv.tensors.generate import generate
    from pagedkv.tensors.generate_config import GenerateConfig

    values = {k: getattr(args, k) for k in _FLAGS if getattr(args, k) is not None}
    result = generate(GenerateConfig(**values))
    for out in result["outputs"]:
        ids = " ".join(str(t) for t in out["output_token_ids"])
        print(f"request {out['request_id']} (prompt {out['prompt_len']}): {ids}")
    s, t = result["summary"], result["timing"]
    print(
        f"{s['generated_tokens']} tokens from {s['num_requests']} requests in "
        f"{t['wall_seconds']:.3f} s: {t['tokens_per_second']:.1f} tokens/s "
        f"({s['iterations']} iterations, {s['preemptions']} preemptions)"
    )
    if args.json:
        # timing left out: the same config writes byte-identical JSON
        atomic_write_json(args.json, {k: v for k, v in result.items() if k != "timing"})
    return 0


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add this package's subcommands to the ``pagedkv`` parser."""
    from pagedkv.validation import field_help

    gen = sub.add_parser(
        "generate",
        help="Generate tokens with a tiny random-weight model on the real paged KV cache (torch).",
        description="Run prompts through the simulator's engine and scheduler with the real "
        "executor: a decoder (built-in tiny GPT-2 or Llama, or a Hugging Face config.json's "
        "shape) with random weights from --seed, K/V in a paged cache. Prints the generated "
        "token ids and tokens/s. Needs torch.",
    )
    from pagedkv.tensors.generate_config import GenerateConfig  # torch-free

    defaults = {f.name: f.default for f in dataclasses.fields(GenerateConfig)}
    helps = {name: field_help(GenerateConfig, name) for name in _FLAGS}
    for name, kind in _FLAGS.items():
        flag = "--" + name.replace("_", "-")
        text = helps.get(name, "")
        if name in defaults and defaults[name] is not None and kind is not None:
            text += f" (default: {defaults[name]})"
        if kind is None:
            gen.add_argument(flag, dest=name, action="store_true", default=None, help=text)
        else:
            gen.add_argument(flag, dest=name, type=kind, default=None, help=text)
    gen.add_argument("--json", metavar="PATH", help="Write the outputs (no timing) as JSON.")
    gen.set_defaults(func=_cmd_generate)
    from pagedkv.tensors.profile_commands import register_profiling

    register_profiling(sub)

"""Subcommands of ``pagedkv`` for this package (see ``pagedkv.cli.COMMAND_MODULES``):
``generate``, ``profile``, ``fidelity``. torch is imported only when the command runs."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from pagedkv.io import path_arg

_FLAGS: dict[str, Any] = {  # GenerateConfig field -> argparse type (None: a switch; a list:
    # repeatable / several values of that type)
    "model": str,
    "config": str,
    "prompts": str,
    "prompt": [str],
    "prompt_format": str,
    "num_prompts": int,
    "prompt_len": int,
    "max_new_tokens": int,
    "stop_token_ids": [int],
    "ignore_eos": None,
    "block_size": int,
    "num_gpu_blocks": int,
    "num_cpu_blocks": int,
    "swap_space": float,
    "watermark": float,
    "scheduler": str,
    "max_num_seqs": int,
    "max_model_len": int,
    "preemption_mode": str,
    "group_preemption_mode": str,
    "enable_chunked_prefill": None,
    "max_num_batched_tokens": int,
    "enable_prefix_caching": None,
    "eviction_policy": str,
    "temperature": float,
    "num_beams": int,
    "dtype": str,
    "seed": int,
}
# vLLM's flag name first; the field's own name stays accepted
_FLAG_NAMES = {"max_new_tokens": ("--max-tokens", "--max-new-tokens")}


def _cmd_generate(args: argparse.Namespace) -> int:
    from pagedkv.exits import (
        EXIT_DEADLOCK,
        EXIT_OK,
        EXIT_SERVED_NOTHING,
        require,
        served_nothing,
    )
    from pagedkv.io import atomic_write_json, check_output_file, is_stdout
    from pagedkv.tensors.generate import generate
    from pagedkv.tensors.generate_config import GenerateConfig

    values = {k: getattr(args, k) for k in _FLAGS if getattr(args, k) is not None}
    require("torch")  # before the config: nothing of generate runs without it
    for name, kind in _FLAGS.items():
        if isinstance(kind, list) and name in values:
            values[name] = tuple(values[name])
    config = GenerateConfig(**values)
    if args.json:
        check_output_file("--json", args.json)
    result = generate(config)
    say = sys.stderr if is_stdout(args.json) else sys.stdout  # stdout then holds the JSON
    for out in result["outputs"]:
        shown = out.get("output_text")
        if shown is None:
            shown = " ".join(str(t) for t in out["output_token_ids"])
        print(f"request {out['request_id']} (prompt {out['prompt_len']}): {shown}", file=say)
    s, t = result["summary"], result["timing"]
    print(
        f"{s['generated_tokens']} tokens from {s['num_requests']} requests in "
        f"{t['wall_seconds']:.3f} s: {t['tokens_per_second']:.1f} tokens/s "
        f"({s['iterations']} iterations, {s['preemptions']} preemptions)",
        file=say,
    )
    if args.json:
        # timing left out: the same config writes byte-identical JSON
        atomic_write_json(args.json, {k: v for k, v in result.items() if k != "timing"})
    if s["deadlocked"]:
        ended = ("finished", "rejected")
        stuck = [o["request_id"] for o in result["outputs"] if o["status"] not in ended]
        print(
            f"pagedkv: deadlock: {len(stuck)} requests can never proceed; stuck request ids: "
            + ", ".join(map(str, stuck)),
            file=sys.stderr,
        )
        return EXIT_DEADLOCK
    if not any(o["status"] == "finished" for o in result["outputs"]):
        for line in served_nothing(result["outputs"]):
            print(line, file=sys.stderr)
        return EXIT_SERVED_NOTHING
    return EXIT_OK


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add this package's subcommands to the ``pagedkv`` parser."""
    from pagedkv.validation import field_help

    gen = sub.add_parser(
        "generate",
        allow_abbrev=False,
        help="Generate with a local Hugging Face checkpoint (or a tiny random model) on the "
        "real paged KV cache (torch).",
        description="Run prompts through the simulator's engine and scheduler with the real "
        "executor: a local Hugging Face checkpoint directory (--model DIR: GPT-2, Llama, "
        "Mistral, Qwen2, Qwen3, Gemma), or a built-in tiny GPT-2 / Llama or a config.json's "
        "shape with random weights from --seed; K/V in a paged cache. Prints the generated "
        "text (or token ids) and tokens/s. Needs torch.",
    )
    from pagedkv.tensors.generate_config import GenerateConfig  # torch-free

    defaults = {f.name: f.default for f in dataclasses.fields(GenerateConfig)}
    helps = {name: field_help(GenerateConfig, name) for name in _FLAGS}
    for name, kind in _FLAGS.items():
        flags = _FLAG_NAMES.get(name, ("--" + name.replace("_", "-"),))
        text = helps.get(name, "")
        if name in defaults and defaults[name] not in (None, ()) and kind is not None:
            text += f" (default: {defaults[name]})"
        if kind is None:
            gen.add_argument(*flags, dest=name, action="store_true", default=None, help=text)
        elif kind == [str]:
            gen.add_argument(*flags, dest=name, action="append", default=None, help=text)
        elif isinstance(kind, list):
            gen.add_argument(*flags, dest=name, type=kind[0], nargs="+", default=None, help=text)
        else:
            gen.add_argument(*flags, dest=name, type=kind, default=None, help=text)
    gen.add_argument(
        "--json",
        type=path_arg,
        metavar="PATH",
        help="Write the outputs (no timing) as JSON (- for standard output: the lines "
        "printed then go to stderr). Exit codes: pagedkv --help.",
    )
    gen.set_defaults(func=_cmd_generate)
    from pagedkv.tensors.profile_commands import register_profiling

    register_profiling(sub)

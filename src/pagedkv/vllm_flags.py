"""vLLM flags that pagedkv does not model, and why: ``pagedkv simulate`` refuses each with one
line naming the flag and the reason, where argparse would print its usage and "unrecognized
arguments". The table of every vLLM flag and what pagedkv does with it is docs/vllm-flags.md
(its test checks that the rows marked absent are these)."""

from __future__ import annotations

import argparse
from typing import Any

from pagedkv.errors import ConfigError

UNMODELLED = {
    "--pipeline-parallel-size": "one pipeline stage: the cost model splits a model over "
    "--tensor-parallel-size GPUs only",
    "--data-parallel-size": "one engine; run one simulation per replica (pagedkv plan sizes "
    "replicas)",
    "--max-num-partial-prefills": "one partial prefill at a time, vLLM's default",
    "--max-long-partial-prefills": "one partial prefill at a time, vLLM's default",
    "--scheduler-cls": "--scheduler chooses a policy by name (vllm-v1 is vLLM's v1 scheduler)",
    "--cpu-offload-gb": "weights are not offloaded: --gpu-memory-utilization and the model's "
    "weights set the KV memory",
    "--kv-offloading-size": "no KV offloading beyond the swap pool (--swap-space)",
    "--calculate-kv-scales": "fp8 scales change no byte count: --kv-cache-dtype fp8 is enough",
    "--prefix-caching-hash-algo": "prefix caching compares token ids exactly, no hash collisions",
    "--disable-hybrid-kv-cache-manager": "one KV cache group: sliding windows are priced, not "
    "given their own block pool",
    "--enforce-eager": "no CUDA graphs: the cost model prices kernels, not their launches",
    "--speculative-config": "no speculative decoding: one token per request per step",
    "--num-lookahead-slots": "no speculative decoding, so no lookahead slots",
    "--quantization": "weights take --dtype's bytes; quantized weights are not modelled",
    "--disable-sliding-window": "a model's sliding window is read from its config.json",
    "--ignore-eos": "always on: every request produces its planned output length",
    "--ramp-up-strategy": "a constant rate (--request-rate) or a trace's own times",
    "--disable-shuffle": "the ShareGPT conversations are always shuffled with --seed",
    "--no-oversample": "too small a ShareGPT file is oversampled, as by vLLM's default",
    "--sharegpt-output-len": "outputs take the file's second turn's length",
}
"""vLLM flag -> why pagedkv does without it."""


class _Refused(argparse.Action):
    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        flag = str(option_string)
        why = UNMODELLED[flag]
        raise ConfigError(
            flag, True if values is None else values, f"not modelled by pagedkv: {why}"
        )


def add_refused_flags(parser: argparse.ArgumentParser) -> None:
    """Every flag of ``UNMODELLED``, hidden from --help, refused when given (with or without
    a value) by one ``ConfigError`` naming it and why."""
    for flag in UNMODELLED:
        parser.add_argument(flag, nargs="?", action=_Refused, help=argparse.SUPPRESS)

"""The small decoder's shape: one frozen, validated config for both architectures.

``gpt2``: learned positions, LayerNorm, GELU MLP, biases everywhere, fused ``c_attn``.
``llama``: rotary positions (RoPE), RMSNorm, grouped-query attention, SwiGLU MLP; with the
flags below it also covers Llama 3.1+ (scaled RoPE), Qwen2/2.5 (q/k/v biases), Qwen3 (q/k
norms), Mistral (sliding window) and Gemma (scaled embeddings, 1 + weight norms).

``DecoderConfig.from_hf`` reads a Hugging Face config (a ``PretrainedConfig`` or the dict of a
``config.json``); ``tiny_config`` gives the built-in random-init demo shapes. Nothing here
imports torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagedkv.errors import ConfigError
from pagedkv.validation import check_bounds, check_int, float_field, help_field, int_field

ARCHITECTURES = ("gpt2", "llama")
# Hugging Face activation names -> (torch function, GELU approximation). GPT-2 uses "gelu_new",
# the tanh approximation of GELU (Hendrycks & Gimpel 2016, eq. in section 2).
ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh", "gelu", "relu", "silu")
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")


def _check_positive_float(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(field, value, "must be a number > 0")
    return float(value)


@dataclass(frozen=True)
class DecoderConfig:
    """Shape and numerics of a decoder-only transformer (GPT-2 or Llama family)."""

    arch: str = help_field("llama", "Architecture: 'gpt2' or 'llama'.")
    vocab_size: int = int_field(256, "Vocabulary size.", 1, 1 << 22)
    hidden_size: int = int_field(64, "Residual width.", 1, 1 << 16)
    num_layers: int = int_field(2, "Decoder layers.", 1, 1024)
    num_heads: int = int_field(4, "Query heads (divides hidden_size unless head_dim).", 1, 1024)
    num_kv_heads: int = int_field(2, "K/V heads (divides num_heads; gpt2: num_heads).", 1, 1024)
    head_dim: int = int_field(16, "Width of one head.", 1, 1 << 12)
    intermediate_size: int = int_field(128, "MLP width.", 1, 1 << 18)
    max_position: int = int_field(
        512, "Longest sequence (gpt2: rows of the position table).", 1, 1 << 24
    )
    norm_eps: float = float_field(1e-5, "Epsilon of LayerNorm / RMSNorm.", 0.0, 1.0, lo_open=True)
    rope_theta: float = float_field(10000.0, "RoPE base (llama).", 0.0, 1e12, lo_open=True)
    activation: str = help_field("silu", "MLP activation (Hugging Face name).")
    tie_word_embeddings: bool = help_field(False, "lm_head shares the token embedding.")
    model_type: str = help_field("", "The Hugging Face model_type it was read from ('': built in).")
    qkv_bias: bool = help_field(
        False, "llama: q/k/v projections have biases (Qwen2, attention_bias)."
    )
    o_bias: bool = help_field(False, "llama: the output projection has a bias (attention_bias).")
    mlp_bias: bool = help_field(False, "llama: the MLP projections have biases (mlp_bias).")
    qk_norm: bool = help_field(False, "llama: RMSNorm of each q/k head before RoPE (Qwen3).")
    sliding_window: int | None = int_field(
        None,
        "llama: a query sees only the last sliding_window keys, itself included (Mistral).",
        1,
        1 << 30,
    )
    sliding_layers: tuple[bool, ...] = help_field(
        (), "Which layers use sliding_window (Qwen2/Qwen3 layer_types); (): all of them."
    )
    rope_type: str = help_field("default", "RoPE variant: " + ", ".join(ROPE_TYPES) + ".")
    rope_scaling: tuple[tuple[str, Any], ...] = help_field(
        (), "The RoPE variant's parameters (name, value), sorted by name."
    )
    scale_attn_weights: bool = help_field(True, "gpt2: scores scaled by 1 / sqrt(head_dim).")
    scale_attn_by_inverse_layer_idx: bool = help_field(
        False, "gpt2: layer i's scores also scaled by 1 / (i + 1)."
    )
    embed_scale: bool = help_field(False, "llama: embeddings times sqrt(hidden_size) (Gemma).")
    norm_unit_offset: bool = help_field(
        False, "llama: RMSNorm scales by 1 + weight, in float32 (Gemma)."
    )

    def __post_init__(self) -> None:
        check_bounds(self)
        if self.arch not in ARCHITECTURES:
            raise ConfigError("arch", self.arch, "must be one of " + ", ".join(ARCHITECTURES))
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "max_position",
        ):
            check_int(name, getattr(self, name), 1)
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                "num_kv_heads", self.num_kv_heads, f"must divide num_heads = {self.num_heads}"
            )
        if self.arch == "gpt2":
            if self.num_kv_heads != self.num_heads:
                raise ConfigError("num_kv_heads", self.num_kv_heads, "gpt2 has no GQA: num_heads")
            if self.num_heads * self.head_dim != self.hidden_size:
                raise ConfigError(
                    "head_dim", self.head_dim, "gpt2: num_heads * head_dim must be hidden_size"
                )
        _check_positive_float("norm_eps", self.norm_eps)
        _check_positive_float("rope_theta", self.rope_theta)
        if self.sliding_window is not None:
            check_int("sliding_window", self.sliding_window, 1)
        if self.sliding_layers and len(self.sliding_layers) != self.num_layers:
            raise ConfigError(
                "sliding_layers",
                len(self.sliding_layers),
                f"must be num_layers = {self.num_layers}",
            )
        if self.rope_type not in ROPE_TYPES:
            raise ConfigError(
                "rope_type", self.rope_type, "must be one of " + ", ".join(ROPE_TYPES)
            )
        if self.arch == "gpt2" and (self.rope_type != "default" or self.sliding_window):
            raise ConfigError("arch", "gpt2", "has learned positions: no RoPE, no sliding window")
        if self.activation not in ACTIVATIONS:
            raise ConfigError(
                "activation", self.activation, "must be one of " + ", ".join(ACTIVATIONS)
            )

    @classmethod
    def from_hf(cls, config: Any) -> DecoderConfig:
        """From a Hugging Face config object, the dict of a ``config.json``, or its path
        (``pagedkv.tensors.hf_config``: the families it reads, the features it refuses)."""
        from pagedkv.tensors.hf_config import read_hf_config

        if isinstance(config, (str, Path)):
            try:
                config = json.loads(Path(config).read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise ConfigError(
                    "config", str(config), f"must be a readable JSON file ({exc})"
                ) from exc
        data: Mapping[str, Any] = config if isinstance(config, Mapping) else config.to_dict()
        return cls(**read_hf_config(data))

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of one layer (None: it sees the whole context)."""
        if self.sliding_window is None or (self.sliding_layers and not self.sliding_layers[layer]):
            return None
        return self.sliding_window

    def rope_param(self, name: str, default: Any = None) -> Any:
        """One parameter of ``rope_scaling`` (``default`` if absent)."""
        return dict(self.rope_scaling).get(name, default)


def tiny_config(arch: str) -> DecoderConfig:
    """The built-in demo shapes: 2 layers, hidden 64, 4 heads (llama: 2 kv heads), vocab 256."""
    if arch == "gpt2":
        return DecoderConfig(
            arch="gpt2",
            num_kv_heads=4,
            intermediate_size=256,
            activation="gelu_new",
            tie_word_embeddings=True,
        )
    if arch == "llama":
        return DecoderConfig(arch="llama", norm_eps=1e-6)
    raise ConfigError("arch", arch, "must be one of " + ", ".join(ARCHITECTURES))

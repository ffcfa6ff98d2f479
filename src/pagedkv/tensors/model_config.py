"""The small decoder's shape: one frozen, validated config for both architectures.

``gpt2``: learned positions, LayerNorm, GELU MLP, biases everywhere, fused ``c_attn``.
``llama``: rotary positions (RoPE), RMSNorm, grouped-query attention, SwiGLU MLP, no biases.

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
        if self.activation not in ACTIVATIONS:
            raise ConfigError(
                "activation", self.activation, "must be one of " + ", ".join(ACTIVATIONS)
            )

    @classmethod
    def from_hf(cls, config: Any) -> DecoderConfig:
        """From a Hugging Face config object, the dict of a ``config.json``, or its path."""
        if isinstance(config, (str, Path)):
            try:
                config = json.loads(Path(config).read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise ConfigError(
                    "config", str(config), f"must be a readable JSON file ({exc})"
                ) from exc
        data: Mapping[str, Any] = config if isinstance(config, Mapping) else config.to_dict()
        model_type = data.get("model_type")
        if model_type == "gpt2":
            heads = data.get("n_head", 12)
            hidden = data.get("n_embd", 768)
            inner = data.get("n_inner")
            return cls(
                arch="gpt2",
                vocab_size=data.get("vocab_size", 50257),
                hidden_size=hidden,
                num_layers=data.get("n_layer", 12),
                num_heads=heads,
                num_kv_heads=heads,
                head_dim=hidden // heads,
                intermediate_size=inner if inner is not None else 4 * hidden,
                max_position=data.get("n_positions", 1024),
                norm_eps=data.get("layer_norm_epsilon", 1e-5),
                activation=data.get("activation_function", "gelu_new"),
                tie_word_embeddings=bool(data.get("tie_word_embeddings", True)),
            )
        if model_type == "llama":
            heads = data["num_attention_heads"]
            hidden = data["hidden_size"]
            rope = data.get("rope_parameters") or data.get("rope_scaling") or {}
            rope_type = rope.get("rope_type", rope.get("type", "default"))
            if rope_type != "default":
                raise ConfigError("rope_type", rope_type, "only 'default' RoPE is implemented")
            if data.get("attention_bias") or data.get("mlp_bias"):
                raise ConfigError("attention_bias", True, "llama without biases only")
            return cls(
                arch="llama",
                vocab_size=data["vocab_size"],
                hidden_size=hidden,
                num_layers=data["num_hidden_layers"],
                num_heads=heads,
                num_kv_heads=data.get("num_key_value_heads") or heads,
                head_dim=data.get("head_dim") or hidden // heads,
                intermediate_size=data["intermediate_size"],
                max_position=data.get("max_position_embeddings", 2048),
                norm_eps=data.get("rms_norm_eps", 1e-6),
                rope_theta=rope.get("rope_theta", data.get("rope_theta", 10000.0)),
                activation=data.get("hidden_act", "silu"),
                tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
            )
        raise ConfigError("model_type", model_type, "must be 'gpt2' or 'llama'")


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

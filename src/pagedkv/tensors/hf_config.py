"""Read a Hugging Face ``config.json`` (as a dict) into ``DecoderConfig`` fields.

Families (``model_type``): ``gpt2``; and on the rotary decoder (``arch = "llama"``): ``llama``
(Llama 2, 3, 3.1+ with every ``rope_scaling`` type, ``attention_bias``, ``mlp_bias``),
``mistral`` (``sliding_window``), ``qwen2`` (q/k/v biases; sliding layers), ``qwen3`` (q/k
norms; sliding layers) and ``gemma``
(scaled embeddings, ``1 + weight`` norms). A feature the decoder does not compute is refused
with a one-line ``ConfigError`` naming its key, never silently ignored. Nothing here imports
torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagedkv.errors import ConfigError

FAMILIES = ("gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma")

# rope_scaling type -> the parameters it needs (beyond rope_type and rope_theta), as in
# transformers' modeling_rope_utils
_ROPE_NEEDS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("original_max_position_embeddings",),
    "longrope": ("original_max_position_embeddings", "long_factor", "short_factor"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "proportional": (),
}
_ROPE_KEYS = {
    "rope_type", "type", "rope_theta", "factor", "original_max_position_embeddings",
    "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate",
    "long_factor", "short_factor", "low_freq_factor", "high_freq_factor", "partial_rotary_factor",
}  # fmt: skip


def _refuse_if(data: Mapping[str, Any], key: str, bad: bool, allowed: str) -> None:
    if bad:
        raise ConfigError(key, data.get(key), allowed)


def _rope(data: Mapping[str, Any]) -> dict[str, Any]:
    """rope_type, rope_theta and the sorted parameters of a rotary config."""
    rope = dict(data.get("rope_parameters") or data.get("rope_scaling") or {})
    if any(isinstance(v, Mapping) for v in rope.values()):
        raise ConfigError("rope_parameters", rope, "one RoPE for every layer only")
    rope_type = rope.pop("rope_type", rope.pop("type", "default"))
    rope.pop("type", None)
    if rope_type not in _ROPE_NEEDS:
        raise ConfigError(
            "rope_scaling.rope_type", rope_type, "must be one of " + ", ".join(_ROPE_NEEDS)
        )
    theta = rope.pop("rope_theta", None) or data.get("rope_theta", 10000.0)
    partial = rope.pop("partial_rotary_factor", data.get("partial_rotary_factor", 1.0))
    if rope_type == "proportional" and partial is not None:
        if (
            isinstance(partial, bool)
            or not isinstance(partial, (int, float))
            or not 0 < partial <= 1
        ):
            raise ConfigError("partial_rotary_factor", partial, "must be in (0, 1]")
        rope["partial_rotary_factor"] = partial  # the unrotated dimensions get frequency 0
    elif partial not in (None, 1, 1.0):
        raise ConfigError(
            "partial_rotary_factor", partial, "only 1.0 (RoPE on the whole head), or proportional"
        )
    unknown = sorted(set(rope) - _ROPE_KEYS)
    if unknown:
        raise ConfigError("rope_scaling", unknown, "unknown RoPE parameters")
    if rope_type in ("llama3", "yarn", "longrope"):
        # as transformers: the pretraining length defaults to max_position_embeddings, and a
        # top-level original_max_position_embeddings (Phi-3's place) wins
        top = data.get("original_max_position_embeddings")
        if top is not None:
            rope["original_max_position_embeddings"] = top
        rope.setdefault("original_max_position_embeddings", data.get("max_position_embeddings"))
    for need in _ROPE_NEEDS[rope_type]:
        if rope.get(need) is None:
            raise ConfigError(f"rope_scaling.{need}", None, f"required by rope_type {rope_type!r}")
    params = tuple(
        sorted(
            (k, tuple(v) if isinstance(v, list) else v) for k, v in rope.items() if v is not None
        )
    )
    return {"rope_type": rope_type, "rope_theta": theta, "rope_scaling": params}


def _gpt2(data: Mapping[str, Any]) -> dict[str, Any]:
    _refuse_if(
        data, "reorder_and_upcast_attn", bool(data.get("reorder_and_upcast_attn")), "only false"
    )
    heads = data.get("n_head", 12)
    hidden = data.get("n_embd", 768)
    inner = data.get("n_inner")
    return {
        "arch": "gpt2",
        "vocab_size": data.get("vocab_size", 50257),
        "hidden_size": hidden,
        "num_layers": data.get("n_layer", 12),
        "num_heads": heads,
        "num_kv_heads": heads,
        "head_dim": hidden // heads,
        "intermediate_size": inner if inner is not None else 4 * hidden,
        "max_position": data.get("n_positions", 1024),
        "norm_eps": data.get("layer_norm_epsilon", 1e-5),
        "activation": data.get("activation_function", "gelu_new"),
        "tie_word_embeddings": bool(data.get("tie_word_embeddings", True)),
        "scale_attn_weights": bool(data.get("scale_attn_weights", True)),
        "scale_attn_by_inverse_layer_idx": bool(data.get("scale_attn_by_inverse_layer_idx", False)),
    }


def _window(data: Mapping[str, Any], family: str) -> tuple[int | None, tuple[bool, ...]]:
    """(sliding_window, which layers use it): Mistral's applies to every layer; Qwen2/Qwen3's
    to the layers ``layer_types`` marks ``sliding_attention`` (transformers derives them from
    ``use_sliding_window`` and ``max_window_layers``), and only with ``use_sliding_window``."""
    kinds = data.get("layer_types")
    if kinds is not None:
        allowed = {"full_attention", "sliding_attention"}
        if not isinstance(kinds, list) or not set(kinds) <= allowed:
            raise ConfigError("layer_types", kinds, "full_attention or sliding_attention per layer")
        if len(kinds) != data.get("num_hidden_layers"):
            raise ConfigError("layer_types", kinds, "one entry per layer (num_hidden_layers)")
    if family == "mistral":
        return data.get("sliding_window"), ()
    if family in ("qwen2", "qwen3") and data.get("use_sliding_window"):
        window = data.get("sliding_window")
        if kinds is None:
            raise ConfigError("layer_types", None, "required with use_sliding_window")
        return window, tuple(k == "sliding_attention" for k in kinds)
    if kinds is not None and "sliding_attention" in kinds:
        raise ConfigError("layer_types", kinds, f"{family}: full_attention only")
    return None, ()


def _rotary(data: Mapping[str, Any], family: str) -> dict[str, Any]:
    for key in ("num_attention_heads", "hidden_size", "num_hidden_layers", "vocab_size"):
        if key not in data:
            raise ConfigError(key, None, f"required in a {family} config.json")
    heads = data["num_attention_heads"]
    hidden = data["hidden_size"]
    pretraining_tp = data.get("pretraining_tp", 1)
    _refuse_if(data, "pretraining_tp", pretraining_tp not in (None, 1), "only 1")
    window, layers = _window(data, family)
    gemma = family == "gemma"
    if gemma:
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            _refuse_if(data, key, data.get(key) is not None, "only none (Gemma 1)")
    bias = bool(data.get("attention_bias", False))
    act = data.get("hidden_act") or data.get("hidden_activation") or "silu"
    if gemma and act == "gelu":  # as transformers: Gemma's "gelu" means the tanh approximation
        act = "gelu_pytorch_tanh"
    return {
        "arch": "llama",
        "vocab_size": data["vocab_size"],
        "hidden_size": hidden,
        "num_layers": data["num_hidden_layers"],
        "num_heads": heads,
        "num_kv_heads": data.get("num_key_value_heads") or heads,
        "head_dim": data.get("head_dim") or hidden // heads,
        "intermediate_size": data.get("intermediate_size", 4 * hidden),
        "max_position": data.get("max_position_embeddings", 2048),
        "norm_eps": data.get("rms_norm_eps", 1e-6),
        "activation": act,
        "tie_word_embeddings": bool(data.get("tie_word_embeddings", gemma)),
        "qkv_bias": bias or family == "qwen2",
        "o_bias": bias,
        "mlp_bias": bool(data.get("mlp_bias", False)),
        "qk_norm": family == "qwen3",
        "sliding_window": window,
        "sliding_layers": layers,
        "embed_scale": gemma,
        "norm_unit_offset": gemma,
        **_rope(data),
    }


def read_hf_config(data: Mapping[str, Any]) -> dict[str, Any]:
    """``DecoderConfig`` keyword arguments from a Hugging Face config dict."""
    family = data.get("model_type")
    if family not in FAMILIES:
        raise ConfigError("model_type", family, "must be one of " + ", ".join(FAMILIES))
    fields = _gpt2(data) if family == "gpt2" else _rotary(data, family)
    return {**fields, "model_type": family}

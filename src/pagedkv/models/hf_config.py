"""Hugging Face ``config.json`` -> ``ModelSpec``: the families we know, and any other decoder
that has the standard fields.

``model_type`` picks a family (``FAMILIES``): its layout, its defaults (tied embeddings, biases,
norms) and how its ``sliding_window`` maps onto layers. An unknown ``model_type`` is read as a
Llama-style decoder from the standard keys (hidden_size, num_attention_heads,
num_hidden_layers, intermediate_size, vocab_size; num_key_value_heads optional), with a note in
``ModelSpec.notes``. Mixtures of experts are found by their keys (``moe_spec``), windows by
``layer_types`` or the family's rule (``sliding_layers``). A missing or bad key is one
ConfigError whose field is the key and whose message names the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagedkv.errors import ConfigError
from pagedkv.models.hf_layers import ConfigReader, mla_spec, moe_spec, sliding_layers
from pagedkv.models.models import Architecture, ModelSpec
from pagedkv.validation import read_text

_DTYPE_BYTES = {"float16": 2, "half": 2, "bfloat16": 2, "float32": 4, "float": 4}
_MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")
"""Where configs keep the longest sequence, in the order looked up (vLLM reads these too)."""


@dataclass(frozen=True)
class Family:
    """What a ``model_type`` implies beyond its config's keys (transformers' class defaults)."""

    architecture: Architecture = Architecture.LLAMA
    tied: bool = False
    """tie_word_embeddings when the file does not say."""
    qkv_bias: bool = False
    qk_norm: bool = False
    norms_per_layer: int = 2
    window: str = "all"
    """How sliding_window maps onto layers: 'all', 'qwen' (layers >= max_window_layers, if
    use_sliding_window), 'alternate' (even layers, Gemma 2), 'pattern' (all but every
    sliding_window_pattern-th, Gemma 3)."""
    aliases: tuple[tuple[str, str], ...] = ()
    """(standard key, this family's key): GPT-2 names its fields n_embd, n_head, ..."""


_GPT2 = (
    ("hidden_size", "n_embd"),
    ("num_attention_heads", "n_head"),
    ("num_hidden_layers", "n_layer"),
    ("max_position_embeddings", "n_positions"),
    ("intermediate_size", "n_inner"),
)
FAMILIES: dict[str, Family] = {
    "opt": Family(Architecture.OPT, tied=True, aliases=(("intermediate_size", "ffn_dim"),)),
    "gpt2": Family(Architecture.GPT2, tied=True, aliases=_GPT2),
    "llama": Family(),
    "mistral": Family(),
    "mixtral": Family(),
    "deepseek": Family(),  # DeepSeek-MoE (v1): standard attention, DeepSeek's MoE keys
    "deepseek_v2": Family(),  # multi-head latent attention (kv_lora_rank), DeepSeek's MoE
    "deepseek_v3": Family(),
    "qwen2": Family(qkv_bias=True, window="qwen"),
    "qwen2_moe": Family(qkv_bias=True, window="qwen"),
    "qwen3": Family(qk_norm=True, window="qwen"),
    "qwen3_moe": Family(qk_norm=True, window="qwen"),
    "gemma": Family(tied=True),
    "gemma2": Family(tied=True, norms_per_layer=4, window="alternate"),
    "gemma3_text": Family(tied=True, norms_per_layer=4, qk_norm=True, window="pattern"),
}


def _read_json(path: str | Path) -> tuple[dict[str, Any], Path]:
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    text = read_text("model", file)  # missing, a directory, not UTF-8: one error naming it
    try:
        raw = json.loads(text)
    except ValueError as err:  # a JSONDecodeError, or an integer of over 4300 digits
        raise ConfigError("model", str(file), f"must be valid JSON ({err})") from None
    if not isinstance(raw, dict):
        raise ConfigError("model", str(file), "must hold a JSON object")
    return raw, file


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """Read a Hugging Face ``config.json`` (or a directory holding one) into a ModelSpec.

    A missing ``torch_dtype`` (``dtype`` in newer files) means 16 bits, what vLLM serves by
    default. A multimodal config's ``text_config`` is read (its vision tower is not counted).
    """
    raw, file = _read_json(path)
    where = f" (in {file})"
    notes: list[str] = []
    model_type = ConfigReader(raw, where).get("model_type")
    text = raw.get("text_config")
    if isinstance(text, dict):
        notes.append(f"{file}: read its text_config; the vision tower's weights are not counted")
        raw = {**raw, **text, "model_type": text.get("model_type", model_type)}
        model_type = raw["model_type"]
    family = FAMILIES.get(str(model_type))
    if family is None:
        family = Family()
        notes.append(
            f"{file}: model_type {model_type!r} is not a known family; read as a Llama-style "
            "decoder from its standard fields (known: " + ", ".join(sorted(FAMILIES)) + ")"
        )
    cfg = ConfigReader(raw, where, dict(family.aliases))
    dtype_key = "torch_dtype" if "torch_dtype" in raw else "dtype"
    dtype = raw.get(dtype_key) or "float16"
    if dtype not in _DTYPE_BYTES:
        raise ConfigError(dtype_key, dtype, f"must be one of {sorted(_DTYPE_BYTES)}{where}")
    hidden, heads = cfg.get_int("hidden_size"), cfg.get_int("num_attention_heads")
    layers = cfg.get_int("num_hidden_layers")
    kv_heads = heads  # OPT and GPT-2: multi-head attention
    if family.architecture is Architecture.LLAMA:
        kv_heads = cfg.get_int("num_key_value_heads", heads)
    ffn_default = 4 * hidden if family.architecture is Architecture.GPT2 else None
    ffn = cfg.get_int("intermediate_size", ffn_default)
    head_dim = raw.get("head_dim") or 0  # optional; null in some files
    if not head_dim and hidden % heads:
        raise ConfigError("num_attention_heads", heads, f"must divide hidden_size{where}")
    if heads % kv_heads:
        raise ConfigError("num_key_value_heads", kv_heads, f"must divide {heads} heads{where}")
    proj = raw.get("word_embed_proj_dim")
    if family.architecture is Architecture.OPT and proj not in (None, hidden):
        why = "must equal hidden_size: OPT-350m's embedding projections are not counted"
        raise ConfigError("word_embed_proj_dim", proj, why + where)
    bias = raw.get("attention_bias", False)
    if not isinstance(bias, bool):
        raise ConfigError("attention_bias", bias, f"must be true or false{where}")
    tied = raw.get("tie_word_embeddings", family.tied)
    if not isinstance(tied, bool):
        raise ConfigError("tie_word_embeddings", tied, f"must be true or false{where}")
    window, num_sliding = sliding_layers(cfg, family.window, layers)
    try:
        return ModelSpec(
            name=str(raw.get("_name_or_path") or file.parent.name or "model"),
            architecture=family.architecture,
            num_layers=layers,
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=cfg.get_int("head_dim", hidden // heads) if head_dim else hidden // heads,
            intermediate_size=ffn,
            vocab_size=cfg.get_int("vocab_size"),
            max_model_len=cfg.max_model_len(_MAX_LEN_KEYS),
            dtype_bytes=_DTYPE_BYTES[dtype],
            tie_word_embeddings=tied,
            qkv_bias=family.qkv_bias or bias,
            o_bias=bias,
            qk_norm=family.qk_norm,
            norms_per_layer=family.norms_per_layer,
            sliding_window=window,
            num_sliding_layers=num_sliding,
            moe=moe_spec(cfg, layers, ffn),
            mla=mla_spec(cfg),
            notes=tuple(notes),
        )
    except ConfigError as err:  # e.g. num_key_value_heads not dividing the heads
        if err.allowed.endswith(where):
            raise
        raise ConfigError(err.field, err.value, err.allowed + where) from None

"""Reading a ``config.json``'s keys: typed look-ups that name the key and the file, and the
parts spread over several keys (which layers slide, which are mixtures of experts, the longest
sequence under ``rope_scaling``, latent attention). Used by ``hf_config.py``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from pagedkv.errors import ConfigError
from pagedkv.models.mla import MLASpec
from pagedkv.models.moe import MoESpec
from pagedkv.validation import check_int

_MISSING = object()


class ConfigReader:
    """Typed access to a config's keys; ``aliases`` maps a standard key to a family's own."""

    def __init__(self, raw: Mapping[str, Any], where: str, aliases: Mapping[str, str] = {}):
        self.raw, self.where, self.aliases = raw, where, aliases

    def key(self, key: str) -> str:
        return self.aliases.get(key, key)

    def has(self, key: str) -> bool:
        return self.raw.get(self.key(key)) is not None

    def get(self, key: str, default: Any = None) -> Any:
        name = self.key(key)
        value = self.raw.get(name)
        value = default if value is None else value  # absent or null: the default
        if value is None:
            raise ConfigError(name, None, f"is missing{self.where}")
        return value

    def get_int(self, key: str, default: int | None = None, minimum: int = 1) -> int:
        value = self.get(key, default)
        try:
            return check_int(self.key(key), value, minimum)
        except ConfigError as err:
            raise ConfigError(self.key(key), value, err.allowed + self.where) from None

    def get_ints(self, key: str) -> list[int]:
        value = self.get(key, [])
        if not isinstance(value, list):
            raise ConfigError(key, value, f"must be a list of layer indices{self.where}")
        for v in value:
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(key, value, f"must be a list of layer indices{self.where}")
        return value

    def max_model_len(self, keys: Sequence[str]) -> int:
        """The first of ``keys`` present, scaled as vLLM scales it under ``rope_scaling``.

        'linear', 'dynamic' and 'yarn' stretch the positions by ``factor`` (yarn from its
        ``original_max_position_embeddings``); 'llama3', 'longrope' and others already give the
        stretched length in max_position_embeddings.
        """
        key = next((k for k in keys if self.has(k)), keys[0])
        length = self.get_int(key)
        scaling = self.raw.get("rope_scaling")
        if scaling is None:
            return length
        if not isinstance(scaling, Mapping):
            raise ConfigError("rope_scaling", scaling, f"must be a mapping or null{self.where}")
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind not in ("linear", "dynamic", "yarn"):
            return length
        factor = scaling.get("factor", 1.0)
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor >= 1:
            raise ConfigError("rope_scaling.factor", factor, f"must be a number >= 1{self.where}")
        if kind == "yarn":
            length = check_int(
                "rope_scaling.original_max_position_embeddings",
                scaling.get("original_max_position_embeddings", length),
                1,
            )
        return math.floor(length * factor)


def sliding_layers(cfg: ConfigReader, rule: str, num_layers: int) -> tuple[int | None, int]:
    """(window, how many layers use it) from ``layer_types`` if present, else the family's
    rule (see ``Family.window``); (None, 0) without a window."""
    raw = cfg.raw
    if raw.get("use_sliding_window") is False or raw.get("sliding_window") is None:
        return None, 0
    types = raw.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != num_layers:
            raise ConfigError(
                "layer_types", types, f"must list one type per layer ({num_layers}){cfg.where}"
            )
        count = sum(t == "sliding_attention" for t in types)
    elif rule == "qwen":
        count = max(0, num_layers - cfg.get_int("max_window_layers", 28, minimum=0))
    elif rule == "alternate":  # Gemma 2: layers 0, 2, 4, ... slide
        count = (num_layers + 1) // 2
    elif rule == "pattern":  # Gemma 3: every pattern-th layer (1-based) is global
        count = num_layers - num_layers // cfg.get_int("sliding_window_pattern", 6)
    else:
        count = num_layers
    if not count:
        return None, 0
    return cfg.get_int("sliding_window"), count


def moe_spec(cfg: ConfigReader, num_layers: int, intermediate_size: int) -> MoESpec | None:
    """The mixture of experts the config's keys describe, or None for a dense model.

    * Mixtral: ``num_local_experts`` experts of ``intermediate_size`` on every layer;
    * Qwen-MoE: ``num_experts`` of ``moe_intermediate_size``, on layers not in
      ``mlp_only_layers`` whose 1-based index is a multiple of ``decoder_sparse_step``, with a
      gated shared expert of ``shared_expert_intermediate_size`` (Qwen2-MoE);
    * DeepSeek: ``n_routed_experts`` of ``moe_intermediate_size`` from layer
      ``first_k_dense_replace`` on, every ``moe_layer_freq``-th, ``n_shared_experts`` shared.
    """
    k = "num_experts_per_tok"
    if cfg.has("n_routed_experts"):
        width = cfg.get_int("moe_intermediate_size")
        first, freq = cfg.get_int("first_k_dense_replace", 0, 0), cfg.get_int("moe_layer_freq", 1)
        layers = sum(1 for i in range(num_layers) if i >= first and i % freq == 0)
        shared = cfg.get_int("n_shared_experts", 0, 0) * width
        experts = cfg.get_int("n_routed_experts")
        bias = cfg.raw.get("topk_method") == "noaux_tc"  # V3: e_score_correction_bias
        return _moe(cfg, experts, cfg.get_int(k), width, layers, shared, False, bias)
    if cfg.has("num_local_experts"):
        experts = cfg.get_int("num_local_experts")
        return _moe(cfg, experts, cfg.get_int(k), intermediate_size, num_layers, 0, False)
    if cfg.has("num_experts") and cfg.get_int("num_experts", minimum=0) > 0:
        dense = set(cfg.get_ints("mlp_only_layers"))
        step = cfg.get_int("decoder_sparse_step", 1)
        layers = sum(1 for i in range(num_layers) if i not in dense and (i + 1) % step == 0)
        shared = cfg.get_int("shared_expert_intermediate_size", 0, 0)
        experts, width = cfg.get_int("num_experts"), cfg.get_int("moe_intermediate_size")
        return _moe(cfg, experts, cfg.get_int(k), width, layers, shared, shared > 0)
    return None


def _moe(
    cfg: ConfigReader,
    experts: int,
    k: int,
    width: int,
    layers: int,
    shared: int,
    gate: bool,
    bias: bool = False,
) -> MoESpec | None:
    if not layers:
        return None
    if k > experts:
        raise ConfigError("num_experts_per_tok", k, f"must be <= the {experts} experts{cfg.where}")
    try:
        return MoESpec(experts, k, width, layers, shared, gate, bias)
    except ConfigError as err:
        raise ConfigError(err.field, err.value, err.allowed + cfg.where) from None


def mla_spec(cfg: ConfigReader) -> MLASpec | None:
    """Multi-head latent attention when the config has ``kv_lora_rank`` (DeepSeek-V2/V3)."""
    if not cfg.has("kv_lora_rank"):
        return None
    return MLASpec(
        kv_lora_rank=cfg.get_int("kv_lora_rank"),
        qk_nope_head_dim=cfg.get_int("qk_nope_head_dim"),
        qk_rope_head_dim=cfg.get_int("qk_rope_head_dim", minimum=0),
        v_head_dim=cfg.get_int("v_head_dim"),
        q_lora_rank=cfg.get_int("q_lora_rank", 0, minimum=0),
    )

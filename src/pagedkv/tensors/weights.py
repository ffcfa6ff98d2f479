"""The decoder's weights: their Hugging Face names, a strict state-dict reader, a seeded init.

A config names exactly the tensors it computes with (``hf_names``). Reading a state dict checks
it against that list both ways: a missing tensor, or one the config would not use (a bias under
a config without biases, an ``lm_head.weight`` that an untied config lacks), is a one-line
``ConfigError`` naming the keys, so a checkpoint never runs with weights silently dropped or
substituted. Buffers transformers may keep in a state dict (GPT-2's causal-mask ``attn.bias``
and ``attn.masked_bias``, RoPE's ``inv_freq``) are not weights and are skipped.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from pagedkv.errors import ConfigError
from pagedkv.tensors.model_config import DecoderConfig

_BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")


def hf_names(c: DecoderConfig) -> tuple[dict[str, str], dict[str, str]]:
    """(model-level ours -> HF name, per-layer ours -> HF name after ``<prefix>.<i>.``)."""
    if c.arch == "gpt2":
        top = {
            "embed": "transformer.wte.weight",
            "pos_embed": "transformer.wpe.weight",
            "norm_w": "transformer.ln_f.weight",
            "norm_b": "transformer.ln_f.bias",
        }
        layer = {
            "ln1_w": "ln_1.weight", "ln1_b": "ln_1.bias",
            "qkv_w": "attn.c_attn.weight", "qkv_b": "attn.c_attn.bias",
            "o_w": "attn.c_proj.weight", "o_b": "attn.c_proj.bias",
            "ln2_w": "ln_2.weight", "ln2_b": "ln_2.bias",
            "fc_w": "mlp.c_fc.weight", "fc_b": "mlp.c_fc.bias",
            "proj_w": "mlp.c_proj.weight", "proj_b": "mlp.c_proj.bias",
        }  # fmt: skip
    else:
        top = {"embed": "model.embed_tokens.weight", "norm_w": "model.norm.weight"}
        layer = {
            "ln1_w": "input_layernorm.weight",
            "ln2_w": "post_attention_layernorm.weight",
        }
        for p in ("q", "k", "v", "o"):
            layer[f"{p}_w"] = f"self_attn.{p}_proj.weight"
        for p in ("gate", "up", "down"):
            layer[f"{p}_w"] = f"mlp.{p}_proj.weight"
        if c.qkv_bias:
            layer.update({f"{p}_b": f"self_attn.{p}_proj.bias" for p in ("q", "k", "v")})
        if c.o_bias:
            layer["o_b"] = "self_attn.o_proj.bias"
        if c.mlp_bias:
            layer.update({f"{p}_b": f"mlp.{p}_proj.bias" for p in ("gate", "up", "down")})
        if c.qk_norm:
            layer.update({"q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight"})
    if not c.tie_word_embeddings:
        top["lm_head"] = "lm_head.weight"
    return top, layer


def _layer_prefix(c: DecoderConfig) -> str:
    return "transformer.h." if c.arch == "gpt2" else "model.layers."


def _short(keys: list[str]) -> str:
    return ", ".join(keys[:6]) + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")


def read_state_dict(
    c: DecoderConfig, state: Mapping[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
    """The decoder's tensors from a Hugging Face state dict, checked strictly (see above)."""
    top, layer = hf_names(c)
    prefix = _layer_prefix(c)
    wanted = dict(top)
    for i in range(c.num_layers):
        wanted.update({f"{i}.{k}": f"{prefix}{i}.{v}" for k, v in layer.items()})
    used = set(wanted.values())
    missing = sorted(n for n in used if n not in state)
    if missing:
        raise ConfigError("state_dict", _short(missing), "missing from the checkpoint's weights")
    # a tied model's state dict may list lm_head.weight: the embedding itself
    tied_head = {"lm_head.weight"} if c.tie_word_embeddings else set()
    unexpected = sorted(
        k
        for k in state
        if k not in used and k not in tied_head and not k.endswith(_BUFFER_SUFFIXES)
    )
    if unexpected:
        raise ConfigError(
            "state_dict",
            _short(unexpected),
            f"not used by this {c.model_type or c.arch} config: a wrong config, or a feature "
            "it does not declare",
        )
    weights = {k: state[v].detach() for k, v in top.items()}
    if c.tie_word_embeddings:
        weights["lm_head"] = weights["embed"]
    layers = [
        {k: state[f"{prefix}{i}.{v}"].detach() for k, v in layer.items()}
        for i in range(c.num_layers)
    ]
    shape = tuple(weights["embed"].shape)
    if shape != (c.vocab_size, c.hidden_size):
        raise ConfigError(
            "state_dict", f"{top['embed']} {list(shape)}", "must be [vocab_size, hidden_size]"
        )
    return weights, layers


def random_weights(
    c: DecoderConfig, *, seed: int, dtype: torch.dtype, device: torch.device | str
) -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
    """Seeded random tensors under ``hf_names``' names: matrices normal with std 0.02 (HF's
    initializer_range), norms 1 (0 where the norm scales by 1 + weight), biases 0."""
    g = torch.Generator().manual_seed(seed)
    h, d, kvh, inner = c.hidden_size, c.head_dim, c.num_kv_heads, c.intermediate_size
    norm_fill = 0.0 if c.norm_unit_offset else 1.0

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(shape, generator=g) * 0.02).to(dtype=dtype, device=device)

    def fill(n: int, value: float) -> torch.Tensor:
        return torch.full((n,), value, dtype=dtype, device=device)

    if c.arch == "gpt2":  # Conv1D weights are [in, out]
        shapes: dict[str, tuple[int, ...]] = {
            "qkv_w": (h, 3 * h), "qkv_b": (3 * h,), "o_w": (h, h), "o_b": (h,),
            "fc_w": (h, inner), "fc_b": (inner,), "proj_w": (inner, h), "proj_b": (h,),
            "ln1_w": (h,), "ln1_b": (h,), "ln2_w": (h,), "ln2_b": (h,),
        }  # fmt: skip
    else:
        q, kv = c.num_heads * d, kvh * d
        shapes = {
            "q_w": (q, h), "k_w": (kv, h), "v_w": (kv, h), "o_w": (h, q),
            "gate_w": (inner, h), "up_w": (inner, h), "down_w": (h, inner),
            "q_b": (q,), "k_b": (kv,), "v_b": (kv,), "o_b": (h,),
            "gate_b": (inner,), "up_b": (inner,), "down_b": (h,),
            "ln1_w": (h,), "ln2_w": (h,), "q_norm": (d,), "k_norm": (d,),
        }  # fmt: skip
    top, layer = hf_names(c)

    def make(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name.endswith("_b") or name in ("norm_b",):
            return fill(shape[0], 0.0)
        if name.startswith(("ln", "norm_w")) or name.endswith("_norm"):
            return fill(shape[0], 1.0 if c.arch == "gpt2" else norm_fill)
        return normal(*shape)

    weights = {"embed": normal(c.vocab_size, h), "norm_w": make("norm_w", (h,))}
    if c.arch == "gpt2":
        weights["norm_b"] = fill(h, 0.0)
    layers = [{k: make(k, shapes[k]) for k in layer} for _ in range(c.num_layers)]
    if c.arch == "gpt2":
        weights["pos_embed"] = normal(c.max_position, h)
    weights["lm_head"] = weights["embed"] if "lm_head" not in top else normal(c.vocab_size, h)
    return weights, layers

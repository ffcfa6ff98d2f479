"""A small decoder (GPT-2 or the Llama family) whose attention reads and writes the paged KV cache.

A forward pass takes one flattened batch (``ModelInput``): the new tokens of every scheduled
sequence, concatenated, with their positions and cache slots, and per sequence its block table,
context length and query length. Each layer writes the new tokens' K/V into the ``PagedKVCache``
through the slot mapping, then attends with ``paged_attention`` (which reads the whole context,
new tokens included, from the cache). Logits come back only for the rows in ``logits_indices``
(the last token of each sequence that samples): the lm_head is the widest matmul of a tiny model.

Weights come from a Hugging Face model or state dict (``Decoder.from_hf``), or a seeded random
init (``Decoder.random``). The numerics follow the Hugging Face modules the weights come from
(GPT-2's Conv1D weights are ``[in, out]``; Llama's RMSNorm and RoPE compute in float32), so
greedy outputs match ``generate`` token for token (tested).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from pagedkv.errors import ConfigError
from pagedkv.tensors.attention import paged_attention
from pagedkv.tensors.kv_cache import PagedKVCache
from pagedkv.tensors.model_config import DecoderConfig
from pagedkv.tensors.rope import Rope
from pagedkv.tensors.weights import random_weights, read_state_dict


@dataclass
class ModelInput:
    """One flattened batch. ``T`` new tokens over ``S`` sequences, in sequence order."""

    token_ids: torch.Tensor  # [T] long
    positions: torch.Tensor  # [T] long: each token's position in its sequence
    slot_mapping: torch.Tensor  # [T] long: where each token's K/V goes in the cache
    block_tables: list[list[int]]  # [S] physical blocks of each sequence
    context_lens: list[int]  # [S] tokens each sequence attends to (cached + new)
    query_lens: list[int]  # [S] new tokens of each sequence (sum = T)
    logits_indices: torch.Tensor  # [N] long: rows of T whose logits are returned
    prompt_lens: list[int] | None = None  # [S] prompt length of each sequence (longrope); None:
    # each sequence's context length


def _activation(name: str, x: torch.Tensor) -> torch.Tensor:
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return F.gelu(x, approximate="tanh")
    if name == "gelu":
        return F.gelu(x)
    if name == "relu":
        return F.relu(x)
    return F.silu(x)


class Decoder:
    """Weights (plain tensors, one dict per layer) and the forward pass over a paged cache."""

    def __init__(
        self,
        config: DecoderConfig,
        weights: Mapping[str, torch.Tensor],
        layers: list[dict[str, torch.Tensor]],
    ) -> None:
        if len(layers) != config.num_layers:
            raise ConfigError("layers", len(layers), f"must be num_layers = {config.num_layers}")
        self.config = config
        self.weights = dict(weights)
        self.layers = layers
        self.dtype = self.weights["embed"].dtype
        self.device = self.weights["embed"].device
        self.rope = Rope(config, self.device) if config.arch == "llama" else None
        # GPT-2's score scale per layer (scale_attn_weights, scale_attn_by_inverse_layer_idx);
        # None: 1 / sqrt(head_dim)
        self.scales: list[float | None] = [None] * config.num_layers
        if config.arch == "gpt2":
            base = config.head_dim**-0.5 if config.scale_attn_weights else 1.0
            inverse = config.scale_attn_by_inverse_layer_idx
            self.scales = [base / (i + 1) if inverse else base for i in range(config.num_layers)]

    # ----- construction -------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, model: Any, *, config: Any = None) -> Decoder:
        """From a Hugging Face causal LM of a supported family (``pagedkv.tensors.hf_config``),
        or its state dict with ``config`` = its config. The state dict is checked strictly
        (``pagedkv.tensors.weights``). Tensors keep the model's dtype and device."""
        if isinstance(model, Mapping):
            if config is None:
                raise ConfigError("config", None, "a state dict needs its Hugging Face config")
            state: Mapping[str, torch.Tensor] = model
        else:
            state = model.state_dict()
            config = model.config if config is None else config
        cfg = config if isinstance(config, DecoderConfig) else DecoderConfig.from_hf(config)
        weights, layers = read_state_dict(cfg, state)
        return cls(cfg, weights, layers)

    @classmethod
    def random(
        cls,
        config: DecoderConfig,
        *,
        seed: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> Decoder:
        """Random weights from ``seed`` (``weights.random_weights``): the built-in demo."""
        weights, layers = random_weights(config, seed=seed, dtype=dtype, device=device)
        return cls(config, weights, layers)

    def make_cache(
        self, num_blocks: int, block_size: int, *, num_cpu_blocks: int = 0
    ) -> PagedKVCache:
        """A paged cache shaped for this model (its dtype and device)."""
        c = self.config
        return PagedKVCache(
            c.num_layers,
            num_blocks,
            block_size,
            c.num_kv_heads,
            c.head_dim,
            dtype=self.dtype,
            device=self.device,
            num_cpu_blocks=num_cpu_blocks,
        )

    # ----- forward ------------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, inp: ModelInput, cache: PagedKVCache) -> torch.Tensor:
        """Logits ``[len(logits_indices), vocab_size]`` (float32 or wider) of the chosen rows."""
        c = self.config
        if inp.positions.numel() and int(inp.positions.max()) >= c.max_position:
            raise ConfigError(
                "positions", int(inp.positions.max()), f"must be < max_position {c.max_position}"
            )
        w = self.weights
        x = w["embed"][inp.token_ids]
        rope = None
        if c.arch == "gpt2":
            x = x + w["pos_embed"][inp.positions]
        else:
            if c.embed_scale:  # Gemma: sqrt(hidden_size), rounded to the weights' dtype first
                x = x * torch.tensor(c.hidden_size**0.5, dtype=x.dtype)
            rope = self.rotary(inp)
        for i, layer in enumerate(self.layers):
            if c.arch == "gpt2":
                x = self._gpt2_layer(i, layer, x, inp, cache)
            else:
                assert rope is not None
                x = self._llama_layer(i, layer, x, inp, cache, rope)
        return self.logits(x[inp.logits_indices])

    __call__ = forward

    def rotary(self, inp: ModelInput) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) ``[T, head_dim]`` of each of the batch's positions (llama), in HF's
        rotate_half layout; a scaled RoPE may depend on each sequence's prompt length."""
        assert self.rope is not None
        prompts = inp.prompt_lens if inp.prompt_lens is not None else inp.context_lens
        return self.rope.cos_sin(inp.positions, prompts, inp.query_lens, self.dtype)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The final norm and the lm head on rows ``x`` ``[N, hidden]``: ``[N, vocab_size]``."""
        c, w = self.config, self.weights
        if c.arch == "gpt2":
            x = F.layer_norm(x, (c.hidden_size,), w["norm_w"], w["norm_b"], c.norm_eps)
        else:
            x = self._rms_norm(x, w["norm_w"])
        logits = x @ w["lm_head"].T
        return logits.to(torch.promote_types(logits.dtype, torch.float32))

    def _attend(
        self,
        i: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        inp: ModelInput,
        cache: PagedKVCache,
    ) -> torch.Tensor:
        """Write the new K/V, then attend over the cached context: ``[T, heads * head_dim]``."""
        cache.write(i, inp.slot_mapping, k.contiguous(), v.contiguous())
        out = paged_attention(
            q.contiguous(),
            cache.k_caches[i],
            cache.v_caches[i],
            inp.block_tables,
            inp.context_lens,
            inp.query_lens,
            self.scales[i],
            sliding_window=self.config.layer_window(i),
        )
        return out.reshape(out.shape[0], -1)

    def _gpt2_layer(
        self,
        i: int,
        p: dict[str, torch.Tensor],
        x: torch.Tensor,
        inp: ModelInput,
        cache: PagedKVCache,
    ) -> torch.Tensor:
        c = self.config
        n, hd = c.num_heads, c.head_dim
        h = F.layer_norm(x, (c.hidden_size,), p["ln1_w"], p["ln1_b"], c.norm_eps)
        qkv = torch.addmm(p["qkv_b"], h, p["qkv_w"])  # Conv1D: weight is [in, out]
        h3 = c.hidden_size
        q, k, v = (qkv[:, j * h3 : (j + 1) * h3].reshape(-1, n, hd) for j in range(3))
        x = x + torch.addmm(p["o_b"], self._attend(i, q, k, v, inp, cache), p["o_w"])
        h = F.layer_norm(x, (c.hidden_size,), p["ln2_w"], p["ln2_b"], c.norm_eps)
        h = _activation(c.activation, torch.addmm(p["fc_b"], h, p["fc_w"]))
        return x + torch.addmm(p["proj_b"], h, p["proj_w"])

    def _llama_layer(
        self,
        i: int,
        p: dict[str, torch.Tensor],
        x: torch.Tensor,
        inp: ModelInput,
        cache: PagedKVCache,
        rope: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        c = self.config
        h = self._rms_norm(x, p["ln1_w"])
        q = _linear(h, p, "q").reshape(-1, c.num_heads, c.head_dim)
        k = _linear(h, p, "k").reshape(-1, c.num_kv_heads, c.head_dim)
        v = _linear(h, p, "v").reshape(-1, c.num_kv_heads, c.head_dim)
        if c.qk_norm:  # Qwen3: RMSNorm over each head's width, before the rotation
            q, k = self._rms_norm(q, p["q_norm"]), self._rms_norm(k, p["k_norm"])
        q, k = _apply_rope(q, rope), _apply_rope(k, rope)
        x = x + _linear(self._attend(i, q, k, v, inp, cache), p, "o")
        h = self._rms_norm(x, p["ln2_w"])
        h = _activation(c.activation, _linear(h, p, "gate")) * _linear(h, p, "up")
        return x + _linear(h, p, "down")

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # as HF's LlamaRMSNorm: normalise in float32 (or wider), scale in the weights' dtype;
        # Gemma's scales by 1 + weight in float32 and rounds after
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.config.norm_eps)
        if self.config.norm_unit_offset:
            return (wide * (1.0 + weight.to(wide.dtype))).to(x.dtype)
        return weight * wide.to(x.dtype)


def _linear(x: torch.Tensor, p: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """``x @ W.T (+ b)`` for the projection ``name`` (nn.Linear's layout), bias if it has one."""
    return F.linear(x, p[name + "_w"], p.get(name + "_b"))


def _apply_rope(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotate ``x`` ``[T, heads, head_dim]`` by each token's position (RoPE, Su et al. 2021),
    in HF's half-split layout: pairs are (i, i + head_dim / 2)."""
    cos, sin = rope[0][:, None, :], rope[1][:, None, :]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin

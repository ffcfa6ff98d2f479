"""A small decoder (GPT-2 or Llama) whose attention reads and writes the paged KV cache.

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


def _hf_prefixes(arch: str) -> tuple[str, str]:
    return ("transformer.", "transformer.h.") if arch == "gpt2" else ("model.", "model.layers.")


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
        if config.arch == "llama":
            # RoPE inverse frequencies, as HF's default rope: theta^(-2i/d), in float32
            d = config.head_dim
            exponent = torch.arange(0, d, 2, dtype=torch.int64).float() / d
            self.inv_freq = (1.0 / (config.rope_theta**exponent)).to(self.device)

    # ----- construction -------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, model: Any, *, config: Any = None) -> Decoder:
        """From a Hugging Face ``GPT2LMHeadModel``/``LlamaForCausalLM`` (or its state dict with
        ``config`` = its config). Tensors keep the model's dtype and device."""
        if isinstance(model, Mapping):
            if config is None:
                raise ConfigError("config", None, "a state dict needs its Hugging Face config")
            state: Mapping[str, torch.Tensor] = model
        else:
            state = model.state_dict()
            config = model.config if config is None else config
        cfg = DecoderConfig.from_hf(config)
        top, per_layer = _hf_prefixes(cfg.arch)

        def get(name: str) -> torch.Tensor:
            if name not in state:
                raise ConfigError("state_dict", name, "missing from the Hugging Face weights")
            return state[name].detach()

        weights: dict[str, torch.Tensor] = {}
        layers: list[dict[str, torch.Tensor]] = []
        if cfg.arch == "gpt2":
            weights["embed"] = get(top + "wte.weight")
            weights["pos_embed"] = get(top + "wpe.weight")
            weights["norm_w"], weights["norm_b"] = get(top + "ln_f.weight"), get(top + "ln_f.bias")
            names = {
                "ln1_w": "ln_1.weight", "ln1_b": "ln_1.bias",
                "qkv_w": "attn.c_attn.weight", "qkv_b": "attn.c_attn.bias",
                "o_w": "attn.c_proj.weight", "o_b": "attn.c_proj.bias",
                "ln2_w": "ln_2.weight", "ln2_b": "ln_2.bias",
                "fc_w": "mlp.c_fc.weight", "fc_b": "mlp.c_fc.bias",
                "proj_w": "mlp.c_proj.weight", "proj_b": "mlp.c_proj.bias",
            }  # fmt: skip
        else:
            weights["embed"] = get(top + "embed_tokens.weight")
            weights["norm_w"] = get(top + "norm.weight")
            names = {
                "ln1_w": "input_layernorm.weight",
                "q_w": "self_attn.q_proj.weight",
                "k_w": "self_attn.k_proj.weight",
                "v_w": "self_attn.v_proj.weight",
                "o_w": "self_attn.o_proj.weight",
                "ln2_w": "post_attention_layernorm.weight",
                "gate_w": "mlp.gate_proj.weight",
                "up_w": "mlp.up_proj.weight",
                "down_w": "mlp.down_proj.weight",
            }
        for i in range(cfg.num_layers):
            layers.append({k: get(f"{per_layer}{i}.{v}") for k, v in names.items()})
        weights["lm_head"] = (
            state["lm_head.weight"].detach() if "lm_head.weight" in state else (weights["embed"])
        )
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
        """Random weights from ``seed`` (normal, std 0.02, as HF's initializer_range; norms 1,
        biases 0): the built-in demo, no download."""
        g = torch.Generator().manual_seed(seed)
        c = config
        h, d, kvh = c.hidden_size, c.head_dim, c.num_kv_heads

        def normal(*shape: int) -> torch.Tensor:
            return (torch.randn(shape, generator=g) * 0.02).to(dtype=dtype, device=device)

        def ones(n: int) -> torch.Tensor:
            return torch.ones(n, dtype=dtype, device=device)

        def zeros(n: int) -> torch.Tensor:
            return torch.zeros(n, dtype=dtype, device=device)

        weights = {"embed": normal(c.vocab_size, h), "norm_w": ones(h)}
        layers: list[dict[str, torch.Tensor]] = []
        for _ in range(c.num_layers):
            if c.arch == "gpt2":
                layers.append(
                    {
                        "ln1_w": ones(h), "ln1_b": zeros(h),
                        "qkv_w": normal(h, 3 * h), "qkv_b": zeros(3 * h),
                        "o_w": normal(h, h), "o_b": zeros(h),
                        "ln2_w": ones(h), "ln2_b": zeros(h),
                        "fc_w": normal(h, c.intermediate_size), "fc_b": zeros(c.intermediate_size),
                        "proj_w": normal(c.intermediate_size, h), "proj_b": zeros(h),
                    }
                )  # fmt: skip
            else:
                layers.append(
                    {
                        "ln1_w": ones(h),
                        "q_w": normal(c.num_heads * d, h),
                        "k_w": normal(kvh * d, h),
                        "v_w": normal(kvh * d, h),
                        "o_w": normal(h, c.num_heads * d),
                        "ln2_w": ones(h),
                        "gate_w": normal(c.intermediate_size, h),
                        "up_w": normal(c.intermediate_size, h),
                        "down_w": normal(h, c.intermediate_size),
                    }
                )
        if c.arch == "gpt2":
            weights["pos_embed"] = normal(c.max_position, h)
            weights["norm_b"] = zeros(h)
        weights["lm_head"] = weights["embed"] if c.tie_word_embeddings else normal(c.vocab_size, h)
        return cls(c, weights, layers)

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
        if c.arch == "gpt2":
            x = x + w["pos_embed"][inp.positions]
            rope = None
        else:
            rope = self.rope(inp.positions)
        for i, layer in enumerate(self.layers):
            if c.arch == "gpt2":
                x = self._gpt2_layer(i, layer, x, inp, cache)
            else:
                assert rope is not None
                x = self._llama_layer(i, layer, x, inp, cache, rope)
        return self.logits(x[inp.logits_indices])

    __call__ = forward

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) ``[T, head_dim]`` of each position (llama), HF's rotate_half layout."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

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
        q = (h @ p["q_w"].T).reshape(-1, c.num_heads, c.head_dim)
        k = (h @ p["k_w"].T).reshape(-1, c.num_kv_heads, c.head_dim)
        v = (h @ p["v_w"].T).reshape(-1, c.num_kv_heads, c.head_dim)
        q, k = _apply_rope(q, rope), _apply_rope(k, rope)
        x = x + self._attend(i, q, k, v, inp, cache) @ p["o_w"].T
        h = self._rms_norm(x, p["ln2_w"])
        h = _activation(c.activation, h @ p["gate_w"].T) * (h @ p["up_w"].T)
        return x + h @ p["down_w"].T

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # as HF's LlamaRMSNorm: normalise in float32 (or wider), scale in the weights' dtype
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.config.norm_eps)
        return weight * wide.to(x.dtype)


def _apply_rope(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotate ``x`` ``[T, heads, head_dim]`` by each token's position (RoPE, Su et al. 2021),
    in HF's half-split layout: pairs are (i, i + head_dim / 2)."""
    cos, sin = rope[0][:, None, :], rope[1][:, None, :]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin

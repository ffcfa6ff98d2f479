"""Multi-head latent attention (DeepSeek-V2/V3, arXiv 2405.04434): its shapes and what follows.

Keys and values are compressed into one latent of ``kv_lora_rank`` per token, plus a shared
rotary key of ``qk_rope_head_dim``; that is all the cache holds (vLLM's MLA backends cache
exactly this), and every tensor-parallel GPU holds all of it, since the latent is shared by the
heads. Queries optionally go through a low-rank ``q_lora_rank`` bottleneck.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedkv.validation import check_int


@dataclass(frozen=True)
class MLASpec:
    """The shapes of multi-head latent attention (the keys of a DeepSeek-V2/V3 config.json)."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int = 0
    """The query bottleneck's width; 0: queries projected directly (DeepSeek-V2-Lite)."""

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_head_dim", "v_head_dim"):
            check_int(name, getattr(self, name), 1)
        check_int("qk_rope_head_dim", self.qk_rope_head_dim, 0)
        check_int("q_lora_rank", self.q_lora_rank, 0)

    def attention_params(self, hidden: int, heads: int) -> int:
        """One layer: the query path, the K/V down-projection (latent + rotary key) and its
        RMSNorm, the K/V up-projection to every head, the output projection."""
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        if self.q_lora_rank:
            q = hidden * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * heads * qk
        else:
            q = hidden * heads * qk
        kv_down = hidden * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
        kv_up = self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
        return q + kv_down + kv_up + heads * self.v_head_dim * hidden

    @property
    def cached_elements(self) -> int:
        """Elements one token caches in one layer: the latent and the rotary key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def flops_per_pair(self, heads: int) -> int:
        """FLOPs of one (token, position) pair in one layer, with the up-projections absorbed
        into the query and output (how vLLM decodes MLA): per head, a score over the latent and
        the rotary key and a weighted sum of latents, 2 FLOPs per multiply-add. Prefill, which
        vLLM runs on up-projected keys and values, costs less than this."""
        return heads * (2 * self.cached_elements + 2 * self.kv_lora_rank)

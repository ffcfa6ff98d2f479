"""Rotary position embeddings (RoPE, Su et al. 2021) and their context-extension variants.

Every variant rotates the pair ``(i, i + head_dim / 2)`` of a head by ``position x inv_freq[i]``
and may scale cos and sin by an ``attention_factor``; the variants differ in ``inv_freq``
(formulas as transformers' ``modeling_rope_utils`` computes them, in float32, so the weights of
a checkpoint see the angles they were trained with):

* ``default``: ``inv_freq[i] = theta^(-2i / d)``.
* ``linear`` (position interpolation, Chen et al. 2023): ``default / factor``.
* ``dynamic`` (dynamic NTK): the base grows once a sequence is longer than
  ``max_position_embeddings``; the decoder serves no longer sequence, so here it is ``default``.
* ``llama3`` (Llama 3.1): wavelengths longer than ``original / low_freq_factor`` are divided by
  ``factor``, shorter than ``original / high_freq_factor`` kept, and those between blended.
* ``yarn`` (Peng et al. 2023): interpolated and extrapolated frequencies blended over a ramp of
  dimensions between ``beta_fast`` and ``beta_slow`` rotations; cos and sin scaled by
  ``0.1 ln(factor) + 1`` (or the ``mscale`` ratio, or ``attention_factor``).
* ``proportional``: ``default / factor`` on the first ``partial_rotary_factor`` of the
  pairs, frequency 0 (no rotation) on the rest.
* ``longrope`` (Phi-3): ``default / short_factor`` for a sequence no longer than
  ``original_max_position_embeddings``, ``default / long_factor`` beyond; cos and sin scaled by
  ``sqrt(1 + ln(factor) / ln(original))``. transformers picks the set per forward call, by
  the call's longest position: in ``generate`` a prompt's tokens use the long set iff the
  prompt is longer than ``original``, and each later token iff its own position + 1 is. Here
  the same rule is a function of the token alone, ``max(prompt_len, position + 1) > original``,
  so a token's rotation does not depend on the schedule: a recompute after preemption, or a
  prompt split into chunks, rotates every token exactly as the first computation did.
"""

from __future__ import annotations

import math

import torch

from pagedkv.tensors.model_config import DecoderConfig


def _base_inv_freq(theta: float, dim: int) -> torch.Tensor:
    exponent = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (theta**exponent)


def _llama3(c: DecoderConfig, inv: torch.Tensor) -> torch.Tensor:
    factor = float(c.rope_param("factor"))
    low, high = float(c.rope_param("low_freq_factor")), float(c.rope_param("high_freq_factor"))
    original = float(c.rope_param("original_max_position_embeddings"))
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > original / low, inv / factor, inv)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    between = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(between, blended, scaled)


def _yarn(c: DecoderConfig) -> tuple[torch.Tensor, float]:
    d, base = c.head_dim, c.rope_theta
    original = float(c.rope_param("original_max_position_embeddings"))
    factor = c.rope_param("factor")
    factor = float(factor) if factor is not None else c.max_position / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = c.rope_param("attention_factor")
    m, m_all = c.rope_param("mscale"), c.rope_param("mscale_all_dim")
    if attention is None:
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    fast = float(c.rope_param("beta_fast") or 32)
    slow = float(c.rope_param("beta_slow") or 1)

    def dim_of(rotations: float) -> float:  # the dimension that turns `rotations` times
        return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = dim_of(fast), dim_of(slow)
    if c.rope_param("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    if lo == hi:
        hi += 0.001  # as transformers: a ramp of width zero would divide by zero
    ramp = torch.clamp((torch.arange(d // 2, dtype=torch.float32) - lo) / (hi - lo), 0, 1)
    powers = base ** (torch.arange(0, d, 2).float() / d)
    keep = 1 - ramp  # 1: extrapolate (high frequency), 0: interpolate
    inv = (1.0 / (factor * powers)) * (1 - keep) + (1.0 / powers) * keep
    return inv, float(attention)


class Rope:
    """The inverse frequencies of a config (two sets for longrope) and the cos/sin of a batch."""

    def __init__(self, config: DecoderConfig, device: torch.device | str) -> None:
        c = config
        self.config = c
        inv = _base_inv_freq(c.rope_theta, c.head_dim)
        self.attention_factor = 1.0
        self.long_inv_freq: torch.Tensor | None = None
        self.threshold = 0
        kind = c.rope_type
        if kind == "linear":
            inv = inv / float(c.rope_param("factor"))
        elif kind == "llama3":
            inv = _llama3(c, inv)
        elif kind == "proportional":
            d = c.head_dim
            rotated = int(float(c.rope_param("partial_rotary_factor", 1.0)) * d // 2)
            powers = c.rope_theta ** (torch.arange(0, 2 * rotated, 2).float() / d)
            inv = torch.cat((1.0 / powers, torch.zeros(d // 2 - rotated)))
            inv = inv / float(c.rope_param("factor", 1.0))
        elif kind == "yarn":
            inv, self.attention_factor = _yarn(c)
        elif kind == "longrope":
            original = int(c.rope_param("original_max_position_embeddings"))
            factor = c.rope_param("factor")
            factor = float(factor) if factor is not None else c.max_position / original
            attention = c.rope_param("attention_factor")
            if attention is None:
                attention = (
                    1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
                )
            self.attention_factor = float(attention)
            powers = c.rope_theta ** (torch.arange(0, c.head_dim, 2).float() / c.head_dim)
            long = torch.tensor(c.rope_param("long_factor"), dtype=torch.float32)
            short = torch.tensor(c.rope_param("short_factor"), dtype=torch.float32)
            self.long_inv_freq = (1.0 / (long * powers)).to(device)
            inv = 1.0 / (short * powers)
            self.threshold = original
        self.inv_freq = inv.to(device)

    def cos_sin(
        self,
        positions: torch.Tensor,
        prompt_lens: list[int],
        query_lens: list[int],
        dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[T, head_dim]`` of the batch's tokens (``prompt_lens`` and
        ``query_lens``: one per sequence), in transformers' half-split layout, scaled by the
        attention factor and cast to ``dtype``."""
        inv = self.inv_freq[None, :]
        if self.long_inv_freq is not None:
            device = inv.device
            prompt = torch.repeat_interleave(
                torch.tensor(prompt_lens, device=device), torch.tensor(query_lens, device=device)
            )
            longer = torch.maximum(prompt, positions + 1) > self.threshold
            inv = torch.where(longer[:, None], self.long_inv_freq[None, :], inv)
        freqs = positions.float()[:, None] * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.to(dtype), sin.to(dtype)

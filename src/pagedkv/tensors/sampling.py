"""Sampling: greedy, or seeded draws that depend on the request, never on the schedule.

As vLLM's per-request ``seed``: a request's sampled tokens are a function of its seed and its
prompt only. One shared generator would not do: which rows a step samples, and in which order,
depend on the batch (preemption, chunked prefill, other requests), so a shared stream hands a
request different numbers under a different schedule. Here every draw has its own counter-based
seed, ``draw_seed(request seed, sample index, token index)`` (the sample's index in its group
for parallel sampling, the output token's index in the sample), and a fresh
``torch.Generator`` seeded with it draws from ``softmax(logits / temperature)``. A request's
seed is given per request id, or derived from the run's ``seed`` and the request id.

Stop tokens (EOS and ``stop_token_ids``, vLLM's names): a single-sequence request whose sampled
token is one of them stops there, the stop token its last output (as vLLM's ``token_ids``).
Parallel samples and beams run their full length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pagedkv.errors import ConfigError
from pagedkv.validation import check_int

_MASK64 = (1 << 64) - 1


def _mix(x: int) -> int:
    """SplitMix64's finaliser (Steele, Lea & Flood 2014): a bijection of 64-bit ints that
    spreads nearby inputs far apart."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def request_seed(run_seed: int, request_id: int) -> int:
    """The seed of a request that was given none: one stream per (run seed, request id)."""
    return _mix(_mix(run_seed) ^ request_id) >> 1


def draw_seed(seed: int, sample_index: int, token_index: int) -> int:
    """The seed of one draw; a torch.Generator takes seeds below 2^63, hence the shift."""
    return _mix(_mix(_mix(seed) ^ sample_index) ^ token_index) >> 1


@dataclass(frozen=True)
class SamplingConfig:
    """Greedy (temperature 0) or seeded sampling from softmax(logits / temperature), and the
    tokens that stop a request."""

    temperature: float = 0.0
    seed: int = 0
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0:
            raise ConfigError("temperature", t, "must be a number >= 0 (0: greedy)")
        check_int("seed", self.seed, 0)
        if not isinstance(self.stop_token_ids, tuple):
            raise ConfigError("stop_token_ids", self.stop_token_ids, "must be a tuple of ids")
        for t_id in self.stop_token_ids:
            check_int("stop_token_ids", t_id, 0)


def sample_rows(logits: torch.Tensor, temperature: float, seeds: Sequence[int]) -> torch.Tensor:
    """One token per row of ``logits``: argmax at temperature 0, else a draw with the row's
    own seed (``draw_seed``)."""
    if logits.shape[0] == 0:
        return torch.empty(0, dtype=torch.long)
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    out = torch.empty(len(seeds), dtype=torch.long)
    for i, seed in enumerate(seeds):
        g = torch.Generator(device=probs.device).manual_seed(seed)
        out[i] = torch.multinomial(probs[i], 1, generator=g)
    return out

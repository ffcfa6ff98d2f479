"""A mixture-of-experts MLP's shapes (Mixtral, Qwen-MoE, DeepSeek): the parameters it holds and
the parameters one token goes through. ``ModelSpec.moe`` holds one; ``hf_layers.moe_spec``
reads it from a config.json's keys.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedkv.errors import ConfigError
from pagedkv.validation import check_bool, check_int


@dataclass(frozen=True)
class MoESpec:
    """A mixture-of-experts MLP: a router picks ``experts_per_token`` of ``num_experts`` experts
    (each a gated MLP of ``expert_intermediate_size``) for every token, on ``num_moe_layers``
    layers (the others keep the dense MLP); an optional shared expert runs on every token."""

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    num_moe_layers: int
    shared_intermediate_size: int = 0
    """The always-active shared expert's width (Qwen2-MoE; DeepSeek's n_shared_experts x
    moe_intermediate_size); 0: none."""
    shared_expert_gate: bool = False
    """Qwen2-MoE scales the shared expert by a sigmoid gate: one hidden -> 1 matrix."""
    router_bias: bool = False
    """DeepSeek-V3's router adds a learned bias per expert (e_score_correction_bias)."""

    def __post_init__(self) -> None:
        check_int("num_experts", self.num_experts, 1)
        check_int("experts_per_token", self.experts_per_token, 1)
        if self.experts_per_token > self.num_experts:
            raise ConfigError(
                "experts_per_token", self.experts_per_token, f"must be <= {self.num_experts}"
            )
        check_int("expert_intermediate_size", self.expert_intermediate_size, 1)
        check_int("num_moe_layers", self.num_moe_layers, 1)
        check_int("shared_intermediate_size", self.shared_intermediate_size, 0)
        check_bool("shared_expert_gate", self.shared_expert_gate)
        check_bool("router_bias", self.router_bias)

    def mlp_params(self, hidden: int, *, active: bool) -> int:
        """One MoE layer's MLP: experts (all, or those a token uses), router, shared expert."""
        experts = self.experts_per_token if active else self.num_experts
        routed = experts * 3 * hidden * self.expert_intermediate_size
        shared = 3 * hidden * self.shared_intermediate_size
        gate = hidden if self.shared_expert_gate else 0
        router = (hidden + 1 if self.router_bias else hidden) * self.num_experts
        return routed + router + shared + gate

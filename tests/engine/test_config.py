"""SchedulerConfig: the token budget's defaults, and a budget that cannot schedule is refused."""

from __future__ import annotations

import dataclasses

import pytest

from pagedkv.engine.config import SchedulerConfig
from pagedkv.errors import ConfigError


@pytest.mark.parametrize(
    ("kwargs", "budget"),
    [
        ({}, 2048),  # vLLM v0: max(max_model_len, 2048)
        ({"max_model_len": 4096}, 4096),
        ({"enable_chunked_prefill": True, "max_model_len": 4096}, 2048),  # vLLM v1's default
        ({"max_num_batched_tokens": 5000, "max_model_len": 4096}, 5000),
    ],
)
def test_token_budget_defaults(kwargs: dict[str, object], budget: int) -> None:
    assert SchedulerConfig(**kwargs).token_budget == budget  # type: ignore[arg-type]


def test_token_budget_follows_a_replaced_config() -> None:
    """A replaced config works out its own budget; the original keeps its."""
    config = SchedulerConfig()
    assert config.token_budget == 2048
    bigger = dataclasses.replace(config, max_model_len=8192)
    assert bigger.token_budget == 8192
    assert config.token_budget == 2048
    assert bigger != config


def test_a_budget_below_the_longest_prompt_is_refused_without_chunking() -> None:
    with pytest.raises(ConfigError) as info:
        SchedulerConfig(max_num_batched_tokens=1000, max_model_len=2048)
    assert info.value.field == "max_num_batched_tokens"

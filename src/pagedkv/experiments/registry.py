"""Every experiment by its name (``pagedkv experiment NAME``), in the order reproduce runs them."""

from __future__ import annotations

from types import ModuleType

from pagedkv.errors import ConfigError
from pagedkv.experiments import (
    block_size,
    chat,
    eviction,
    fragmentation,
    lesson,
    memory_pressure,
    preemption,
    prefix_sharing,
    rate_latency,
    sampling,
    shared_prefix,
)

EXPERIMENTS: dict[str, ModuleType] = {
    m.NAME: m
    for m in (lesson, fragmentation, block_size, memory_pressure, rate_latency, preemption)
}
EXPERIMENTS.update({m.NAME: m for m in (prefix_sharing, shared_prefix, chat)})  # sharing
EXPERIMENTS[eviction.NAME] = eviction  # sharing: the prefix cache's eviction policies
EXPERIMENTS[sampling.NAME] = sampling  # sharing: parallel sampling and beam search


def get_experiment(name: str) -> ModuleType:
    """The experiment module named ``name``, or a ConfigError listing the names."""
    if name not in EXPERIMENTS:
        raise ConfigError("experiment", name, "must be one of " + ", ".join(EXPERIMENTS))
    return EXPERIMENTS[name]

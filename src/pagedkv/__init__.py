"""pagedkv: the memory operating system of an LLM inference engine, and the lab bench to study it.

Importing the package (or ``pagedkv.memory``) never imports torch; only ``pagedkv.tensors`` does.
"""

from pagedkv.errors import (
    ConfigError,
    IntegrityError,
    PagedKVError,
    UnknownSequenceError,
    UnsupportedOperationError,
)

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``pagedkv.simulate`` and ``pagedkv.SimulationConfig``, imported on first use so that
    ``import pagedkv.memory`` stays light."""
    if name in ("simulate", "SimulationConfig", "SimulationResult"):
        from pagedkv import simulation

        return getattr(simulation, name)
    raise AttributeError(f"module 'pagedkv' has no attribute {name!r}")


__all__ = [
    "ConfigError",
    "IntegrityError",
    "PagedKVError",
    "SimulationConfig",
    "SimulationResult",
    "UnknownSequenceError",
    "UnsupportedOperationError",
    "__version__",
    "simulate",
]

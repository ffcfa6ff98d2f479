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

__all__ = [
    "ConfigError",
    "IntegrityError",
    "PagedKVError",
    "UnknownSequenceError",
    "UnsupportedOperationError",
    "__version__",
]

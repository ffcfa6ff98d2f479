"""The package's exceptions: one base class, typed subclasses.

Control flow never uses exceptions: "no room" is returned as ``None``/``False`` or an
``AllocStatus``. Exceptions signal bad input (``ConfigError``), misuse of an API
(``UnknownSequenceError``, ``UnsupportedOperationError``) or a broken invariant
(``IntegrityError``), i.e. a bug.
"""

from __future__ import annotations


class PagedKVError(Exception):
    """Base class of every error raised by pagedkv."""


class ConfigError(PagedKVError, ValueError):
    """A configuration value is invalid; the message names the field, the value, what is allowed."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}: got {value!r}; {allowed}")


class UnknownSequenceError(PagedKVError, KeyError):
    """An operation named a sequence id the allocator does not hold (or already holds)."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else ""


class UnsupportedOperationError(PagedKVError, NotImplementedError):
    """The allocator cannot do this by design (for example: swap on a contiguous allocator)."""


class IntegrityError(PagedKVError, AssertionError):
    """The books disagree with themselves: a bug, never a normal outcome."""

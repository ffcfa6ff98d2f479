"""The package's exceptions: one base class, typed subclasses.

Control flow never uses exceptions: "no room" is returned as ``None``/``False`` or an
``AllocStatus``. Exceptions signal bad input (``ConfigError``), misuse of an API
(``UnknownSequenceError``, ``UnsupportedOperationError``) or a broken invariant
(``IntegrityError``), i.e. a bug.
"""

from __future__ import annotations

import reprlib


class PagedKVError(Exception):
    """Base class of every error raised by pagedkv."""


class _Shown(reprlib.Repr):
    """How a bad value is shown: a long string or number whole up to a point, a deep or long
    container cut (a small YAML file's aliases can nest 10^9 items)."""

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 3000:  # str() of an int over 4300 digits raises
            return f"<an integer of about {int(x.bit_length() * 0.30103)} digits>"
        return super().repr_int(x, level)


_SHOWN = _Shown()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxtuple, _SHOWN.maxdict = 2, 8, 8, 8
_SHOWN.maxset = _SHOWN.maxfrozenset = _SHOWN.maxdeque = 8
_SHOWN.maxstring, _SHOWN.maxlong, _SHOWN.maxother = 400, 1000, 200


class ConfigError(PagedKVError, ValueError):
    """A configuration value is invalid; the message names the field, the value, what is allowed."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}: got {_SHOWN.repr(value)}; {allowed}")


class UnknownSequenceError(PagedKVError, KeyError):
    """An operation named a sequence id the allocator does not hold (or already holds)."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else ""


class UnsupportedOperationError(PagedKVError, NotImplementedError):
    """The allocator cannot do this by design (for example: swap on a contiguous allocator)."""


class IntegrityError(PagedKVError, AssertionError):
    """The books disagree with themselves: a bug, never a normal outcome."""

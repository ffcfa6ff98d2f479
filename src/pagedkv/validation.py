"""Helpers for frozen, validated config dataclasses.

Each config field carries its help text in ``metadata["help"]`` (the CLI reuses it), and each
``__post_init__`` validates with the checks below, raising ``ConfigError`` that names the field,
the value given and what is allowed, before any work starts.
"""

from __future__ import annotations

import dataclasses
import enum
import operator
from typing import Any, TypeVar

from pagedkv.errors import ConfigError

E = TypeVar("E", bound=enum.Enum)


def help_field(default: Any, help: str) -> Any:
    """A dataclass field with a default and its help text."""
    return dataclasses.field(default=default, metadata={"help": help})


def field_help(cls: type, name: str) -> str:
    """The help text of one field of a config dataclass."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            return str(f.metadata.get("help", ""))
    raise KeyError(name)


def check_int(field: str, value: object, minimum: int | None = None) -> int:
    """``value`` must be an int (not a bool, not a float) and at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        pass
    elif minimum is None or value >= minimum:
        return value  # the message below is only built for an error: this is on hot paths
    allowed = "must be an integer" + (f" >= {minimum}" if minimum is not None else "")
    raise ConfigError(field, value, allowed)


def as_int(field: str, value: object, minimum: int | None = None) -> int:
    """``value`` as a plain ``int``, at least ``minimum``: an int or any integer type with
    ``__index__`` (numpy's, ``numbers.Integral``), as ``operator.index`` takes them. Refused:
    floats (even 3.0: a count that arrives as a float is a mistake upstream), strings, and
    bools (an int subclass, but ``True`` as a count is a mistake too). The memory API's counts
    go through this; config fields use ``check_int`` (plain ints, as files and flags give)."""
    if type(value) is not int:  # the hot path is one type check
        try:
            if isinstance(value, bool):
                raise TypeError
            value = int(operator.index(value))  # type: ignore[arg-type]
        except TypeError:
            raise ConfigError(field, value, _int_allowed(minimum)) from None
    if minimum is not None and value < minimum:
        raise ConfigError(field, value, _int_allowed(minimum))
    return value


def _int_allowed(minimum: int | None) -> str:
    return "must be an integer" + (f" >= {minimum}" if minimum is not None else "")


def check_fraction(field: str, value: object, *, lo: float = 0.0, hi: float = 1.0) -> float:
    """``value`` must be a real number in ``[lo, hi)`` (``hi`` excluded)."""
    allowed = f"must be a number in [{lo}, {hi})"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, value, allowed)
    if not (lo <= float(value) < hi):
        raise ConfigError(field, value, allowed)
    return float(value)


def check_bool(field: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(field, value, "must be true or false")
    return value


def check_choice(field: str, value: object, enum_type: type[E]) -> E:
    """Coerce a string (or the enum itself) into ``enum_type``, naming the allowed values if not."""
    if isinstance(value, enum_type):
        return value
    for member in enum_type:
        if value == member.value:
            return member
    allowed = "must be one of " + ", ".join(repr(m.value) for m in enum_type)
    raise ConfigError(field, value, allowed)

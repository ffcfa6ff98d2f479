"""Helpers for frozen, validated config dataclasses.

Each config field carries its help text in ``metadata["help"]`` (the CLI reuses it), and each
``__post_init__`` validates with the checks below, raising ``ConfigError`` that names the field,
the value given and what is allowed, before any work starts.

A numeric field is declared with its finite bounds (``int_field``, ``float_field``): they are
stored in ``metadata["bounds"]``, appended to the help text ("Allowed: an integer in [1,
65536].") and checked by ``check_bounds(config)`` at the top of ``__post_init__``. A float
field rejects NaN and the infinities; every bound is finite, so no value that passes can
overflow what it sizes later.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import operator
import os
import stat
from dataclasses import dataclass
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


def check_int(
    field: str, value: object, minimum: int | None = None, maximum: int | None = None
) -> int:
    """``value`` must be an int (not a bool, not a float), at least ``minimum`` and at most
    ``maximum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        pass
    elif (minimum is None or value >= minimum) and (maximum is None or value <= maximum):
        return value  # the message below is only built for an error: this is on hot paths
    if minimum is not None and maximum is not None:
        allowed = f"must be an integer in [{minimum}, {maximum}]"
    elif maximum is not None:
        allowed = f"must be an integer <= {maximum}"
    else:
        allowed = "must be an integer" + (f" >= {minimum}" if minimum is not None else "")
    raise ConfigError(field, value, allowed)


def check_float(
    field: str,
    value: object,
    lo: float,
    hi: float,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
) -> float:
    """``value`` must be a real number (an int or a float, not a bool, not NaN, not infinite)
    in the range from ``lo`` to ``hi`` (each end excluded when its ``*_open`` is set)."""
    allowed = "must be " + Bounds(lo, hi, False, lo_open, hi_open).describe()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, value, allowed)
    x = float(value) if isinstance(value, float) or abs(value) < 2**1023 else math.inf
    above = x > lo if lo_open else x >= lo
    below = x < hi if hi_open else x <= hi
    if not (math.isfinite(x) and above and below):
        raise ConfigError(field, value, allowed)
    return x


@dataclass(frozen=True)
class Bounds:
    """The finite range a numeric config field allows (see the module docstring)."""

    lo: float
    hi: float
    integer: bool
    lo_open: bool = False
    hi_open: bool = False

    def describe(self) -> str:
        """``an integer in [1, 65536]`` / ``a finite number in (0, 1)``."""
        left, right = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
        kind = "an integer" if self.integer else "a finite number"
        return f"{kind} in {left}{_num(self.lo)}, {_num(self.hi)}{right}"

    def check(self, field: str, value: object) -> Any:
        if self.integer:
            return check_int(field, value, int(self.lo), int(self.hi))
        check_float(field, value, self.lo, self.hi, lo_open=self.lo_open, hi_open=self.hi_open)
        return value  # kept as given (an int stays an int: the config's JSON does not change)


def _num(x: float) -> str:
    if isinstance(x, int) or x.is_integer():
        n = int(x)
        return f"2^{n.bit_length() - 1}" if n >= 2**20 and n & (n - 1) == 0 else str(n)
    return repr(x)


def int_field(default: Any, help: str, lo: int, hi: int) -> Any:
    """A dataclass field holding an integer in ``[lo, hi]`` (or the default, None included)."""
    return bounded_field(default, help, Bounds(lo, hi, True))


def float_field(
    default: Any, help: str, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False
) -> Any:
    """A dataclass field holding a finite real number between ``lo`` and ``hi``."""
    return bounded_field(default, help, Bounds(lo, hi, False, lo_open, hi_open))


def bounded_field(default: Any, help: str, bounds: Bounds) -> Any:
    text = f"{help} Allowed: {bounds.describe()}."
    return dataclasses.field(default=default, metadata={"help": text, "bounds": bounds})


def check_bounds(config: object) -> None:
    """Check every field of ``config`` declared with bounds (None passes: "unset")."""
    assert dataclasses.is_dataclass(config)
    for f in dataclasses.fields(config):
        bounds = f.metadata.get("bounds")
        value = getattr(config, f.name)
        if bounds is not None and value is not None:
            object.__setattr__(config, f.name, bounds.check(f.name, value))


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


MAX_TEXT_BYTES = 64 << 20
"""The largest config, spec or other small input file read (64 MiB); traces pass their own."""
MAX_STREAM_BYTES = 256 << 20
"""The most read from a pipe or a device (its size is not known before): /dev/zero ends here."""


def read_text(field: str, path: str | os.PathLike[str], max_bytes: int = MAX_TEXT_BYTES) -> str:
    """The UTF-8 text of the file at ``path``, a leading byte order mark dropped; one
    ``ConfigError`` naming ``field`` and the file (and the line of a byte that is not UTF-8)
    when it is missing, a directory, unreadable, longer than ``max_bytes`` (a regular file is
    refused by its size, unread; anything else, a pipe or a device, once it has given that
    much) or not UTF-8."""
    name = os.fspath(path)
    too_long = f"must be at most {max_bytes} bytes"
    try:
        with open(name, "rb") as f:
            info = os.fstat(f.fileno())
            if stat.S_ISREG(info.st_mode):
                if info.st_size > max_bytes:
                    raise ConfigError(field, name, f"{too_long} (it has {info.st_size})")
                data = f.read()
            else:  # a pipe or a device: in chunks (read(n) would set aside n bytes first)
                limit = min(max_bytes, MAX_STREAM_BYTES)
                chunks: list[bytes] = []
                got = 0
                while got <= limit and (chunk := f.read(1 << 20)):
                    chunks.append(chunk)
                    got += len(chunk)
                if got > limit:
                    raise ConfigError(field, name, f"must be at most {limit} bytes")
                data = b"".join(chunks)
    except IsADirectoryError:
        raise ConfigError(field, name, "must be a file, not a directory") from None
    except FileNotFoundError:
        raise ConfigError(field, name, "no such file") from None
    except OSError as e:
        raise ConfigError(field, name, f"cannot be read ({e.strerror or e})") from None
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(
            field, name, f"must be UTF-8 text (line {line}: byte 0x{data[e.start]:02x} is not)"
        ) from None


def read_yaml(field: str, path: str | os.PathLike[str]) -> Any:
    """The YAML document of the file at ``path`` (safe loader; None when empty), or one
    ``ConfigError`` naming the file and the line of the problem."""
    import yaml

    text = read_text(field, path)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or type(e).__name__
        raise ConfigError(
            field, os.fspath(path), f"must be valid YAML ({where}{problem})"
        ) from None
    except ValueError as e:  # an integer of over 4300 digits
        raise ConfigError(field, os.fspath(path), f"must be valid YAML ({e})") from None


JsonShape = dict[str, tuple[type, type | None]]
"""key -> (the JSON type of its value, the type of each item when it is a list, or None)."""


def check_json_shape(where: str, data: object, shape: JsonShape, *, required: bool) -> None:
    """``data`` must be a JSON object whose keys of ``shape`` (all present when ``required``)
    have the types ``shape`` names; one ``ConfigError`` naming ``where`` (the file) and the key
    otherwise, so a file of the wrong shape is refused before anything reads it."""
    names = {dict: "an object", list: "a list", str: "a string", int: "an integer"}
    plurals = {dict: "objects", list: "lists", str: "strings", int: "integers"}
    if not isinstance(data, dict):
        raise ConfigError(where, type(data).__name__, "must be a JSON object")
    for key, (kind, item) in shape.items():
        if key not in data:
            if required:
                raise ConfigError(f"{where}: {key}", None, "is missing")
            continue
        value = data[key]
        allowed = f"must be {names.get(kind, kind.__name__)}"
        if item is not None:
            allowed += f" of {plurals.get(item, item.__name__)}"
        items = value if isinstance(value, list) else []
        if not isinstance(value, kind) or (
            item is not None and not all(isinstance(v, item) for v in items)
        ):
            raise ConfigError(f"{where}: {key}", _short(value), allowed)


def _short(value: object, limit: int = 60) -> object:
    text = repr(value)
    return value if len(text) <= limit else text[: limit - 3] + "..."

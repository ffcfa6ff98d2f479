"""The simulated clock's unit: time inside the engine is an integer count of ticks.

Every step price, swap, arrival and time-weighted total is a Python int of ticks, so the
reference loop's round-by-round sums and the fast path's closed-form series are the same
integers, and both paths give byte-identical results. Floats appear only at the edges: seconds
become ticks once, where they enter (``to_ticks``), and ticks are read as seconds by
``to_seconds``. A tick is an attosecond: fine enough that quantising a coefficient moves a
step's price by under 1e-9 of it for every built-in GPU x model (``tests/engine/test_clock.py``;
docs/architecture.md, "The clock is exact").
"""

from __future__ import annotations

from pagedkv.errors import ConfigError

TICKS_PER_SECOND = 10**18
"""Ticks in one simulated second (attoseconds). The unit clock's step is one second."""


def to_ticks(seconds: float, field: str = "seconds") -> int:
    """``seconds`` as the nearest tick (round half to even of seconds x TICKS_PER_SECOND,
    the one rounding rule: the product in floating point, then Python's ``round``);
    ConfigError naming ``field`` for a value that is not a finite number."""
    try:
        return round(seconds * TICKS_PER_SECOND)
    except (OverflowError, ValueError):  # infinite, NaN
        raise ConfigError(field, seconds, "must be a finite number of seconds") from None


def to_seconds(ticks: int) -> float:
    """``ticks`` in seconds: the correctly rounded float of ticks / TICKS_PER_SECOND (a true
    division of two ints), the same float whichever path computed the ticks."""
    return ticks / TICKS_PER_SECOND

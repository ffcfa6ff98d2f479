"""The console every command prints its tables to, and the number formats they share."""

from __future__ import annotations

import errno
import math
import os

from rich.console import Console

PIPED_WIDTH = 120
"""Width of tables written to a pipe or file when ``COLUMNS`` does not say: wide enough for
every table whole (a terminal, or ``COLUMNS``, sets the width otherwise)."""


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """rich's own way out is exit 1; pass the closed pipe on to the command's ``main``,
        which ends quietly (exit 141)."""
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def make_console(*, stderr: bool = False) -> Console:
    """A terminal's own width; piped output honours ``COLUMNS``, else ``PIPED_WIDTH``."""
    console = _Console(stderr=stderr)
    if not console.is_terminal and not os.environ.get("COLUMNS", "").strip().isdigit():
        console = _Console(stderr=stderr, width=PIPED_WIDTH)
    return console


def fmt_sig(value: float, digits: int = 3) -> str:
    """``value`` to ``digits`` significant figures in plain decimal notation, with thousands
    separators: never scientific notation, never a trailing point (187 ms, not "187." ms;
    0.00012, not 1.2e-04); figures left of the point are all kept (12,345 stays whole)."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    if abs(value) >= 10 ** (digits - 1):
        return f"{value:,.0f}"
    rounded = float(f"{value:.{digits - 1}e}")  # first round, so a carry (9.996) counts
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(rounded))))
    return f"{rounded:,.{decimals}f}"

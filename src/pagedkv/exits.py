"""How a ``pagedkv`` command ends: its exit codes, defined once, and the lines on stderr that
explain the unhappy ones. ``docs/cli.md`` has the same table (a test keeps them equal), and
``pagedkv --help`` prints it."""

from __future__ import annotations

import importlib.util
import re
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

EXIT_OK = 0
EXIT_BUG = 1  # Python's own code for an uncaught exception: never returned on purpose
EXIT_BAD_INPUT = 2  # argparse's code for a bad command line too
EXIT_DEADLOCK = 3
EXIT_SERVED_NOTHING = 4
EXIT_WRITE_FAILED = 5
EXIT_MISSING_EXTRA = 6
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for `... | head -1`

EXIT_CODES: tuple[tuple[int, str, str], ...] = (
    (EXIT_OK, "done", "every command"),
    (
        EXIT_BUG,
        "an unexpected error, with a Python traceback: a bug in pagedkv, please report it",
        "any",
    ),
    (
        EXIT_BAD_INPUT,
        "bad input: an option, a config, spec or trace file, or an output destination that "
        "cannot be written; one line on stderr names it; checked before any work, nothing "
        "is written",
        "every command",
    ),
    (
        EXIT_DEADLOCK,
        "the run deadlocked: the stuck requests are named on stderr; --json is still "
        "written, complete",
        "simulate, generate",
    ),
    (
        EXIT_SERVED_NOTHING,
        "the run served nothing (every request rejected, or none given): the reasons on "
        "stderr, counted and grouped; --json is still written",
        "simulate, generate",
    ),
    (
        EXIT_WRITE_FAILED,
        "the work finished but an output could not be written (a full disk, a vanished "
        "directory): one line names the path; no partial file is left",
        "every command that writes",
    ),
    (
        EXIT_MISSING_EXTRA,
        "the command needs an optional dependency that is not installed: one line names "
        "the extra to install (pip install 'pagedkv[torch]'); nothing ran",
        "generate, experiment, reproduce, report, plan, sweep",
    ),
    (
        EXIT_INTERRUPTED,
        "interrupted (Ctrl-C): one line on stderr; no temporary file is left (sweep keeps "
        "its finished points)",
        "every command",
    ),
    (
        EXIT_BROKEN_PIPE,
        "standard output was closed early (`pagedkv ... | head -1`); nothing on stderr",
        "every command",
    ),
)
"""(code, meaning, commands): the one table of exit codes."""

EXTRAS = {
    "torch": "torch",
    "safetensors": "torch",
    "tokenizers": "torch",
    "matplotlib": "plot",
    "scipy": "plot",
    "pandas": "data",
    "ray": "ray",
    "pyarrow": "sweep",
    "transformers": "hf",
}
"""Optional top-level module -> the pyproject.toml extra that installs it."""


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The one line for an optional module that is not installed, or None if ``exc`` is
    about any other module (a bug: let it show)."""
    name = (exc.name or "").split(".")[0]
    extra = EXTRAS.get(name)
    if extra is None:
        return None
    return f"this command needs {name}, which is not installed: pip install 'pagedkv[{extra}]'"


def epilog() -> str:
    """The exit codes, for ``pagedkv --help``."""
    lines = ["exit codes (docs/cli.md):"]
    for code, meaning, commands in EXIT_CODES:
        lines.append(
            textwrap.fill(
                f"{meaning} [{commands}]",
                width=88,
                initial_indent=f"  {code:<4} ",
                subsequent_indent=" " * 7,
            )
        )
    return "\n".join(lines) + "\n"


MAX_REASONS = 3
"""How many groups of reject reasons ``served_nothing`` names; --json has them all."""


def served_nothing(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The stderr lines of a run that finished no request, from its per-request records
    (``request_id``, ``status``, ``reject_reason``): the rejected requests counted and grouped
    by reason (the reason with its numbers blanked), the largest groups first, each shown by
    its first request's own reason."""
    if not records:
        return ["pagedkv: served nothing: the workload has no requests (an empty trace?)"]
    rejected = [r for r in records if r.get("status") == "rejected"]
    head = f"pagedkv: served nothing: {len(rejected)} of {len(records)} requests rejected"
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in rejected:
        reason = str(r.get("reject_reason") or "no reason recorded")
        groups.setdefault(re.sub(r"\d+(\.\d+)?", "#", reason), []).append(r)
    ranked = sorted(groups.values(), key=len, reverse=True)  # stable: first seen first on ties
    lines = [head]
    for members in ranked[:MAX_REASONS]:
        first = members[0]
        lines.append(
            f"pagedkv:   {len(members)} like request {first['request_id']}: "
            f"{first.get('reject_reason') or 'no reason recorded'}"
        )
    rest = ranked[MAX_REASONS:]
    if rest:
        lines.append(
            f"pagedkv:   and {sum(map(len, rest))} more for {len(rest)} other reasons "
            "(--json has each request's reject_reason)"
        )
    return lines


def require(*modules: str) -> None:
    """Before any work: raise ``ModuleNotFoundError`` for the first of ``modules`` that is
    not installed (``main`` turns it into one line naming the extra, exit 6), so a command
    never computes for a minute and then dies for want of a plotting library."""
    for name in modules:
        if importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

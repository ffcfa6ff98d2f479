"""The sweep's journal: one JSON line per finished point, flushed to disk as each one finishes.

It is what makes a sweep resumable: a crash or Ctrl-C loses at most the points still running,
and a rerun reads the journal and skips every point id already in it. A line that is not a
journal entry (cut short by a crash, a bad byte, an edit) is skipped with a one-line warning
naming the file and the line, and the rest is kept: that point simply runs again.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from pagedkv.errors import ConfigError
from pagedkv.io import OutputError


def warn(message: str) -> None:
    print(f"pagedkv: warning: {message}", file=sys.stderr)


class Journal:
    def __init__(self, path: Path, *, on_bad_line: Callable[[str], None] = warn) -> None:
        self.path = path
        self.rows: dict[str, dict[str, Any]] = {}
        self.skipped: list[int] = []
        """Line numbers (from 1) that were not journal entries."""
        if path.exists():
            try:
                data = path.read_bytes()
            except OSError as e:
                raise ConfigError("journal", str(path), f"cannot be read ({e.strerror})") from None
            # Line by line, each decoded alone: one bad byte costs its line, not the journal.
            for number, raw in enumerate(data.split(b"\n"), start=1):
                if not raw.strip():
                    continue
                entry = _entry(raw)
                if entry is None:
                    self.skipped.append(number)
                    on_bad_line(
                        f"{path}:{number}: skipped a line that is not a journal entry (a crash "
                        "cut it short, or it was damaged); its point runs again"
                    )
                else:
                    self.rows[entry["point_id"]] = entry  # a rerun (--retry-failed) wins
        self._file: IO[str] | None = None

    def append(self, row: dict[str, Any]) -> None:
        """Write one finished point durably (flush + fsync) before the sweep moves on; a
        failed write (a full disk) is an ``OutputError`` naming the journal."""
        try:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = self.path.open("a", encoding="utf-8")
                if self._file.tell() and not self._ends_with_newline():
                    self._file.write("\n")  # close a torn line so the new entry parses
            self._file.write(json.dumps(row) + "\n")  # key order kept: the table's columns
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as e:
            raise OutputError(self.path, e.strerror or type(e).__name__) from None
        self.rows[row["point_id"]] = row

    def _ends_with_newline(self) -> bool:
        with self.path.open("rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) == b"\n"

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _entry(raw: bytes) -> dict[str, Any] | None:
    """The journal entry on one line, or None when the line is not one."""
    try:
        entry = json.loads(raw.decode("utf-8"))
    except ValueError:  # not UTF-8, not JSON, an integer of over 4300 digits
        return None
    if (
        isinstance(entry, dict)
        and isinstance(entry.get("point_id"), str)
        and isinstance(entry.get("metrics", {}), dict)
        and isinstance(entry.get("error"), (str, type(None)))
    ):
        return entry
    return None

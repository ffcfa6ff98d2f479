"""The sweep's journal: one JSON line per finished point, flushed to disk as each one finishes.

It is what makes a sweep resumable: a crash or Ctrl-C loses at most the points still running,
and a rerun reads the journal and skips every point id already in it. A line cut short by a
crash is ignored (that point simply runs again).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

from pagedkv.io import OutputError


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: dict[str, dict[str, Any]] = {}
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue  # the last line of a crashed run, half written
                if isinstance(entry, dict) and isinstance(entry.get("point_id"), str):
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

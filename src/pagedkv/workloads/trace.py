"""Trace files: requests with their arrival times, as JSON Lines or CSV.

A trace has one request per line (JSONL: one JSON object per line; CSV: a header line, then
one row per request), the format chosen by the file's suffix, ``.jsonl`` or ``.csv``.

* Required columns: ``arrival_time`` (seconds, a finite number >= 0), ``prompt_len`` and
  ``output_len`` (integers >= 1; in JSONL a JSON integer, ``12.0`` is refused).
* ``request_id`` (integer >= 0, distinct) is optional; a line without one gets its position
  among the data lines (0, 1, ...).
* ``priority`` (an integer, optional) is the request's ``RequestSpec.priority`` (the vllm-v1
  policy's ``--scheduling-policy priority``: lower first); it is kept in ``extra`` as well.
* Any other column is kept, in file order, in ``RequestSpec.extra`` as text and written back:
  CSV cells verbatim; JSONL strings verbatim and other JSON values as their compact JSON text
  (they come back as strings). CSV cannot tell an empty cell from a missing value: empty cells
  are dropped, so an extra value "" does not survive a CSV round trip.
* Chat sessions: lines with the same ``session_id`` are the turns of one conversation, in file
  order; kind 'trace' makes every turn after the first a closed-loop follow-up of the turn
  before (``token_ids.chain_sessions``: it arrives ``think_time`` seconds after that turn
  finishes, 0 without the column, and its prompt starts with that turn's prompt and output).
  So a turn's ``prompt_len`` must be >= the previous turn's prompt_len + output_len, an
  optional ``turn`` column must increase along a session (integers >= 0), and ``think_time``
  must be a finite number >= 0; ``write_trace`` writes ``think_time`` for follow-ups.
* Arrival times must be non-decreasing down the file. An unsorted trace is rejected, not sorted:
  a trace records time, so disorder means a broken or badly merged file, and sorting silently
  would renumber its requests. ``write_trace`` refuses unsorted requests for the same reason.
* Blank lines are skipped; line numbers count every physical line from 1 (the CSV header is 1).

A ShareGPT-format JSON file is read by ``sharegpt.py`` instead.

Every malformed line raises one ``TraceError`` (a ``ConfigError``) whose message names the file,
the line, the column and the value, e.g. ``t.csv:3: prompt_len: got '12.5'; must be an integer
>= 1``. Writes are atomic (``pagedkv.io``): a failed write leaves no half file.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

from pagedkv import footprint
from pagedkv.errors import ConfigError
from pagedkv.footprint import BYTES_PER_REQUEST, check_memory
from pagedkv.io import atomic_write_text
from pagedkv.validation import read_text
from pagedkv.workloads.config import MAX_TOKENS
from pagedkv.workloads.spec import RESERVED_COLUMNS, RequestSpec

REQUIRED_COLUMNS = ("arrival_time", "prompt_len", "output_len")
MAX_REQUEST_ID = 2**63 - 1
FORMATS = (".jsonl", ".csv")
_DIGITS = re.compile(r"[0-9]+")
_SIGNED = re.compile(r"-?[0-9]+")
_Raw = object  # a cell: str from CSV, any JSON value from JSONL


class TraceError(ConfigError):
    """One malformed line of a trace: ``path``, 1-based ``line``, ``column``, the value."""

    def __init__(self, path: Path, line: int, column: str, value: object, allowed: str) -> None:
        self.path = path
        self.line = line
        self.column = column
        super().__init__(f"{path}:{line}: {column}", value, allowed)


def read_trace(path: str | Path) -> list[RequestSpec]:
    """The requests of a ``.jsonl`` or ``.csv`` trace, in file order (see the module docstring)."""
    path = Path(path)
    suffix = _format(path)
    # Bytes decoded as they are (no newline translation, so a quoted "\r" inside a CSV cell
    # survives), a leading BOM dropped; missing, a directory, not UTF-8, larger than the
    # footprint cap (a file this large cannot be a trace one run may hold): one error.
    text = read_text("trace_path", path, footprint.MEMORY_CAP_BYTES)
    rows = _jsonl_rows(path, text) if suffix == ".jsonl" else _csv_rows(path, text)
    specs: list[RequestSpec] = []
    first_line_of: dict[int, int] = {}
    sessions: dict[str, _Turn] = {}
    previous = 0.0
    max_requests = footprint.MEMORY_CAP_BYTES // BYTES_PER_REQUEST
    for index, (line, row) in enumerate(rows):
        if index == max_requests:
            check_memory(
                f"{path}:{line}",
                "requests",
                f"{index + 1} requests x {BYTES_PER_REQUEST} B",
                (index + 1) * BYTES_PER_REQUEST,
            )
        spec = _to_spec(path, line, row, index, parse_text=suffix == ".csv")
        _check_session(path, line, spec, sessions)
        if spec.arrival_time < previous:
            raise TraceError(
                path,
                line,
                "arrival_time",
                spec.arrival_time,
                f"must be >= the previous line's {previous}: traces are sorted by arrival time",
            )
        if spec.request_id in first_line_of:
            raise TraceError(
                path,
                line,
                "request_id",
                spec.request_id,
                f"must be distinct; line {first_line_of[spec.request_id]} has it",
            )
        first_line_of[spec.request_id] = line
        previous = spec.arrival_time
        specs.append(spec)
    return specs


def write_trace(path: str | Path, requests: list[RequestSpec]) -> Path:
    """Write ``requests`` as a ``.jsonl`` or ``.csv`` trace that ``read_trace`` reads back equal.

    Columns: request_id, arrival_time, prompt_len, output_len, then the extra columns in the
    order they first appear, and ``think_time`` for a follow-up (``parent_id``) whose extra
    columns lack one. Requests must be sorted by arrival time, with distinct ids.
    """
    path = Path(path)
    suffix = _format(path)
    seen: set[int] = set()
    for i, r in enumerate(requests):
        if not math.isfinite(r.arrival_time):  # RequestSpec lets NaN and infinity through
            raise ConfigError(f"requests[{i}].arrival_time", r.arrival_time, "must be finite")
        if i and r.arrival_time < requests[i - 1].arrival_time:
            raise ConfigError(
                f"requests[{i}].arrival_time", r.arrival_time, "must be non-decreasing"
            )
        if r.request_id in seen:
            raise ConfigError(f"requests[{i}].request_id", r.request_id, "must be distinct")
        seen.add(r.request_id)
    rows: list[dict[str, object]] = [
        {
            "request_id": r.request_id,
            "arrival_time": float(r.arrival_time),
            "prompt_len": r.prompt_len,
            "output_len": r.output_len,
            **dict(r.extra),
        }
        for r in requests
    ]
    for r, row in zip(requests, rows, strict=True):
        if r.parent_id is not None and "think_time" not in row:  # a follow-up (chat turn)
            row["think_time"] = float(r.think_time)
    if suffix == ".jsonl":
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    else:
        extra_names = [
            n for n in dict.fromkeys(n for row in rows for n in row) if n not in RESERVED_COLUMNS
        ]
        out = io.StringIO()
        # RFC 4180's CRLF line ends: the writer then quotes every cell holding "\r" or "\n",
        # which a "\n" terminator would leave bare "\r" unquoted (and the reader would split).
        writer = csv.writer(out, lineterminator="\r\n")
        writer.writerow([*RESERVED_COLUMNS, *extra_names])
        for row in rows:
            cells = [row.get(name, "") for name in (*RESERVED_COLUMNS, *extra_names)]
            writer.writerow([repr(c) if isinstance(c, float) else c for c in cells])
        text = out.getvalue()
    return atomic_write_text(path, text)


def _format(path: Path) -> str:
    if path.suffix not in FORMATS:
        raise ConfigError("trace_path", str(path), "must end in " + " or ".join(FORMATS))
    return path.suffix


def _jsonl_rows(path: Path, text: str) -> Iterator[tuple[int, Mapping[str, _Raw]]]:
    # Split on "\n" only: str.splitlines would also split inside strings holding U+2028 etc.
    for line, content in enumerate(text.split("\n"), start=1):
        content = content.removesuffix("\r")
        if not content.strip():
            continue
        try:
            row = json.loads(content)
        except ValueError as e:  # a JSONDecodeError, or an integer of over 4300 digits
            msg = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
            raise TraceError(
                path, line, "json", _clip(content), f"must be a JSON object ({msg})"
            ) from None
        if not isinstance(row, dict):
            raise TraceError(path, line, "json", _clip(content), "must be a JSON object")
        yield line, row


def _csv_rows(path: Path, text: str) -> Iterator[tuple[int, Mapping[str, _Raw]]]:
    # strict: a quote never closed is an error, not a cell that swallows the rest of the file
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader)
    except StopIteration:
        raise TraceError(path, 1, "header", "", "must exist; " + _required_message()) from None
    except csv.Error as e:
        raise TraceError(path, 1, "header", "", f"must be valid CSV ({e})") from None
    names = [name.strip() for name in header]
    for name in names:
        if not name or names.count(name) > 1:
            raise TraceError(path, 1, "header", name, "column names must be distinct, non-empty")
    for name in REQUIRED_COLUMNS:
        if name not in names:
            raise TraceError(
                path, 1, name, None, "must be a column of the header; " + _required_message()
            )
    while True:
        start = reader.line_num + 1
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            if reader.line_num > start or "end of data" in str(e):
                allowed = f"must be valid CSV: a quoted cell opened here is never closed ({e})"
                raise TraceError(path, start, "csv", "", allowed) from None
            raise TraceError(path, reader.line_num, "csv", "", f"must be valid CSV ({e})") from None
        if not cells:
            continue  # a blank line
        if len(cells) != len(names):
            raise TraceError(
                path, reader.line_num, "cells", len(cells), f"must be {len(names)}, as the header"
            )
        yield reader.line_num, {n: c for n, c in zip(names, cells, strict=True) if c != ""}


def _to_spec(
    path: Path, line: int, row: Mapping[str, _Raw], index: int, *, parse_text: bool
) -> RequestSpec:
    for name in REQUIRED_COLUMNS:
        if name not in row:
            raise TraceError(path, line, name, None, "must be present; " + _required_message())

    def integer(name: str, minimum: int, maximum: int) -> int:
        raw = row[name]
        value: object = raw
        if parse_text and isinstance(raw, str) and _DIGITS.fullmatch(raw.strip()):
            value = int(raw) if len(raw.strip()) <= 20 else maximum + 1  # no 10^6-digit parse
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
            raise TraceError(
                path,
                line,
                name,
                _clip(raw) if isinstance(raw, str) else raw,
                f"must be an integer in [{minimum}, {maximum}]",
            )
        return value

    raw_time = row["arrival_time"]
    time = _number(raw_time, parse_text=parse_text)
    if not (math.isfinite(time) and time >= 0):
        raise TraceError(path, line, "arrival_time", raw_time, "must be a finite number >= 0")
    extra = tuple(
        (name, value if isinstance(value, str) else _json_text(value))
        for name, value in row.items()
        if name not in RESERVED_COLUMNS
    )
    request_id = integer("request_id", 0, MAX_REQUEST_ID) if "request_id" in row else index
    prompt_len = integer("prompt_len", 1, MAX_TOKENS)
    output_len = integer("output_len", 1, MAX_TOKENS)
    priority = _priority(path, line, row.get("priority", 0))
    try:
        return RequestSpec(
            request_id, prompt_len, output_len, float(time), extra, priority=priority
        )
    except ConfigError as e:  # what RequestSpec checks beyond the above (an empty extra name)
        raise TraceError(path, line, e.field, e.value, e.allowed) from None


def _priority(path: Path, line: int, raw: object) -> int:
    """The optional ``priority`` column (kept in ``extra`` too, so it is written back, as
    text): an integer, lower first under ``--scheduling-policy priority`` (vllm-v1)."""
    value = raw
    if isinstance(raw, str) and _SIGNED.fullmatch(raw.strip()):
        value = int(raw)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(path, line, "priority", raw, "must be an integer (lower runs first)")
    return value


class _Turn(NamedTuple):
    """The latest turn seen of a session: where, how long, its number."""

    line: int
    prompt_len: int
    output_len: int
    turn: int | None


def _check_session(path: Path, line: int, spec: RequestSpec, sessions: dict[str, _Turn]) -> None:
    """A session's turn: ``turn`` increases, ``think_time`` is a time, and the prompt holds at
    least the conversation before it (the previous turn's prompt and output)."""
    extra = dict(spec.extra)
    session = extra.get("session_id")
    if session is None:
        return
    before = sessions.get(session)
    turn: int | None = None
    if "turn" in extra:
        text = extra["turn"]
        turn = int(text) if _DIGITS.fullmatch(text.strip()) else None
        low, where = 0, ""
        if before is not None and before.turn is not None:
            low, where = before.turn + 1, f" (line {before.line} has turn {before.turn})"
        if turn is None or turn < low:
            raise TraceError(path, line, "turn", text, f"must be an integer >= {low}{where}")
    if "think_time" in extra:
        think = _number(extra["think_time"], parse_text=True)
        if not (math.isfinite(think) and think >= 0):
            raise TraceError(
                path, line, "think_time", extra["think_time"], "must be a finite number >= 0"
            )
    if before is not None and spec.prompt_len < before.prompt_len + before.output_len:
        raise TraceError(
            path,
            line,
            "prompt_len",
            spec.prompt_len,
            f"must be >= {before.prompt_len + before.output_len}: session {session!r}'s turn on "
            f"line {before.line} has prompt_len {before.prompt_len} + output_len "
            f"{before.output_len}, and a turn's prompt holds the conversation before it",
        )
    sessions[session] = _Turn(line, spec.prompt_len, spec.output_len, turn)


def _json_text(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _number(raw: _Raw, *, parse_text: bool) -> float:
    """A JSON number, or a CSV cell that parses as one; NaN for anything else."""
    if isinstance(raw, bool):
        return math.nan
    try:
        if isinstance(raw, (int, float)) or (parse_text and isinstance(raw, str)):
            return float(raw)
    except (ValueError, OverflowError):  # text that is no number; an int beyond float
        pass
    return math.nan


def _required_message() -> str:
    return "required columns: " + ", ".join(REQUIRED_COLUMNS) + " (request_id optional)"


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."

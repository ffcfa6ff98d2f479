"""Trace files: requests with their arrival times, as JSON Lines or CSV; ShareGPT import.

A trace has one request per line (JSONL: one JSON object per line; CSV: a header line, then
one row per request), the format chosen by the file's suffix, ``.jsonl`` or ``.csv``.

* Required columns: ``arrival_time`` (seconds, a finite number >= 0), ``prompt_len`` and
  ``output_len`` (integers >= 1; in JSONL a JSON integer, ``12.0`` is refused).
* ``request_id`` (integer >= 0, distinct) is optional; a line without one gets its position
  among the data lines (0, 1, ...).
* Any other column is kept, in file order, in ``RequestSpec.extra`` as text and written back:
  CSV cells verbatim; JSONL strings verbatim and other JSON values as their compact JSON text
  (they come back as strings). CSV cannot tell an empty cell from a missing value: empty cells
  are dropped, so an extra value "" does not survive a CSV round trip.
* Arrival times must be non-decreasing down the file. An unsorted trace is rejected, not sorted:
  a trace records time, so disorder means a broken or badly merged file, and sorting silently
  would renumber its requests. ``write_trace`` refuses unsorted requests for the same reason.
* Blank lines are skipped; line numbers count every physical line from 1 (the CSV header is 1).

``import_sharegpt`` reads a ShareGPT-format JSON file instead (see its docstring).

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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pagedkv.errors import ConfigError
from pagedkv.io import atomic_write_text
from pagedkv.validation import check_int
from pagedkv.workloads.spec import RESERVED_COLUMNS, RequestSpec

REQUIRED_COLUMNS = ("arrival_time", "prompt_len", "output_len")
CHARS_PER_TOKEN = 4
"""Without a tokenizer, a text of c characters counts ceil(c / 4) tokens: OpenAI's rule of thumb
("one token generally corresponds to ~4 characters of text for common English text", OpenAI
Help Center, "What are tokens and how to count them?"). Code and other languages differ."""
FORMATS = (".jsonl", ".csv")
_DIGITS = re.compile(r"[0-9]+")
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
    try:
        # newline="": no newline translation, so a quoted "\r" inside a CSV cell survives.
        with path.open(encoding="utf-8", newline="") as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError("trace_path", str(path), "no such file") from None
    except UnicodeDecodeError as e:
        raise ConfigError("trace_path", str(path), f"must be UTF-8 text ({e.reason})") from None
    rows = _jsonl_rows(path, text) if suffix == ".jsonl" else _csv_rows(path, text)
    specs: list[RequestSpec] = []
    first_line_of: dict[int, int] = {}
    previous = 0.0
    for index, (line, row) in enumerate(rows):
        spec = _to_spec(path, line, row, index, parse_text=suffix == ".csv")
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
    order they first appear. Requests must be sorted by arrival time, with distinct ids.
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
    rows = [
        {
            "request_id": r.request_id,
            "arrival_time": float(r.arrival_time),
            "prompt_len": r.prompt_len,
            "output_len": r.output_len,
            **dict(r.extra),
        }
        for r in requests
    ]
    if suffix == ".jsonl":
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    else:
        extra_names = list(dict.fromkeys(name for r in requests for name, _ in r.extra))
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


@dataclass(frozen=True)
class ShareGPTImport:
    """What ``load_sharegpt`` found: the requests kept and what it dropped, counted."""

    requests: tuple[RequestSpec, ...]
    pairs: int
    """Human turns followed by a gpt turn, in the whole file."""
    dropped_too_long: int
    """Pairs with prompt + output > max_model_len."""
    dropped_empty: int
    """Pairs with an empty (or all-blank) text on either side, or a tokenizer count of 0."""
    unpaired: int
    """Human turns not followed by a gpt turn (the conversation's last, or another role next)."""


def approx_tokens(text: str) -> int:
    """ceil(len(text) / CHARS_PER_TOKEN), at least 1 (see ``CHARS_PER_TOKEN``)."""
    return max(1, -(-len(text) // CHARS_PER_TOKEN))


def load_sharegpt(
    path: str | Path,
    *,
    tokenizer: Callable[[str], int] | None = None,
    max_model_len: int = 2048,
    seed: int = 0,
    num_requests: int | None = None,
) -> ShareGPTImport:
    """Pair each human turn of a ShareGPT-format file with the gpt turn after it.

    The file is a JSON list of ``{"id": ..., "conversations": [{"from": "human" | "gpt",
    "value": text}, ...]}``; turns of other roles are skipped. A pair's prompt is the human
    turn's text alone, without the conversation before it (as vLLM's benchmark takes the first
    turn of each conversation), so later turns have shorter prompts than a chat server would
    see. Token counts come from ``tokenizer(text)`` if given, else ``approx_tokens``. Pairs
    longer than ``max_model_len`` are dropped, not cut (as vLLM's benchmark filters them).

    With ``num_requests``, that many of the kept pairs are drawn without replacement by
    ``numpy.random.default_rng(seed)`` and kept in file order; otherwise all are kept and the
    seed is unused. Requests are numbered 0.. in file order, all arrive at t = 0 (the caller
    re-times them), and keep ``conversation_id`` (the item's "id", else its index) and
    ``turn`` (the pair's index within its conversation) in ``extra``.
    """
    path = Path(path)
    check_int("max_model_len", max_model_len, 2)
    check_int("seed", seed, 0)
    count = tokenizer if tokenizer is not None else approx_tokens
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError("trace_path", str(path), "no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(str(path), _clip(str(e)), "must be a UTF-8 JSON file") from None
    if not isinstance(data, list):
        raise ConfigError(str(path), type(data).__name__, "must be a JSON list of conversations")
    kept: list[tuple[int, int, tuple[tuple[str, str], ...]]] = []
    pairs = too_long = empty = unpaired = 0
    for i, item in enumerate(data):
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list):
            raise ConfigError(f"{path}: item {i}", _clip(repr(item)), "needs a conversations list")
        for j, turn in enumerate(turns):
            if not (isinstance(turn, dict) and isinstance(turn.get("value"), str)):
                raise ConfigError(
                    f"{path}: item {i}: turn {j}", _clip(repr(turn)), 'needs a "value" string'
                )
        conv_id = str(item.get("id", i))
        k = pair_in_conversation = 0
        while k < len(turns):
            if turns[k].get("from") != "human":
                k += 1
                continue
            if k + 1 == len(turns) or turns[k + 1].get("from") != "gpt":
                unpaired += 1
                k += 1
                continue
            prompt_text, output_text = turns[k]["value"], turns[k + 1]["value"]
            extra = (("conversation_id", conv_id), ("turn", str(pair_in_conversation)))
            pair_in_conversation += 1
            pairs += 1
            k += 2
            if not prompt_text.strip() or not output_text.strip():
                empty += 1
                continue
            prompt, output = _count(count, prompt_text), _count(count, output_text)
            if prompt == 0 or output == 0:
                empty += 1
            elif prompt + output > max_model_len:
                too_long += 1
            else:
                kept.append((prompt, output, extra))
    if num_requests is not None:
        check_int("num_requests", num_requests, 1)
        if num_requests > len(kept):
            raise ConfigError(
                "num_requests", num_requests, f"must be <= the {len(kept)} pairs kept in {path}"
            )
        chosen = np.random.default_rng(seed).choice(len(kept), size=num_requests, replace=False)
        kept = [kept[int(i)] for i in sorted(chosen)]
    requests = tuple(
        RequestSpec(request_id=n, prompt_len=p, output_len=o, extra=x)
        for n, (p, o, x) in enumerate(kept)
    )
    return ShareGPTImport(requests, pairs, too_long, empty, unpaired)


def import_sharegpt(
    path: str | Path,
    *,
    tokenizer: Callable[[str], int] | None = None,
    max_model_len: int = 2048,
    seed: int = 0,
    num_requests: int | None = None,
) -> list[RequestSpec]:
    """The requests of ``load_sharegpt`` (which also counts what it dropped)."""
    result = load_sharegpt(
        path,
        tokenizer=tokenizer,
        max_model_len=max_model_len,
        seed=seed,
        num_requests=num_requests,
    )
    return list(result.requests)


def _count(count: Callable[[str], int], text: str) -> int:
    n = count(text)
    return check_int("tokenizer(text)", n, 0)


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
        except json.JSONDecodeError as e:
            raise TraceError(
                path, line, "json", _clip(content), f"must be a JSON object ({e.msg})"
            ) from None
        if not isinstance(row, dict):
            raise TraceError(path, line, "json", _clip(content), "must be a JSON object")
        yield line, row


def _csv_rows(path: Path, text: str) -> Iterator[tuple[int, Mapping[str, _Raw]]]:
    reader = csv.reader(io.StringIO(text, newline=""))
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
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
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

    def integer(name: str, minimum: int) -> int:
        raw = row[name]
        value: object = raw
        if parse_text and isinstance(raw, str) and _DIGITS.fullmatch(raw.strip()):
            value = int(raw)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise TraceError(path, line, name, raw, f"must be an integer >= {minimum}")
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
    request_id = integer("request_id", 0) if "request_id" in row else index
    prompt_len, output_len = integer("prompt_len", 1), integer("output_len", 1)
    try:
        return RequestSpec(request_id, prompt_len, output_len, float(time), extra)
    except ConfigError as e:  # what RequestSpec checks beyond the above (an empty extra name)
        raise TraceError(path, line, e.field, e.value, e.allowed) from None


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

"""Trace files: JSONL and CSV round trips, one clear error per malformed line."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.errors import ConfigError
from pagedkv.workloads.spec import RESERVED_COLUMNS, RequestSpec
from pagedkv.workloads.trace import TraceError, read_trace, write_trace

SUFFIXES = [".jsonl", ".csv"]


def _specs() -> list[RequestSpec]:
    return [
        RequestSpec(0, 12, 30, 0.0, (("tenant", "a"), ("note", 'quote " and, comma'))),
        RequestSpec(7, 1, 1, 0.25, (("tenant", "b"),)),
        RequestSpec(3, 2047, 1, 0.25),
        RequestSpec(4, 5, 6, 1e-17 + 1 / 3, (("note", "multi\nline"), ("unicode", "ü\u2028"))),
    ]


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_round_trip_with_extra_columns(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"t{suffix}"
    specs = _specs()
    assert write_trace(path, specs) == path
    assert read_trace(path) == specs
    text = path.read_text()
    write_trace(path, read_trace(path))  # the file we write comes back byte for byte
    assert path.read_text() == text
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_between_formats(tmp_path: Path, suffix: str) -> None:
    other = ".csv" if suffix == ".jsonl" else ".jsonl"
    write_trace(tmp_path / f"a{suffix}", _specs())
    write_trace(tmp_path / f"b{other}", read_trace(tmp_path / f"a{suffix}"))
    assert read_trace(tmp_path / f"b{other}") == _specs()


_text = st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=8)
_extra = st.lists(
    # CSV strips header names and cannot hold an empty value (see trace.py): names without
    # edge blanks, values not empty; not 'priority', a column with a meaning (an integer).
    st.tuples(
        _text.filter(lambda s: s.strip() == s and s not in (*RESERVED_COLUMNS, "priority")),
        _text,
    ),
    max_size=3,
    unique_by=lambda kv: kv[0],
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 1e6, allow_nan=False), st.integers(1, 10**6), st.integers(1, 10**6), _extra
        ),
        max_size=8,
    ),
    st.sampled_from(SUFFIXES),
)
def test_round_trip_property(
    tmp_path_factory: pytest.TempPathFactory,
    rows: list[tuple[float, int, int, list[tuple[str, str]]]],
    suffix: str,
) -> None:
    rows.sort(key=lambda r: r[0])
    specs = [RequestSpec(i, p, o, t, tuple(x)) for i, (t, p, o, x) in enumerate(rows)]
    path = tmp_path_factory.mktemp("trace") / f"t{suffix}"
    write_trace(path, specs)
    if suffix == ".csv":  # one header for all rows: each row's extras come in its order
        header = list(dict.fromkeys(name for r in specs for name, _ in r.extra))
        specs = [
            dataclasses.replace(r, extra=tuple(sorted(r.extra, key=lambda kv: header.index(kv[0]))))
            for r in specs
        ]
    assert read_trace(path) == specs


def test_handwritten_csv(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    # Any column order, no request_id, an extra column, a blank line, an empty extra cell.
    path.write_text("prompt_len,model,arrival_time,output_len\n3,opt,0.5,4\n\n5,,1e1,6\n")
    assert read_trace(path) == [
        RequestSpec(0, 3, 4, 0.5, (("model", "opt"),)),
        RequestSpec(1, 5, 6, 10.0),
    ]


def test_handwritten_jsonl_keeps_non_string_extras_as_json_text(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    row = {"arrival_time": 2, "prompt_len": 3, "output_len": 4, "tags": [1, "x"], "ok": True}
    path.write_text("\n" + json.dumps(row) + "\n")
    assert read_trace(path) == [RequestSpec(0, 3, 4, 2.0, (("tags", '[1,"x"]'), ("ok", "true")))]


def test_request_id_defaults_to_line_order(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    lines = [{"arrival_time": t, "prompt_len": 1, "output_len": 1} for t in (0, 1, 1)]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert [r.request_id for r in read_trace(path)] == [0, 1, 2]


GOOD = {"arrival_time": 0.5, "prompt_len": 3, "output_len": 4}


def _jsonl(*rows: object) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


JSONL_CASES = [
    # (content, line, column, value)
    (_jsonl(GOOD, {"arrival_time": 1, "prompt_len": 3}), 2, "output_len", None),
    (_jsonl({**GOOD, "prompt_len": 12.5}), 1, "prompt_len", 12.5),
    (_jsonl({**GOOD, "prompt_len": 12.0}), 1, "prompt_len", 12.0),
    (_jsonl({**GOOD, "output_len": "4"}), 1, "output_len", "4"),
    (_jsonl({**GOOD, "output_len": True}), 1, "output_len", True),
    (_jsonl({**GOOD, "output_len": 0}), 1, "output_len", 0),
    (_jsonl({**GOOD, "request_id": -1}), 1, "request_id", -1),
    (_jsonl(GOOD, {**GOOD, "arrival_time": -1}), 2, "arrival_time", -1),
    (_jsonl({**GOOD, "arrival_time": "soon"}), 1, "arrival_time", "soon"),
    (_jsonl({**GOOD, "arrival_time": 10**400}), 1, "arrival_time", 10**400),
    ('{"arrival_time": NaN, "prompt_len": 1, "output_len": 1}\n', 1, "arrival_time", math.nan),
    (_jsonl(GOOD, '{"arrival_time": 1, "prompt_len": 3,'), 2, "json", None),
    (_jsonl(GOOD, GOOD, "[1, 2]"), 3, "json", "[1, 2]"),
    (_jsonl({**GOOD, "arrival_time": 2}, GOOD), 2, "arrival_time", 0.5),
    (_jsonl({**GOOD, "request_id": 4}, "", {**GOOD, "request_id": 4}), 3, "request_id", 4),
    (_jsonl(GOOD, {**GOOD, "": "x"}), 2, "extra", None),
    (_jsonl({**GOOD, "prompt_len": 10**24}), 1, "prompt_len", 10**24),
    (_jsonl({**GOOD, "output_len": 2**24 + 1}), 1, "output_len", 2**24 + 1),
    (_jsonl({**GOOD, "request_id": 2**63}), 1, "request_id", 2**63),
    ('{"arrival_time": 0, "prompt_len": ' + "7" * 5000 + ', "output_len": 1}\n', 1, "json", None),
]


@pytest.mark.parametrize(("content", "line", "column", "value"), JSONL_CASES)
def test_malformed_jsonl_line(
    tmp_path: Path, content: str, line: int, column: str, value: object
) -> None:
    _check_error(tmp_path / "bad.jsonl", content, line, column, value)


CSV_CASES = [
    ("arrival_time,prompt_len\n0,1\n", 1, "output_len", None),
    ("arrival_time,prompt_len,output_len,prompt_len\n", 1, "header", "prompt_len"),
    ("", 1, "header", ""),
    ("arrival_time,prompt_len,output_len\n0,1,1\n1,12.5,3\n", 3, "prompt_len", "12.5"),
    ("arrival_time,prompt_len,output_len\n0,abc,3\n", 2, "prompt_len", "abc"),
    ("arrival_time,prompt_len,output_len\n0,3,\n", 2, "output_len", None),
    ("arrival_time,prompt_len,output_len\n-1,3,4\n", 2, "arrival_time", "-1"),
    ("arrival_time,prompt_len,output_len\nnan,3,4\n", 2, "arrival_time", "nan"),
    ("arrival_time,prompt_len,output_len\ninf,3,4\n", 2, "arrival_time", "inf"),
    ("arrival_time,prompt_len,output_len\n\n5,3,4\n\n4,3,4\n", 5, "arrival_time", 4.0),
    ("arrival_time,prompt_len,output_len\n0,3,4,5\n", 2, "cells", 4),
    ("request_id,arrival_time,prompt_len,output_len\n1,0,3,4\n1,0,3,4\n", 3, "request_id", 1),
    (f"arrival_time,prompt_len,output_len\n0,{10**24},3\n", 2, "prompt_len", str(10**24)),
    ("arrival_time,prompt_len,output_len\n0,3," + "9" * 10000 + "\n", 2, "output_len", None),
    # an unclosed quote: named where it opens, not at the end of the file
    ('arrival_time,prompt_len,output_len\n0,1,1\n0,"3,4\n0,1,1\n', 3, "csv", None),
    ('arrival_time,prompt_len,"output_len\n0,1,1\n', 1, "header", None),
]


@pytest.mark.parametrize(("content", "line", "column", "value"), CSV_CASES)
def test_malformed_csv_line(
    tmp_path: Path, content: str, line: int, column: str, value: object
) -> None:
    _check_error(tmp_path / "bad.csv", content, line, column, value)


def _check_error(path: Path, content: str, line: int, column: str, value: object) -> None:
    path.write_text(content)
    with pytest.raises(TraceError) as info:
        read_trace(path)
    err = info.value
    assert isinstance(err, ConfigError)
    assert (err.path, err.line, err.column) == (path, line, column)
    message = str(err)
    assert message.startswith(f"{path}:{line}: {column}: got ")
    assert "must" in message
    if value is not None and column != "json":
        assert repr(value) in message


@pytest.mark.parametrize("name", ["t.txt", "t.json", "t"])
def test_unknown_suffix(tmp_path: Path, name: str) -> None:
    for call in (lambda p: read_trace(p), lambda p: write_trace(p, [])):
        with pytest.raises(ConfigError) as info:
            call(tmp_path / name)
        assert info.value.field == "trace_path"


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        read_trace(tmp_path / "absent.csv")
    assert info.value.field == "trace_path"


def test_write_refuses_unsorted_or_duplicate_requests(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    with pytest.raises(ConfigError, match=r"requests\[1\]\.arrival_time"):
        write_trace(path, [RequestSpec(0, 1, 1, 2.0), RequestSpec(1, 1, 1, 1.0)])
    with pytest.raises(ConfigError, match=r"requests\[1\]\.request_id"):
        write_trace(path, [RequestSpec(0, 1, 1), RequestSpec(0, 1, 1)])
    with pytest.raises(ConfigError, match=r"requests\[0\]\.arrival_time"):
        write_trace(path, [RequestSpec(0, 1, 1, math.nan)])
    assert not path.exists()


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_leading_bom_is_dropped(tmp_path: Path, suffix: str) -> None:
    specs = [RequestSpec(0, 5, 3, 0.0, (("note", "x"),)), RequestSpec(1, 2, 2, 1.5)]
    path = write_trace(tmp_path / f"t{suffix}", specs)
    plain = read_trace(path)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert read_trace(path) == plain == specs


def test_a_directory_or_bytes_that_are_not_utf8_are_one_error(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").mkdir()
    with pytest.raises(ConfigError, match="must be a file, not a directory") as info:
        read_trace(tmp_path / "d.jsonl")
    assert info.value.field == "trace_path"
    path = tmp_path / "t.csv"
    path.write_bytes(b"arrival_time,prompt_len,output_len\n0,1,1\n0,\xff,1\n")
    with pytest.raises(ConfigError, match=r"must be UTF-8 text \(line 3: byte 0xff"):
        read_trace(path)


def test_a_trace_with_more_lines_than_the_cap_allows_is_refused_at_the_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pagedkv import footprint

    path = tmp_path / "t.csv"
    path.write_text("arrival_time,prompt_len,output_len\n" + "0,1,1\n" * 20)
    monkeypatch.setattr(footprint, "MEMORY_CAP_BYTES", 10 * footprint.BYTES_PER_REQUEST)
    with pytest.raises(ConfigError, match="would hold about") as info:
        read_trace(path)
    assert info.value.field == f"{path}:12"  # the 11th request, on line 12
    monkeypatch.setattr(footprint, "MEMORY_CAP_BYTES", 100)  # the file itself is over
    with pytest.raises(ConfigError, match="must be at most 100 bytes") as info:
        read_trace(path)
    assert info.value.field == "trace_path"


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_the_priority_column_is_the_requests_priority(tmp_path: Path, suffix: str) -> None:
    """vllm-v1's priority scheduling reads it; it survives a round trip (kept in extra)."""
    path = tmp_path / f"t{suffix}"
    rows = [(0.0, 5, 2, -1), (1.0, 6, 3, 2), (2.0, 7, 4, 0)]
    if suffix == ".csv":
        body = "".join(f"{t},{p},{o},{q}\n" for t, p, o, q in rows)
        path.write_text("arrival_time,prompt_len,output_len,priority\n" + body)
    else:
        path.write_text(
            "".join(
                json.dumps({"arrival_time": t, "prompt_len": p, "output_len": o, "priority": q})
                + "\n"
                for t, p, o, q in rows
            )
        )
    specs = read_trace(path)
    assert [s.priority for s in specs] == [-1, 2, 0]
    again = tmp_path / f"again{suffix}"
    write_trace(again, specs)
    assert read_trace(again) == specs


def test_a_bad_priority_names_the_line_and_the_column(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("arrival_time,prompt_len,output_len,priority\n0,5,2,high\n")
    with pytest.raises(TraceError, match=r"t\.csv:2: priority: got 'high'"):
        read_trace(path)

"""The sweep's tidy table: one row per point, written as CSV and Parquet, atomically.

Column order is fixed (point, point_id, the varied keys, seed, error, then the metrics in the
summary's own order), and rows are sorted by point, so the table depends only on the rows, not
on the order points finished in or on how many runs it took to finish them.
"""

from __future__ import annotations

import csv
import io
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pagedkv.io import atomic_write_bytes, atomic_write_text, output_set


def flatten_summary(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The summary's scalar metrics, nested ones joined by ``_`` (``ttft.p99`` -> ``ttft_p99``);
    lists (the stuck requests) are left out: a table cell holds one value."""
    out: dict[str, Any] = {}
    for key, value in summary.items():
        if isinstance(value, Mapping):
            for sub, inner in flatten_summary(value).items():
                out[f"{key}_{sub}"] = inner
        elif isinstance(value, (bool, int, float, str)) or value is None:
            out[key] = value
    return out


def columns_of(rows: Sequence[Mapping[str, Any]], leading: Sequence[str]) -> list[str]:
    """``leading`` first, then every other key in order of first appearance (rows in order)."""
    cols = list(leading)
    seen = set(cols)
    for row in rows:
        for key in row:
            if key not in seen:
                seen.add(key)
                cols.append(key)
    return cols


def to_csv(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if row.get(c) is None else _cell(row[c]) for c in columns])
    return buf.getvalue()


def _cell(value: Any) -> Any:
    return repr(value) if isinstance(value, float) else value  # repr: floats round-trip exactly


@output_set()  # the CSV and the Parquet file together, or neither
def write_tables(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[str], out: Path, stem: str = "results"
) -> list[Path]:
    """``stem.csv`` and, when pyarrow is installed, ``stem.parquet``; returns what was written."""
    written = [atomic_write_text(out / f"{stem}.csv", to_csv(rows, columns))]
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        print(
            "pyarrow is not installed: no Parquet (pip install 'pagedkv[sweep]')", file=sys.stderr
        )
        return written
    arrays = [_arrow_column(pa, [row.get(c) for row in rows]) for c in columns]
    table = pa.Table.from_arrays(arrays, names=list(columns))
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    written.append(atomic_write_bytes(out / f"{stem}.parquet", sink.getvalue().to_pybytes()))
    return written


def _arrow_column(pa: Any, values: list[Any]) -> Any:
    """One Arrow type per column: ints and floats mixed become float64, anything else mixed
    (a varied key given as 16 and "auto") becomes strings, so Parquet never rejects a sweep."""
    kinds = {type(v) for v in values if v is not None}
    if kinds == {bool}:
        return pa.array(values, type=pa.bool_())
    if kinds == {int}:
        return pa.array(values, type=pa.int64())
    if kinds and kinds <= {int, float}:
        return pa.array([None if v is None else float(v) for v in values], type=pa.float64())
    return pa.array([None if v is None else str(v) for v in values], type=pa.string())

"""Terminal tables: readable at any width, numbers in one plain format."""

from __future__ import annotations

import io
import math

import hypothesis.strategies as st
import pytest
from hypothesis import given
from rich.console import Console

from pagedkv.experiments.bench import BenchRow
from pagedkv.report.console import PIPED_WIDTH, fmt_sig, make_console
from pagedkv.report.summary import _bench_columns, bench_table, bench_tables


@given(
    st.floats(min_value=-1e12, max_value=1e12, allow_nan=False).filter(lambda v: v != 0),
    st.integers(2, 5),
)
def test_fmt_sig_is_plain_and_close(value: float, digits: int) -> None:
    text = fmt_sig(value, digits)
    assert "e" not in text.lower()
    assert not text.endswith(".")
    back = float(text.replace(",", ""))
    if abs(value) >= 10 ** (digits - 1):
        assert abs(back - value) <= 0.5  # whole figures kept: rounded to an integer
    else:
        assert math.isclose(back, value, rel_tol=0.5 * 10 ** (1 - digits) * 1.0001)
        figures = text.replace(",", "").replace("-", "").replace(".", "").lstrip("0")
        assert len(figures) == digits  # exactly the significant figures asked for


@pytest.mark.parametrize(
    ("value", "text"), [(187.0, "187"), (0.00012, "0.000120"), (9.996, "10.0")]
)
def test_fmt_sig_examples(value: float, text: str) -> None:
    assert fmt_sig(value) == text


def row(name: str, **kw: object) -> BenchRow:
    values: dict[str, object] = {
        "workload": "w",
        "scheduler": name,
        "clock": "s",
        "num_requests": 100_000,
        "finished": 99_999,
        "deadlocked": False,
        "iterations": 1_234_567,
        "sim_time": 12_345.6,
        "request_throughput": 0.000123,
        "max_running": 256,
        "mean_running": 187.25,
        "preemptions": 31_415,
        "p99_normalized_latency": 0.187,
        "token_utilization": 0.9,
        "pool_occupancy": 0.5,
        "internal_fragmentation": 0.001,
        "external_fragmentation": 0.0,
    }
    values.update(kw)
    return BenchRow(**values)  # type: ignore[arg-type]


def render(table: object, width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(table)
    return out.getvalue()


@pytest.mark.parametrize("width", [60, 80, 100, 200])
def test_bench_tables_fit_the_width_and_cut_no_cell(width: int) -> None:
    rows = [row("contiguous-slots"), row("greedy-nopreempt", deadlocked=True)]
    console = Console(file=io.StringIO(), width=width)
    title = "A long title of a workload, as the bench gives"
    tables = bench_tables(rows, title, console)
    columns = []
    for table in tables:
        text = render(table, width)
        assert "…" not in text  # rich's mark of a cut cell
        assert max(len(line) for line in text.splitlines()) <= width
        assert table.columns[0].header == "scheduler"
        columns += [str(c.header) for c in table.columns[1:]]
    assert columns == _bench_columns(rows)  # every column once, in order
    if width >= 200:
        assert len(tables) == 1
        assert render(tables[0], width) == render(bench_table(rows, title), width)
    if width <= 80:
        assert len(tables) > 1


def test_piped_output_honours_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert make_console().width == 80
    monkeypatch.delenv("COLUMNS")
    assert make_console().width == PIPED_WIDTH  # the tests' output is not a terminal

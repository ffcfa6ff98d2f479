"""The shared plot helpers (pagedkv.report.plots): at most three panels a row, labels inside the
figure, one y scale per panel, and groups 10x apart in panels of their own."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from pagedkv.experiments import block_size
from pagedkv.experiments.framework import ExperimentResult
from pagedkv.experiments.metrics import bounds
from pagedkv.report import plots
from tests.report.fixtures import decode_png, png_size

LONG = "a long y label with its unit (requests per second per GPU)"


@pytest.mark.parametrize("n", range(1, 8))
def test_at_most_three_panels_a_row(n: int) -> None:
    fig, axes = plots.figure(n, width=3.0, height=2.0)
    try:
        assert len(axes) == n
        assert len(fig.axes) == n  # the empty places of the last row are removed
        rows: dict[int, int] = {}
        for ax in axes:
            rows.setdefault(ax.get_subplotspec().rowspan.start, 0)
            rows[ax.get_subplotspec().rowspan.start] += 1
        assert max(rows.values()) <= plots.PER_ROW
        assert len(rows) == -(-n // plots.PER_ROW)
        width, height = fig.get_size_inches()
        assert width == pytest.approx(3.0 * min(n, plots.PER_ROW))
        assert height == pytest.approx(2.0 * len(rows))
    finally:
        fig.clf()


def test_each_panel_has_its_own_y_scale() -> None:
    fig, axes = plots.figure(3, width=3.0, height=2.0)
    for k, ax in enumerate(axes):
        ax.plot([0, 1], [10.0**k, 2 * 10.0**k])
    lows_highs = [ax.get_ylim() for ax in axes]
    for ax in axes:
        assert ax.get_shared_y_axes().get_siblings(ax) == [ax]
    assert lows_highs[2][1] > 50 * lows_highs[0][1]
    fig.clf()


def test_labels_lie_inside_the_figure(tmp_path: Path) -> None:
    """Long y labels (wrapped) and titles on a wrapped grid: every label's box is within the
    figure as laid out, before the tight bounding box of the saved PNG adds any room."""
    fig, axes = plots.figure(5, width=3.2, height=3.0)
    for ax in axes:
        ax.plot([0, 1, 2], [1e4, 3e4, 2e4])
        plots.label(ax, "block size (tokens)", LONG, "a title")
    fig.canvas.draw()
    box = fig.bbox
    for ax in axes:
        low, high = ax.get_ylim()
        ticks = [t.label1 for t in ax.yaxis.get_major_ticks() if low <= t.get_loc() <= high]
        for text in (ax.yaxis.label, ax.xaxis.label, ax.title, *ticks):
            ext = text.get_window_extent()
            assert ext.x0 >= box.x0 - 0.5, text.get_text()
            assert ext.x1 <= box.x1 + 0.5, text.get_text()
            assert ext.y0 >= box.y0 - 0.5, text.get_text()
            assert ext.y1 <= box.y1 + 0.5, text.get_text()
    # nor under the panel to its left: a label is not hidden by its neighbour
    for left, right in itertools.pairwise(axes):
        if left.get_subplotspec().rowspan.start != right.get_subplotspec().rowspan.start:
            continue
        edge = left.get_window_extent().x1
        assert right.yaxis.label.get_window_extent().x0 >= edge
        low, high = right.get_ylim()
        for t in right.yaxis.get_major_ticks():
            if low <= t.get_loc() <= high:
                assert t.label1.get_window_extent().x0 >= edge
    data = plots.save_png(fig, tmp_path / "f.png").read_bytes()
    assert decode_png(data) == png_size(data)


def summary(peaks: dict[str, float]) -> list[dict[str, Any]]:
    return [
        {"workload": wl, "block_size": bs, "m_mean": peak * bs / 16, "n": 3}
        for wl, peak in peaks.items()
        for bs in (8, 16)
    ]


def test_groups_ten_times_apart_get_panels_of_their_own() -> None:
    split = plots.panels_by_scale(summary({"a": 2.0, "b": 20.0}), "workload", ["m"])
    assert split == [("m", ["a"]), ("m", ["b"])]
    together = plots.panels_by_scale(summary({"a": 2.0, "b": 19.0}), "workload", ["m"])
    assert together == [("m", ["a", "b"])]
    zero = plots.panels_by_scale(summary({"a": 0.0, "b": 5.0}), "workload", ["m"])
    assert zero == [("m", ["a", "b"])]  # nothing to compare a zero with


def test_block_size_draws_each_workloads_throughput_on_its_own_scale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = []
    for wl, rate in (("sharegpt-like", 1.7), ("alpaca-like", 17.0)):
        for bs in (16, 64):
            row: dict[str, Any] = {"workload": wl, "block_size": bs, "n": 3}
            for m in block_size.METRICS:
                value = rate if m == "request_throughput" else 0.5
                row |= {f"{m}_mean": value, f"{m}_ci_low": value, f"{m}_ci_high": value}
            rows.append(row)
    result = ExperimentResult(
        "block-size", "Block size", "", {}, ("workload", "block_size"), block_size.METRICS, [], rows
    )
    seen: list[Any] = []
    real_save = plots.save_png

    def keep(fig: Any, path: Path) -> Path:
        seen.extend(fig.axes)
        return real_save(fig, path)

    monkeypatch.setattr(plots, "save_png", keep)
    block_size.plot(result, tmp_path)
    throughput = [ax for ax in seen if "throughput" in ax.get_ylabel()]
    assert sorted(ax.get_title() for ax in throughput) == ["alpaca-like", "sharegpt-like"]
    top = {ax.get_title(): ax.get_ylim()[1] for ax in throughput}
    assert top["alpaca-like"] > 5 * top["sharegpt-like"]
    assert len(seen) == len(block_size.PLOTTED) + 1
    assert (tmp_path / "block_size.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("metric", "values"),
    [("preemptions", [0.0, 0.0]), ("token_utilization", [0.98, 1.0]), ("m", [-1.0, 1.0])],
)
def test_the_y_axis_stops_at_the_metrics_bounds(metric: str, values: list[float]) -> None:
    rows = [
        {"g": "a", "x": i, f"{metric}_mean": v, f"{metric}_ci_low": v, f"{metric}_ci_high": v}
        for i, v in enumerate(values)
    ]
    fig, (ax,) = plots.figure(1)
    plots.summary_lines(ax, rows, "x", "g", metric)
    low, high = ax.get_ylim()
    lowest, highest = bounds(metric)
    assert low < min(values) or low == lowest
    assert lowest is None or low >= lowest
    assert highest is None or high <= highest * 1.02
    assert high > max(values) or high == max(values) == highest
    fig.clf()

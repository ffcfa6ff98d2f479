"""Shared matplotlib helpers: the Agg backend, labelled axes with units, intervals drawn.

Every plot of an experiment draws a mean with its 95% confidence interval: a shaded band
around a line, or error bars on points and bars. Figures hold at most ``PER_ROW`` panels a
row, laid out by matplotlib's constrained layout and saved with a tight bounding box, so no
label is cut off; every panel has its own y scale (never ``sharey``), and ``panels_by_scale``
gives groups whose values differ ``SCALE_RATIO``-fold or more panels of their own, so the small
one is not drawn flat along the axis. Figures are written as PNG atomically. matplotlib is
imported only when a figure is made (``pagedkv[plot]``).
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pagedkv.errors import PagedKVError
from pagedkv.experiments.metrics import bounds
from pagedkv.io import atomic_write_bytes

DPI = 110
PER_ROW = 3
"""The most panels side by side (more wrap onto further rows): each stays readable on a page."""
LABEL_CHARS = 36
"""Axis labels longer than this wrap onto further lines: a y label must fit its panel's height."""
SCALE_RATIO = 10.0
"""Groups whose largest values differ this many times or more get panels of their own."""


def require_matplotlib() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display needed), or a clear error."""
    try:
        import matplotlib
    except ImportError as exc:
        raise PagedKVError("plots need matplotlib: pip install 'pagedkv[plot]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure(ncols: int = 1, *, width: float = 6.0, height: float = 4.0) -> tuple[Any, list[Any]]:
    """A figure of ``ncols`` panels (``width`` x ``height`` inches each), at most ``PER_ROW``
    a row, each with its own y axis; the axes in reading order."""
    plt = require_matplotlib()
    rows = -(-ncols // PER_ROW)
    cols = min(ncols, PER_ROW)
    fig, axes = plt.subplots(
        rows,
        cols,
        figsize=(width * cols, height * rows),
        squeeze=False,
        sharey=False,
        layout="constrained",
    )
    flat = [ax for line in axes for ax in line]
    for ax in flat[ncols:]:
        ax.remove()  # the empty places of a last row that is not full
    return fig, flat[:ncols]


def panels_by_scale(
    summary: Sequence[Mapping[str, Any]],
    group: str,
    metrics: Sequence[str],
    ratio: float = SCALE_RATIO,
) -> list[tuple[str, list[Any]]]:
    """(metric, the groups drawn in its panel) for each metric: all groups in one panel, or,
    where their largest absolute means differ ``ratio``-fold or more, one panel per group."""
    groups = list(dict.fromkeys(s[group] for s in summary))
    out: list[tuple[str, list[Any]]] = []
    for m in metrics:
        peak = {
            g: max(
                (
                    abs(float(s[f"{m}_mean"]))
                    for s in summary
                    if s[group] == g and s[f"{m}_mean"] is not None
                ),
                default=0.0,
            )
            for g in groups
        }
        positive = [v for v in peak.values() if v > 0]
        if positive and max(positive) >= ratio * min(positive):
            out += [(m, [g]) for g in groups]
        else:
            out.append((m, groups))
    return out


def label(ax: Any, xlabel: str, ylabel: str, title: str = "") -> None:
    """Axis labels (with their units, e.g. 'throughput (requests/s)', wrapped at
    ``LABEL_CHARS``) and a title."""
    ax.set_xlabel(textwrap.fill(xlabel, LABEL_CHARS * 2))
    ax.set_ylabel(textwrap.fill(ylabel, LABEL_CHARS))
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)


def _err(
    mean: Sequence[float | None], low: Sequence[float | None], high: Sequence[float | None]
) -> list[list[float]]:
    below = [
        m - lo if m is not None and lo is not None else 0.0 for m, lo in zip(mean, low, strict=True)
    ]
    above = [
        hi - m if m is not None and hi is not None else 0.0
        for m, hi in zip(mean, high, strict=True)
    ]
    return [below, above]


def line_ci(
    ax: Any,
    x: Sequence[float],
    mean: Sequence[float | None],
    low: Sequence[float | None],
    high: Sequence[float | None],
    label_: str,
    *,
    band: bool = True,
) -> None:
    """A line of means with its interval, a shaded band (``band``) or error bars."""
    keep = [i for i, m in enumerate(mean) if m is not None]
    xs = [x[i] for i in keep]
    ms = [float(mean[i]) for i in keep]  # type: ignore[arg-type]
    lo = [low[i] if low[i] is not None else mean[i] for i in keep]
    hi = [high[i] if high[i] is not None else mean[i] for i in keep]
    if band:
        (line,) = ax.plot(xs, ms, marker="o", markersize=3, label=label_)
        ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    else:
        ax.errorbar(
            xs, ms, yerr=_err(ms, lo, hi), marker="o", markersize=3, capsize=3, label=label_
        )


def bars_ci(
    ax: Any,
    names: Sequence[str],
    mean: Sequence[float | None],
    low: Sequence[float | None],
    high: Sequence[float | None],
    *,
    offset: float = 0.0,
    width: float = 0.8,
    label_: str | None = None,
) -> None:
    """Bars of means with error bars for their intervals (a missing mean draws no bar)."""
    xs = [i + offset for i in range(len(names))]
    ms = [m if m is not None else 0.0 for m in mean]
    ax.bar(xs, ms, width=width, yerr=_err(ms, low, high), capsize=3, label=label_)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right")


def save_png(fig: Any, path: Path) -> Path:
    """Render ``fig`` as PNG (its bounding box tight around everything drawn, labels
    included) and write it atomically (temporary file, then rename)."""
    plt = require_matplotlib()
    buf = io.BytesIO()
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    fig.savefig(
        buf,
        format="png",
        dpi=DPI,
        metadata={"Software": None},
        bbox_inches="tight",
        pad_inches=0.08,
    )
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())


def summary_lines(
    ax: Any,
    summary: Sequence[Mapping[str, Any]],
    x: str,
    group: str,
    metric: str,
    *,
    band: bool = True,
    log_x: bool = False,
    only: Sequence[Any] | None = None,
) -> None:
    """One line per value of ``group`` over ``x`` (those in ``only`` where given): a
    summary's ``metric`` mean and 95% CI."""
    groups: dict[Any, list[Mapping[str, Any]]] = {}
    for s in summary:
        if only is None or s[group] in only:
            groups.setdefault(s[group], []).append(s)
    for name, rows in groups.items():
        rows = sorted(rows, key=lambda s: s[x])
        line_ci(
            ax,
            [s[x] for s in rows],
            [s[f"{metric}_mean"] for s in rows],
            [s[f"{metric}_ci_low"] for s in rows],
            [s[f"{metric}_ci_high"] for s in rows],
            str(name),
            band=band,
        )
    if log_x:
        ax.set_xscale("log", base=2)
    lowest, highest = bounds(
        metric
    )  # no axis below what the metric can be (e.g. -0.04 preemptions)
    bottom, top = ax.get_ylim()
    ax.set_ylim(
        bottom if lowest is None else max(bottom, lowest),
        top if highest is None else min(top, highest + 0.02 * (highest - (lowest or 0.0))),
    )
    ax.legend(fontsize=7)

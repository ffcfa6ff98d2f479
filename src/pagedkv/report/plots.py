"""Shared matplotlib helpers: the Agg backend, labelled axes with units, intervals drawn.

Every plot of an experiment draws a mean with its 95% confidence interval: a shaded band
around a line, or error bars on points and bars. Figures are written as PNG atomically.
matplotlib is imported only when a figure is made (``pagedkv[plot]``).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pagedkv.errors import PagedKVError
from pagedkv.io import atomic_write_bytes

DPI = 110


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
    """A figure with ``ncols`` side-by-side axes."""
    plt = require_matplotlib()
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return fig, list(axes[0])


def label(ax: Any, xlabel: str, ylabel: str, title: str = "") -> None:
    """Axis labels (with their units, e.g. 'throughput (requests/s)') and a title."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
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
    """Render ``fig`` as PNG and write it atomically (temporary file, then rename)."""
    plt = require_matplotlib()
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
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
) -> None:
    """One line per value of ``group`` over ``x``: a summary's ``metric`` mean and 95% CI."""
    groups: dict[Any, list[Mapping[str, Any]]] = {}
    for s in summary:
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
    ax.legend(fontsize=7)

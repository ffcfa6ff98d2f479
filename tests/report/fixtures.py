"""Synthetic results directories in the experiments' schema, and readers of the report page.

The report must not wait for the real experiments: these write small ``results.json`` files,
real PNGs (matplotlib, Agg) and a claims file, and parse the page back with ``html.parser``.
"""

from __future__ import annotations

import base64
import io
import json
import struct
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
from matplotlib import pyplot as plt

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HOSTILE = "<script>alert('x')</script> & \"quotes\""
"""Text that must come out escaped, never as markup."""


def write_png(path: Path, points: list[float], size: tuple[float, float] = (3.0, 2.0)) -> None:
    fig, ax = plt.subplots(figsize=size)
    ax.plot(range(len(points)), points, marker="o")
    ax.set_xlabel("x (unit)")
    ax.set_ylabel("y (unit)")
    fig.savefig(path, format="png", dpi=50)
    plt.close(fig)


def experiment(
    name: str,
    title: str,
    plots: list[str],
    *,
    findings: list[str] | None = None,
    quick: bool = False,
) -> dict[str, Any]:
    """A results.json of the schema: two configurations x three seeds (a quick one: two
    seeds, so no interval), one metric."""
    seeds = [0, 1] if quick else [0, 1, 2]
    rows = [
        {"block_size": b, "seed": s, "throughput": 1.0 + b / 10 + s / 100}
        for b in (8, 16)
        for s in seeds
    ]
    summary = [
        {
            "block_size": b,
            "throughput_mean": 1.0 + b / 10 + 0.005,
            "throughput_ci_low": None if quick else 1.0 + b / 10 - 0.05,
            "throughput_ci_high": None if quick else 1.0 + b / 10 + 0.06,
            "n": len(seeds),
        }
        for b in (8, 16)
    ]
    return {
        "experiment": name,
        "title": title,
        "question": f"Which block size is best? {HOSTILE}",
        "setup": {
            "model": "OPT-13B",
            "seeds": seeds,
            "quick": quick,
            "workload": HOSTILE,
            "num_requests": 40 if quick else 400,
        },
        "columns": ["block_size", "seed", "throughput"],
        "rows": rows,
        "summary_columns": list(summary[0]),
        "summary": summary,
        "plots": [{"file": p, "caption": f"{title}: {p} <i>caption</i>"} for p in plots],
        "findings": findings if findings is not None else [f"A finding of {title} & co."],
    }


CLAIMS: list[dict[str, Any]] = [
    {
        "id": "paged-utilization",
        "source": "seed-simulator",
        "statement": "Paging improves utilization 2-4x <b>",
        "metric": "token utilization ratio",
        "measured": 2.5,
        "ci_low": 2.1,
        "ci_high": 2.9,
        "unit": "x",
        "verdict": "supported",
        "claimed": "in [2, 4]; favour: higher",
        "citation": "the seed's README",
        "condition": "at equal memory",
        "time_model": None,
        "judged": "sharegpt-like: supported",
        "evidence": "block-size",
    },
    {
        "id": "block-16-optimal",
        "source": "seed-simulator",
        "statement": "Block size 16 is optimal",
        "metric": "throughput rank",
        "measured": None,
        "ci_low": None,
        "ci_high": None,
        "unit": "",
        "verdict": "not measured",
        "claimed": ">= 0.95; favour: higher",
        "citation": "the seed's README",
        "condition": "",
        "time_model": "needs a time model: the roofline cost model",
        "judged": "sharegpt-like: not measured",
        "evidence": "not-an-experiment",
    },
    {
        "id": "vllm-2-4x",
        "source": "vllm-paper",
        "statement": "2-4x throughput over Orca at the same latency",
        "metric": "throughput ratio",
        "measured": 1.5,
        "ci_low": 1.2,
        "ci_high": 1.8,
        "unit": "x",
        "verdict": "contradicted",
        "claimed": "in [1.7, 2.7]; favour: higher",
        "citation": "§6.2, Fig. 12",
        "condition": "ShareGPT-like",
        "time_model": "needs a time model: the roofline cost model",
        "judged": "sharegpt-like: contradicted",
        "evidence": "rate-latency",
    },
]


def make_results(root: Path, *, quick: bool = False) -> Path:
    """Two experiments (three plots in all) and a claims file under ``root``."""
    specs = [
        ("rate-latency", "Rate and latency", ["latency.png"]),
        ("block-size", "Block size", ["throughput.png", "preemptions.png"]),
    ]
    for i, (name, title, plots) in enumerate(specs):
        d = root / name
        d.mkdir(parents=True)
        for j, p in enumerate(plots):
            write_png(d / p, [float(i), float(j + 1), 0.5], size=(3.0 + j, 2.0))
        (d / "results.json").write_text(json.dumps(experiment(name, title, plots, quick=quick)))
    (root / "claims").mkdir()
    (root / "claims" / "claims.json").write_text(json.dumps({"claims": CLAIMS}))
    return root


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; AssertionError if it is not a PNG."""
    assert data[:8] == PNG_SIGNATURE, "not a PNG signature"
    assert data[12:16] == b"IHDR", "the first chunk is not IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 0
    assert height > 0
    return width, height


def decode_png(data: bytes) -> tuple[int, int]:
    """Decode the whole image (matplotlib reads it with Pillow-free libpng); its (w, h)."""
    from matplotlib import image

    pixels = image.imread(io.BytesIO(data), format="png")
    return int(pixels.shape[1]), int(pixels.shape[0])


def data_uri_bytes(uri: str) -> bytes:
    head, _, payload = uri.partition(",")
    assert head == "data:image/png;base64", head
    return base64.b64decode(payload, validate=True)


class Page(HTMLParser):
    """What the tests look at in the page: images, tables and their rows, ids, links."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[dict[str, str]] = []
        self.tables: list[list[list[str]]] = []  # rows of cell texts
        self.row_classes: list[list[str]] = []
        self.ids: list[str] = []
        self.links: list[str] = []
        self.external: list[str] = []  # tags that would load something
        self.body_attrs: dict[str, str] = {}
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if "id" in a:
            self.ids.append(a["id"])
        if tag == "body":
            self.body_attrs = a
        if tag == "img":
            self.images.append(a)
        if tag == "a":
            self.links.append(a.get("href", ""))
        if tag in ("link", "iframe", "object", "embed") or (tag == "script" and "src" in a):
            self.external.append(tag)
        if tag == "table":
            self.tables.append([])
            self.row_classes.append([])
        elif tag == "tr":
            self.tables[-1].append([])
            self.row_classes[-1].append(a.get("class", ""))
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def parse(text: str) -> Page:
    page = Page()
    page.feed(text)
    page.close()
    return page

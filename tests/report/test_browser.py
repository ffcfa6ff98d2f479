"""The report opened in headless Chromium: every image decodes, the tables are there.

The page's own inline script marks each ``<img>`` with ``data-decoded`` ("yes" when
``complete && naturalWidth > 0``) on the load event; ``--dump-dom`` prints the DOM after it.
A deliberately corrupt PNG must come out "no", so the check cannot pass vacuously.
Skipped, with the reason, where no Chromium is installed (``make test`` installs Debian's
``chromium`` where the machine allows it).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pagedkv.report.block_map import run_block_map
from pagedkv.report.html import build_report
from tests.report.fixtures import CLAIMS, make_results, parse

CHROMIUM = next(
    (
        p
        for p in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser"))
        if p and Path(p).is_file()
    ),
    None,
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (apt-get install chromium); "
    "the headless-browser check of the HTML report is skipped",
)


def render(page: Path, profile: Path) -> str:
    """The DOM after load, as headless Chromium prints it (offline: nothing to fetch)."""
    assert CHROMIUM is not None
    args = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        "--dump-dom",
        page.resolve().as_uri(),
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_every_image_decodes_and_the_tables_render(tmp_path: Path) -> None:
    results = make_results(tmp_path / "results")
    run_block_map(results / "block-map", quick=True)
    dom = parse(render(build_report(results), tmp_path / "profile"))
    n = len(dom.images)
    assert n == 4  # three synthetic plots and the lesson's block map
    assert [img.get("data-decoded") for img in dom.images] == ["yes"] * n
    assert dom.body_attrs.get("data-images-decoded") == f"{n}/{n}"
    headers = [t[0] for t in dom.tables if t]
    assert sum(any("mean [95% CI]" in h for h in hs) for hs in headers) == 3
    claims = next(t for t in dom.tables if t[0][:2] == ["id", "source"])
    assert [row[0] for row in claims[1:]] == [c["id"] for c in CLAIMS]


def test_a_corrupt_image_is_caught(tmp_path: Path) -> None:
    results = make_results(tmp_path / "results")
    png = results / "rate-latency" / "latency.png"
    png.write_bytes(png.read_bytes()[:40])  # a PNG header and nothing to draw
    dom = parse(render(build_report(results), tmp_path / "profile"))
    decoded = {img["alt"].split(": ")[1].split(" ")[0]: img["data-decoded"] for img in dom.images}
    assert decoded == {"latency.png": "no", "throughput.png": "yes", "preemptions.png": "yes"}
    assert dom.body_attrs.get("data-images-decoded") == "2/3"

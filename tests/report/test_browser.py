"""The report opened in headless Chromium: every image decodes, the tables are there, nothing
overflows the window, the summary comes first, the quick banner shows exactly when it should,
and a screenshot of the page is a real picture of the expected size with clear margins.

The page's own inline script marks each ``<img>`` with ``data-decoded`` ("yes" when
``complete && naturalWidth > 0``) and the body with the document's ``scrollWidth`` and the
window's ``innerWidth`` on the load event; ``--dump-dom`` prints the DOM after it. A
deliberately corrupt PNG must come out "no", so the check cannot pass vacuously.
Skipped, with the reason, where no Chromium is installed (``make test`` installs Debian's
``chromium`` where the machine allows it).
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pagedkv.report.block_map import run_block_map
from pagedkv.report.html import build_report
from tests.report.fixtures import CLAIMS, make_results, parse, png_size

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


def chromium(page: Path, profile: Path, *extra: str) -> str:
    """Run headless Chromium on ``page`` (offline: nothing to fetch); its standard output."""
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
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        *extra,
        page.resolve().as_uri(),
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def render(page: Path, profile: Path, width: int = 1280) -> str:
    """The DOM after load, in a window ``width`` pixels wide."""
    return chromium(page, profile, f"--window-size={width},900", "--dump-dom")


def quick_page(tmp_path: Path, *, quick: bool = True) -> Path:
    """The synthetic results and the lesson's block map (wide tables, a real picture)."""
    results = make_results(tmp_path / "results", quick=quick)
    run_block_map(results / "block-map", quick=True)
    return build_report(results)


def test_every_image_decodes_and_the_tables_render(tmp_path: Path) -> None:
    dom = parse(render(quick_page(tmp_path, quick=False), tmp_path / "profile"))
    n = len(dom.images)
    assert n == 4  # three synthetic plots and the lesson's block map
    assert [img.get("data-decoded") for img in dom.images] == ["yes"] * n
    assert dom.body_attrs.get("data-images-decoded") == f"{n}/{n}"
    headers = [t[0] for t in dom.tables if t]
    assert sum(any("mean [95% CI]" in h for h in hs) for hs in headers) == 2
    assert sum(any(h.endswith(" mean") for h in hs) for hs in headers) == 1  # the block map: n=1
    claims = next(t for t in dom.tables if t[0][:2] == ["id", "source"])
    assert [row[0] for row in claims[1:]] == [c["id"] for c in CLAIMS]


@pytest.mark.parametrize("width", [1280, 800])
def test_nothing_overflows_the_window(tmp_path: Path, width: int) -> None:
    """Wide tables scroll inside their own box; the page itself never scrolls sideways."""
    dom = parse(render(quick_page(tmp_path), tmp_path / "profile", width))
    assert int(dom.body_attrs["data-viewport-width"]) == width
    assert 0 < int(dom.body_attrs["data-scroll-width"]) <= width


@pytest.mark.parametrize("quick", [True, False])
def test_summary_first_and_the_banner_iff_quick(tmp_path: Path, quick: bool) -> None:
    text = render(quick_page(tmp_path, quick=quick), tmp_path / "profile")
    sections = re.findall(r'<section id="([^"]+)"', text)
    assert sections[0] == "summary"
    assert sections[1:] == ["exp-block-map", "exp-block-size", "exp-rate-latency", "claims"]
    # the block map is quick either way: the page's banner follows the experiments'
    assert ('<p class="quick"' in text.split('<section id="exp-block-map">')[0]) is True
    assert ('class="quick"' in section_text(text, "exp-block-size")) is quick
    assert ('class="quick"' in section_text(text, "claims")) is quick


def section_text(text: str, ident: str) -> str:
    start = text.index(f'<section id="{ident}">')
    return text[start : text.index("</section>", start)]


def test_a_screenshot_shows_the_page_with_clear_margins(tmp_path: Path) -> None:
    """The screenshot is a PNG of the window's size with something drawn on it, and its right
    margin (the body is at most 1200 px wide and centred) is blank: nothing pokes out."""
    from matplotlib import image

    shot = tmp_path / "report.png"
    width, height = 1280, 4000  # tall enough for the block map's wide summary table
    chromium(
        quick_page(tmp_path),
        tmp_path / "profile",
        f"--window-size={width},{height}",
        f"--screenshot={shot}",
    )
    data = shot.read_bytes()
    assert png_size(data) == (width, height)
    pixels = image.imread(io.BytesIO(data), format="png")[:, :, :3]
    ink = (pixels.min(axis=2) < 0.9).mean()  # share of pixels that are not near-white
    assert 0.02 < ink < 0.6, ink
    margin = pixels[:, width - 24 :, :]
    assert margin.min() > 0.97, "something is drawn in the right margin"


def test_a_corrupt_image_is_caught(tmp_path: Path) -> None:
    results = make_results(tmp_path / "results")
    png = results / "rate-latency" / "latency.png"
    png.write_bytes(png.read_bytes()[:40])  # a PNG header and nothing to draw
    dom = parse(render(build_report(results), tmp_path / "profile"))
    decoded = {img["alt"].split(": ")[1].split(" ")[0]: img["data-decoded"] for img in dom.images}
    assert decoded == {"latency.png": "no", "throughput.png": "yes", "preemptions.png": "yes"}
    assert dom.body_attrs.get("data-images-decoded") == "2/3"

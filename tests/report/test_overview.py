"""The report's summary section, the quick banners, and "n too small for an interval"."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pagedkv.errors import PagedKVError
from pagedkv.experiments import reproduce as reproduce_mod
from pagedkv.report.html import build_report
from pagedkv.report.markup import QUICK_MEANING, esc
from pagedkv.report.overview import TIMINGS
from tests.report.fixtures import CLAIMS, experiment, make_results, parse

BANNER = '<p class="quick" role="note">'
TABLE = '<div class="scroll"><table>'


def page_text(results: Path) -> str:
    return build_report(results).read_text(encoding="utf-8")


def section(text: str, ident: str) -> str:
    start = text.index(f'<section id="{ident}">')
    return text[start : text.index("</section>", start)]


def test_the_summary_is_the_first_section_and_links_every_experiment(tmp_path: Path) -> None:
    text = page_text(make_results(tmp_path / "r"))
    page = parse(text)
    assert page.ids[0] == "summary"
    assert text.index('<section id="summary">') < text.index("<nav>")
    runs = next(t for t in page.tables if t[0][:2] == ["experiment", "command"])
    by_title = {row[0]: row for row in runs[1:]}
    assert set(by_title) == {"Block size", "Rate and latency"}
    for name, title in (("block-size", "Block size"), ("rate-latency", "Rate and latency")):
        data = experiment(name, title, [])
        row = dict(zip(runs[0], by_title[title], strict=True))
        assert row["command"] == f"pagedkv experiment {name} --seeds 3"
        assert row["configurations"] == str(len(data["summary"]))
        assert row["runs"] == str(len(data["rows"]))
        assert row["seeds"] == "3"
        assert row["requests a run"] == "400"
        assert f'href="#exp-{name}"' in section(text, "summary")
    assert "Wall time was not recorded" in section(text, "summary")


def test_claims_at_a_glance_link_to_their_rows(tmp_path: Path) -> None:
    text = page_text(make_results(tmp_path / "r"))
    page = parse(text)
    glance = next(t for t in page.tables if t[0][:2] == ["claim", "verdict"])
    assert [(r[0], r[1]) for r in glance[1:]] == [(c["id"], c["verdict"]) for c in CLAIMS]
    summary = section(text, "summary")
    for c in CLAIMS:
        assert f'href="#claim-{c["id"]}"' in summary
        assert f'id="claim-{c["id"]}"' in section(text, "claims")
    assert "3 claims: 1 supported, 1 contradicted, 1 not measured" in summary
    claims_rows = next(t for t in page.tables if t[0][:2] == ["id", "source"])[1:]
    assert [r[9] for r in claims_rows] == [r[1] for r in glance[1:]]  # the same verdicts


def test_wall_time_comes_from_timings_json(tmp_path: Path) -> None:
    results = make_results(tmp_path / "r")
    timings = {
        "command": "pagedkv reproduce",
        "steps": {"block-size": 12.5, "rate-latency": 3.25},
        "total_s": 99.0,
    }
    (results / TIMINGS).write_text(json.dumps(timings))
    text = page_text(results)
    assert "<code>pagedkv reproduce</code> took 99 s of wall time" in text
    runs = next(t for t in parse(text).tables if t[0][:2] == ["experiment", "command"])
    wall = {row[0]: row[-1] for row in runs[1:]}
    assert wall == {"Rate and latency": "3.2 s", "Block size": "12 s"}


def test_a_malformed_timings_file_is_one_error_naming_it(tmp_path: Path) -> None:
    results = make_results(tmp_path / "r")
    (results / TIMINGS).write_text(json.dumps({"total_s": "long"}))
    with pytest.raises(PagedKVError, match=r"timings\.json"):
        build_report(results)


def test_reproduce_records_its_timings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no experiment and no claim (replaced: the real ones take minutes), reproduce still
    draws the quick block map and writes timings.json, which the page's summary reads."""
    monkeypatch.setattr(reproduce_mod, "EXPERIMENTS", {})
    monkeypatch.setattr(reproduce_mod, "run_claims", lambda *a, **k: [])
    page = reproduce_mod.reproduce(tmp_path, quick=True, say=lambda _: None)
    timings = json.loads((tmp_path / TIMINGS).read_text())
    assert timings["command"] == "pagedkv reproduce --quick"
    assert set(timings["steps"]) == {"block-map", "claims"}
    assert timings["total_s"] >= timings["steps"]["block-map"] >= 0
    assert "<code>pagedkv reproduce --quick</code> took" in page.read_text(encoding="utf-8")


def banners_before_tables(text: str) -> list[bool]:
    """For each table of the page: is the quick banner right above it?"""
    right_above = re.compile(
        re.escape(BANNER) + r"<strong>Quick results</strong>(?:(?!<p).)*</p>\Z"
    )
    return [
        bool(right_above.search(text[: m.start()])) for m in re.finditer(re.escape(TABLE), text)
    ]


def test_quick_results_carry_a_banner_on_the_page_and_over_every_table(tmp_path: Path) -> None:
    text = page_text(make_results(tmp_path / "r", quick=True))
    assert text.index(BANNER) < text.index('<section id="summary">')
    assert esc(QUICK_MEANING) in text
    assert all(banners_before_tables(text))
    assert len(banners_before_tables(text)) == 2 * 3 + 3  # setup, summary, raw per experiment
    assert "(--quick: 2 seeds, 40 requests a run)" in section(text, "exp-block-size")


def test_full_results_have_no_banner(tmp_path: Path) -> None:
    text = page_text(make_results(tmp_path / "r"))
    assert BANNER not in text
    assert 'class="quick"' not in text


def test_only_the_quick_experiments_tables_carry_the_banner(tmp_path: Path) -> None:
    results = make_results(tmp_path / "r")
    quick = experiment("block-size", "Block size", [], quick=True)
    (results / "block-size" / "results.json").write_text(json.dumps(quick))
    (results / "claims" / "claims.json").write_text(
        json.dumps({"claims": [c for c in CLAIMS if c["evidence"] == "rate-latency"]})
    )
    text = page_text(results)
    assert BANNER in text[: text.index('<section id="summary">')]  # the page says so
    assert BANNER in section(text, "exp-block-size")
    assert BANNER not in section(text, "exp-rate-latency")
    assert BANNER not in section(text, "claims")  # its evidence is the full run


def test_two_seeds_say_n_too_small_for_an_interval(tmp_path: Path) -> None:
    text = page_text(make_results(tmp_path / "r", quick=True))
    part = section(text, "exp-block-size")
    assert "n = 2: n too small for an interval (it needs 3 seeds or more)" in part
    summary = next(t for t in parse(part).tables if any(h.startswith("throughput") for h in t[0]))
    assert summary[0] == ["block_size", "throughput mean", "n"]
    means = [experiment("block-size", "", [], quick=True)["summary"][i] for i in (0, 1)]
    assert [r[1] for r in summary[1:]] == [f"{s['throughput_mean']:.4g}" for s in means]
    assert "n too small" not in page_text(make_results(tmp_path / "full"))

"""The HTML report from synthetic results directories: structure, embedding, escaping."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pagedkv.errors import PagedKVError
from pagedkv.report.html import build_report, fmt_interval
from tests.report.fixtures import (
    CLAIMS,
    HOSTILE,
    data_uri_bytes,
    decode_png,
    make_results,
    parse,
    png_size,
)


@pytest.fixture
def results(tmp_path: Path) -> Path:
    return make_results(tmp_path / "results")


def test_every_plot_is_embedded_as_a_png_that_decodes(results: Path) -> None:
    page = parse(build_report(results).read_text(encoding="utf-8"))
    sources = sorted(p for p in results.rglob("*.png"))
    assert len(page.images) == len(sources) == 3
    embedded = sorted(data_uri_bytes(img["src"]) for img in page.images)
    assert embedded == sorted(p.read_bytes() for p in sources)  # byte for byte, nothing lost
    for data in embedded:
        assert decode_png(data) == png_size(data)


def test_works_offline_nothing_external(results: Path) -> None:
    page = parse(build_report(results).read_text(encoding="utf-8"))
    assert page.external == []
    assert all(img["src"].startswith("data:") for img in page.images)
    assert all(href.startswith("#") for href in page.links)
    assert {h[1:] for h in page.links} <= set(page.ids)  # every link has its target


def test_summary_tables_show_mean_and_interval(results: Path) -> None:
    page = parse(build_report(results).read_text(encoding="utf-8"))
    data = json.loads((results / "block-size" / "results.json").read_text())
    expected = [
        fmt_interval(s["throughput_mean"], s["throughput_ci_low"], s["throughput_ci_high"])
        for s in data["summary"]
    ]
    summaries = [t for t in page.tables if any("mean [95% CI]" in h for h in t[0])]
    assert len(summaries) == 2  # one per experiment
    cells = [row[1] for t in summaries for row in t[1:]]
    assert all(e in cells for e in expected)
    assert expected[0].count("[") == 1
    assert expected[0].endswith("]")


def test_claims_table_has_one_row_per_claim_with_its_verdict(results: Path) -> None:
    page = parse(build_report(results).read_text(encoding="utf-8"))
    claims = next(t for t in page.tables if t[0][:2] == ["id", "source"])
    body = claims[1:]
    assert [r[0] for r in body] == [c["id"] for c in CLAIMS]
    verdict = claims[0].index("verdict")
    assert [r[verdict] for r in body] == [c["verdict"] for c in CLAIMS]
    measured = claims[0].index("measured [95% CI]")
    assert [r[measured] for r in body] == ["2.5 [2.1, 2.9] x", "-", "1.5 [1.2, 1.8] x"]
    classes = next(c for c, t in zip(page.row_classes, page.tables, strict=True) if t is claims)[1:]
    assert classes == ["ok", "other", "bad"]
    for column, key in (
        ("claimed range", "claimed"),
        ("source states it", "citation"),
        ("measured under", "condition"),
    ):
        i = claims[0].index(column)
        assert [r[i] for r in body] == [c[key] or "-" for c in CLAIMS]
    assert "#exp-block-size" in page.links
    assert "#exp-rate-latency" in page.links


def test_text_is_escaped_never_markup(results: Path) -> None:
    text = build_report(results).read_text(encoding="utf-8")
    assert HOSTILE not in text
    assert "<b>" not in text
    assert text.count("<script>") == 1  # the page's own image check, nothing injected
    page = parse(text)
    cells = [c for t in page.tables for row in t for c in row]
    assert HOSTILE in cells  # the setup's value, shown as text


def test_sections_follow_the_known_order_and_an_index_lists_them(results: Path) -> None:
    page = parse(build_report(results).read_text(encoding="utf-8"))
    sections = [i for i in page.ids if i.startswith("exp-") or i == "claims"]
    assert sections == ["exp-block-size", "exp-rate-latency", "claims"]
    assert page.links[:3] == ["#" + s for s in sections]


def test_same_inputs_give_identical_bytes_wherever_they_lie(results: Path, tmp_path: Path) -> None:
    first = build_report(results).read_bytes()
    copy = shutil.copytree(results, tmp_path / "elsewhere" / "deeper")
    (copy / "report.html").unlink()
    assert build_report(copy, tmp_path / "out" / "page.html").read_bytes() == first
    assert build_report(results).read_bytes() == first


def test_a_missing_plot_is_a_note_not_a_failure(results: Path) -> None:
    (results / "block-size" / "preemptions.png").unlink()
    text = build_report(results).read_text(encoding="utf-8")
    assert "Plot preemptions.png is missing or not an image." in text
    assert len(parse(text).images) == 2


def test_a_plot_outside_its_directory_is_not_embedded(results: Path) -> None:
    path = results / "block-size" / "results.json"
    data = json.loads(path.read_text())
    data["plots"] = [{"file": "../rate-latency/latency.png", "caption": "escape"}]
    path.write_text(json.dumps(data))
    assert len(parse(build_report(results).read_text(encoding="utf-8")).images) == 1


def test_a_linked_plot_leading_out_of_the_results_is_not_embedded(
    results: Path, tmp_path: Path
) -> None:
    """A .png that is a link to a file outside (issue 17, defect 10): a note, not its bytes."""
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"not for the page")
    plot = results / "block-size" / "preemptions.png"
    plot.unlink()
    plot.symlink_to(secret)
    text = build_report(results).read_text(encoding="utf-8")
    assert "Plot preemptions.png is missing or not an image." in text
    assert len(parse(text).images) == 2
    assert all(data_uri_bytes(i["src"]) != secret.read_bytes() for i in parse(text).images)


def test_a_link_inside_the_results_is_followed(results: Path) -> None:
    plot = results / "block-size" / "preemptions.png"
    moved = results / "block-size" / "kept.png"
    plot.rename(moved)
    plot.symlink_to(moved.name)
    assert len(parse(build_report(results).read_text(encoding="utf-8")).images) == 3


def test_linked_results_leading_out_are_not_read(results: Path, tmp_path: Path) -> None:
    outside = shutil.copytree(results / "rate-latency", tmp_path / "outside")
    shutil.rmtree(results / "rate-latency")
    (results / "rate-latency").mkdir()
    (results / "rate-latency" / "results.json").symlink_to(outside / "results.json")
    page = parse(build_report(results).read_text(encoding="utf-8"))
    assert "exp-rate-latency" not in page.ids
    (results / "claims").rename(tmp_path / "claims")
    (results / "claims").symlink_to(tmp_path / "claims")
    with pytest.raises(PagedKVError, match="a link out of"):
        build_report(results)


def test_claims_alone_or_experiments_alone_are_enough(results: Path) -> None:
    shutil.rmtree(results / "claims")
    page = parse(build_report(results).read_text(encoding="utf-8"))
    assert "claims" not in page.ids
    shutil.rmtree(results / "block-size")
    shutil.rmtree(results / "rate-latency")
    with pytest.raises(PagedKVError, match="no results in"):
        build_report(results)


def test_bad_json_names_the_file(results: Path) -> None:
    (results / "rate-latency" / "results.json").write_text("{not json")
    with pytest.raises(PagedKVError, match=r"rate-latency/results.json"):
        build_report(results)


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(PagedKVError, match="not a directory"):
        build_report(tmp_path / "missing")


def test_no_interval_shows_the_mean_alone() -> None:
    assert fmt_interval(0.5, None, None) == "0.5"
    assert fmt_interval(None, None, None) == "-"
    assert fmt_interval(1234567.0, 1e6, 1.5e6) == "1,234,567 [1,000,000, 1,500,000]"

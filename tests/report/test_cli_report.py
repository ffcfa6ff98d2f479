"""``pagedkv report [DIR]``: prints the page's path; exit 2 with a clear message on no results."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedkv.cli import main
from tests.report.fixtures import make_results, parse


def test_report_prints_the_page_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = make_results(tmp_path / "results")
    assert main(["report", str(results)]) == 0
    printed = capsys.readouterr().out.strip()
    assert Path(printed) == results / "report.html"
    assert Path(printed).is_file()
    out = tmp_path / "elsewhere.html"
    assert main(["report", str(results), "--out", str(out)]) == 0
    assert out.read_bytes() == (results / "report.html").read_bytes()


def test_report_defaults_to_results_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_results(tmp_path / "results")
    monkeypatch.chdir(tmp_path)
    assert main(["report"]) == 0
    assert capsys.readouterr().out.strip() == str(Path("results") / "report.html")


@pytest.mark.parametrize("make", [False, True])
def test_no_results_is_exit_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: bool
) -> None:
    target = tmp_path / "empty"
    if make:
        target.mkdir()
    assert main(["report", str(target)]) == 2
    assert "no results in" in capsys.readouterr().err
    assert not (target / "report.html").exists()


def test_block_map_flag_draws_it_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "r"), "--block-map", "--quick"]) == 0
    page = parse(Path(capsys.readouterr().out.strip()).read_text(encoding="utf-8"))
    assert "exp-block-map" in page.ids
    assert len(page.images) == 1


def test_report_to_stdout_is_the_page_itself(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = make_results(tmp_path / "results")
    assert main(["report", str(results), "--out", "-"]) == 0
    page = capsys.readouterr().out
    assert main(["report", str(results)]) == 0
    assert page == (results / "report.html").read_text(encoding="utf-8")
    assert not Path("-").exists()


@pytest.mark.parametrize(
    ("where", "content", "named"),
    [
        (
            "rate-latency/results.json",
            '{"summary": 5}',
            "rate-latency/results.json: summary: got 5",
        ),
        ("rate-latency/results.json", '{"rows": [1, 2]}', "rows: got [1, 2]; must be a list of"),
        ("rate-latency/results.json", '{"setup": []}', "setup: got []; must be an object"),
        ("rate-latency/results.json", '{"plots": "a.png"}', "plots: got 'a.png'"),
        ("rate-latency/results.json", '{"title": 3}', "title: got 3; must be a string"),
        ("rate-latency/results.json", "[]", "must be a JSON object"),
        ("rate-latency/results.json", '{"rows": [', "cannot be read as JSON"),
        ("claims/claims.json", '{"claims": [1]}', "claims/claims.json: claims: got [1]"),
        ("claims/claims.json", '{"claims": {}}', "claims: got {}; must be a list of objects"),
    ],
)
def test_a_results_file_of_the_wrong_shape_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, content: str, named: str
) -> None:
    root = make_results(tmp_path / "results")
    (root / where).write_text(content)
    assert main(["report", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("pagedkv: error: ")
    assert named in err
    assert not (root / "report.html").exists()

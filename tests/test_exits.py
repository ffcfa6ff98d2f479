"""Exit codes: one table (``pagedkv.exits``), the same in docs/cli.md and ``pagedkv --help``;
the served-nothing report counts and groups the reject reasons."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv import exits
from pagedkv.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _docs_codes() -> list[int]:
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    table = text.split("## Exit codes", 1)[1]
    return [int(m[1]) for m in re.finditer(r"^\| (\d+) \|", table, re.M)]


def _help_codes(capsys: pytest.CaptureFixture[str]) -> list[int]:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out.split("exit codes", 1)[1]
    return [int(m[1]) for m in re.finditer(r"^  (\d+) ", text, re.M)]


def test_docs_help_and_the_table_list_the_same_codes(capsys: pytest.CaptureFixture[str]) -> None:
    table = [code for code, _, _ in exits.EXIT_CODES]
    assert _help_codes(capsys) == table
    assert _docs_codes() == table
    constants = {v for k, v in vars(exits).items() if k.startswith("EXIT_") and isinstance(v, int)}
    assert constants == set(table)  # every constant is in the table, and nothing else


def test_the_readme_links_the_table() -> None:
    assert "docs/cli.md" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_nothing_served_from_no_requests() -> None:
    assert exits.served_nothing([]) == [
        "pagedkv: served nothing: the workload has no requests (an empty trace?)"
    ]


TEMPLATES = (
    "needs {} token slots; the KV cache of {} slots can never hold it",
    "prompt + output = {} > max_model_len {}",
    "its parent request {} was rejected{}",
    "{} beams: the static policy runs one sequence each{}",
    "watermark {} of {} blocks",
)


@given(
    st.lists(
        st.tuples(st.sampled_from(TEMPLATES), st.integers(0, 10**6), st.integers(0, 99)),
        min_size=1,
        max_size=40,
    )
)
@settings(max_examples=100, deadline=None)
def test_rejects_are_counted_and_grouped(draws: list[tuple[str, int, int]]) -> None:
    records = [
        {"request_id": i, "status": "rejected", "reject_reason": t.format(a, b)}
        for i, (t, a, b) in enumerate(draws)
    ]
    lines = exits.served_nothing(records)
    assert (
        lines[0] == f"pagedkv: served nothing: {len(records)} of {len(records)} requests rejected"
    )
    shown = [re.match(r"pagedkv:   (\d+) like request (\d+): (.*)$", line) for line in lines[1:]]
    groups = [m for m in shown if m]
    assert 1 <= len(groups) <= exits.MAX_REASONS
    counted = sum(int(m[1]) for m in groups)
    for m in groups:  # each group shown by the first request of it, with its own reason
        assert records[int(m[2])]["reject_reason"] == m[3]
    kinds = {t for t, _, _ in draws}
    if len(kinds) > exits.MAX_REASONS:
        rest = re.search(r"and (\d+) more for (\d+) other reasons", lines[-1])
        assert rest is not None
        counted += int(rest[1])
        assert int(rest[2]) == len(kinds) - exits.MAX_REASONS
    else:
        assert len(groups) == len(kinds)
    assert counted == len(records)
    sizes = [int(m[1]) for m in groups]
    assert sizes == sorted(sizes, reverse=True)  # the largest groups first

"""Exit codes: one table (``pagedkv.exits``), the same in docs/cli.md and ``pagedkv --help``;
the served-nothing report counts and groups the reject reasons."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pagedkv
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


def test_version_answers_without_importing_the_simulator() -> None:
    code = (
        "import sys; from pagedkv.cli import main; assert main(['--version']) == 0; "
        "assert 'pagedkv.simulation' not in sys.modules and 'numpy' not in sys.modules"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"pagedkv {pagedkv.__version__}\n"


def test_a_missing_extra_is_one_line_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "scipy" else real(name, *a)
    )
    out = tmp_path / "lesson"
    assert main(["experiment", "lesson", "--quick", "--out", str(out)]) == exits.EXIT_MISSING_EXTRA
    err = capsys.readouterr().err
    assert err == (
        "pagedkv: error: this command needs scipy, which is not installed: "
        "pip install 'pagedkv[plot]'\n"
    )
    assert not out.exists()  # nothing ran


def test_generate_without_torch_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"  # as if torch were not installed
        "from pagedkv.cli import main\n"
        "sys.exit(main(['generate', '--prompts', '1,2,3']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == exits.EXIT_MISSING_EXTRA, done.stderr
    assert "pip install 'pagedkv[torch]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_any_other_missing_module_is_a_bug_and_shows() -> None:
    exc = ModuleNotFoundError("No module named 'nonexistent'", name="nonexistent")
    assert exits.missing_extra(exc) is None
    with pytest.raises(ModuleNotFoundError):
        exits.require("pagedkv_no_such_module")

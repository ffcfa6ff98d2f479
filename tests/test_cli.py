"""The command line: `pagedkv bench` prints the lesson table and can write it as JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pagedkv.cli import main
from pagedkv.experiments.lesson_capacity import lesson_capacity


def test_bench_prints_the_lesson_table(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_path = tmp_path / "bench.json"
    assert main(["bench", "--json", str(out_path)]) == 0
    out = capsys.readouterr().out
    expected = lesson_capacity()
    assert f"all prompts: {expected.paged_blocks_prompts} " in out
    assert f"final length): {expected.paged_blocks_completion} " in out
    for row in expected.rows:
        assert row.allocator.split()[0] in out
    assert json.loads(out_path.read_text()) == json.loads(json.dumps(expected.to_dict()))


def test_unknown_command_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err

"""`pagedkv experiment`, `claims`, `reproduce` on the command line: exit codes and output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pagedkv.cli import main


def test_experiment_writes_its_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "lesson"
    assert main(["experiment", "lesson", "--quick", "--workers", "1", "--out", str(out)]) == 0
    assert json.loads((out / "results.json").read_text())["experiment"] == "lesson"
    assert "results.json" in capsys.readouterr().out


def test_bad_name_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["experiment", "nope"]) == 2
    err = capsys.readouterr().err
    assert "nope" in err
    assert "block-size" in err


@pytest.mark.parametrize("seeds", ["2", "1", "0", "x"])
def test_bad_seeds_is_exit_2(seeds: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["experiment", "lesson", "--seeds", seeds])
    assert exc.value.code == 2
    assert "--seeds" in capsys.readouterr().err


def test_commands_are_registered(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("experiment", "claims", "reproduce"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert "--quick" in capsys.readouterr().out


def test_help_names_every_experiment() -> None:
    """The CLI's help lists exactly the registry's experiments, in its order."""
    from pagedkv.experiments.commands import NAMES
    from pagedkv.experiments.registry import EXPERIMENTS

    assert list(NAMES) == list(EXPERIMENTS)

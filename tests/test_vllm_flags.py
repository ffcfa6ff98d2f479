"""docs/vllm-flags.md's tables, checked row by row against the parser: a flag marked same is
accepted and giving vLLM's default changes nothing; a different default is accepted and
pagedkv's default is the one written; an absent flag is refused in one line, and the refused
flags are exactly those of ``pagedkv.vllm_flags.UNMODELLED``."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from pagedkv.cli import _FLAT, _load_config, build_parser, main
from pagedkv.errors import ConfigError
from pagedkv.exits import EXIT_BAD_INPUT
from pagedkv.simulation import FLAT_ALIASES, SimulationConfig
from pagedkv.vllm_flags import UNMODELLED

DOC = Path(__file__).resolve().parents[1] / "docs" / "vllm-flags.md"
CONTEXTS = {"Engine flags": [], "Workload flags": ["--dataset-name", "random"]}
"""The flags each table's defaults are checked with (its section says so)."""
STATUSES = ("same", "different default", "absent")


@dataclass(frozen=True)
class Row:
    section: str
    flag: str
    vllm_default: str
    ours: str
    our_default: str
    status: str

    def __str__(self) -> str:
        return f"{self.section}: {self.flag}"


def _code(cell: str) -> str | None:
    """The text of a cell that is one `code span`, else None (prose is not checked)."""
    found = re.fullmatch(r"`([^`]*)`", cell.strip())
    return found.group(1) if found else None


def _rows() -> list[Row]:
    rows, section = [], None
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            section = next((s for s in CONTEXTS if line[3:].startswith(s)), None)
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if section is None or len(cells) != 6 or not cells[0].startswith("`-"):
            continue
        flag, vllm_default, ours, our_default, status, _ = cells
        rows.append(Row(section, str(_code(flag)), vllm_default, ours, our_default, status))
    return rows


ROWS = _rows()


def _config(argv: list[str]) -> SimulationConfig:
    config: SimulationConfig = _load_config(build_parser().parse_args(["simulate", *argv]))
    return config


def _key(flag: str) -> str:
    """The flat key a simulate flag sets (an alias: its key)."""
    simulate = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices["simulate"]
    dest = str(next(a.dest for a in simulate._actions if flag in a.option_strings))
    key = dest.removeprefix(_FLAT)
    return FLAT_ALIASES.get(key, key)


def test_the_tables_are_read() -> None:
    assert len(ROWS) > 40
    assert {r.section for r in ROWS} == set(CONTEXTS)
    assert all(r.status in STATUSES for r in ROWS), [str(r) for r in ROWS]


SAME = [pytest.param(r, id=str(r)) for r in ROWS if r.status == "same"]
DIFFERENT = [pytest.param(r, id=str(r)) for r in ROWS if r.status == "different default"]
ABSENT = [pytest.param(r, id=str(r)) for r in ROWS if r.status == "absent"]


@pytest.mark.parametrize("row", SAME)
def test_same_is_vllms_flag_with_vllms_default(row: Row) -> None:
    assert _code(row.ours) == row.flag
    assert row.vllm_default == row.our_default
    context = CONTEXTS[row.section]
    default = _code(row.vllm_default)
    if default is None:  # prose ("from the model"): the flag is ours, unchecked value
        assert _key(row.flag)
    elif default == "none":
        assert _config(context).to_flat()[_key(row.flag)] is None
    else:
        assert _config([*context, f"{row.flag}={default}"]) == _config(context)


@pytest.mark.parametrize("row", DIFFERENT)
def test_a_different_default_is_ours_as_written(row: Row) -> None:
    assert _code(row.ours) == row.flag
    ours = _code(row.our_default)
    if ours is not None:
        assert _config([f"{row.flag}={ours}"]) == _config([])
    theirs = _code(row.vllm_default)
    if theirs is not None:  # vLLM's default is not ours: another config, or not even ours
        try:
            other = _config([f"{row.flag}={theirs}"])
        except ConfigError:
            return
        assert other != _config([])


@pytest.mark.parametrize("row", ABSENT)
def test_absent_is_refused_in_one_line(row: Row, capsys: pytest.CaptureFixture[str]) -> None:
    assert row.ours == "none"
    for argv in ([row.flag], [row.flag, "1"]):
        assert main(["simulate", *argv]) == EXIT_BAD_INPUT
        err = capsys.readouterr().err.strip()
        assert "\n" not in err
        assert err.startswith(f"pagedkv: error: {row.flag}: ")
        assert "not modelled by pagedkv" in err


def test_the_refused_flags_are_the_absent_rows() -> None:
    assert {r.flag for r in ROWS if r.status == "absent"} == set(UNMODELLED)

"""Atomic writes: the file appears whole or not at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pagedkv.io import atomic_write_bytes, atomic_write_json, atomic_write_text


def test_write_then_read_back(tmp_path: Path) -> None:
    p = atomic_write_json(tmp_path / "sub" / "r.json", {"b": 1, "a": [1, 2]})
    assert json.loads(p.read_text()) == {"a": [1, 2], "b": 1}
    same = atomic_write_json(tmp_path / "again.json", {"a": [1, 2], "b": 1})
    assert p.read_text() == same.read_text()  # deterministic bytes


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "r.txt"
    atomic_write_text(target, "old")

    with pytest.raises(TypeError):
        atomic_write_bytes(target, 123)  # type: ignore[arg-type]  # fails mid-write
    with pytest.raises(TypeError):
        atomic_write_text(target, 123)  # type: ignore[arg-type]
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["r.txt"]


def test_written_file_has_the_mode_open_would_give(tmp_path: Path) -> None:
    """Not mkstemp's private 0600: a report or result is meant to be shared."""
    import os

    mask = os.umask(0o022)
    try:
        p = atomic_write_text(tmp_path / "r.txt", "x")
        plain = tmp_path / "plain.txt"
        plain.write_text("x")
    finally:
        os.umask(mask)
    assert p.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777 == 0o644

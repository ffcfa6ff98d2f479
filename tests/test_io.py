"""Output: a file appears whole or not at all; special files are written in place, never
replaced; sets of files appear together; destinations are checked before any work."""

from __future__ import annotations

import json
import os
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.errors import ConfigError
from pagedkv.io import (
    LONG_LIST,
    OutputError,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    check_output_dir,
    check_output_file,
    dumps_json,
    is_stdout,
    output_set,
)


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


# ----- special files: written in place, never replaced --------------------------------------


def test_a_fifo_is_written_in_place(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    atomic_write_json(fifo, {"a": 1})
    reader.join(timeout=30)
    assert got == [b'{\n  "a": 1\n}\n']
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]  # no temporary beside it


def test_dev_null_stays_a_character_device() -> None:
    atomic_write_text("/dev/null", "x")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_full_device_is_an_output_error_and_stays() -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with pytest.raises(OutputError, match="/dev/full"):
        atomic_write_text("/dev/full", "x")
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_a_missing_path_under_dev_is_never_created() -> None:
    path = Path("/dev/pagedkv-test-does-not-exist")
    with pytest.raises(OutputError):
        atomic_write_text(path, "x")
    assert not path.exists()


@pytest.mark.parametrize("name", ["-", "/dev/stdout", "/dev/fd/1"])
def test_stdout_names_write_to_standard_output(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    print("before")
    atomic_write_text(name, "data\n")
    assert capsys.readouterr().out == "before\ndata\n"
    assert is_stdout(name)
    assert not Path("-").exists()  # no file called "-" appeared


def test_a_symlink_stays_a_link_and_its_target_is_replaced(tmp_path: Path) -> None:
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    atomic_write_text(link, "new")
    assert link.is_symlink()
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "real.json"]


def test_a_dangling_symlink_gets_its_target_written(tmp_path: Path) -> None:
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "made.json")
    atomic_write_text(link, "x")
    assert link.is_symlink()
    assert (tmp_path / "made.json").read_text() == "x"


def test_a_link_to_a_device_writes_the_device(tmp_path: Path) -> None:
    link = tmp_path / "null"
    link.symlink_to("/dev/null")
    atomic_write_text(link, "x")
    assert link.is_symlink()
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="directory"):
        atomic_write_text(tmp_path, "x")
    assert tmp_path.is_dir()


def test_an_empty_path_names_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # (what an empty path would otherwise have meant)
    with pytest.raises(OutputError, match="empty path"):
        atomic_write_text("", "x")
    with pytest.raises(ConfigError, match=r"--json: got ''; .*empty path"):
        check_output_file("--json", "")
    with pytest.raises(ConfigError, match=r"--out: got ''; .*empty path"):
        check_output_dir("--out", "")
    assert not is_stdout("")
    assert list(tmp_path.iterdir()) == []


# ----- output_set: all or nothing -------------------------------------------------------------


def test_a_set_appears_at_its_end(tmp_path: Path) -> None:
    with output_set():
        atomic_write_text(tmp_path / "a", "1")
        atomic_write_text(tmp_path / "sub" / "b", "2")
        assert not (tmp_path / "a").exists()  # held back
    assert (tmp_path / "a").read_text() == "1"
    assert (tmp_path / "sub" / "b").read_text() == "2"


@given(
    writes=st.lists(st.sampled_from("abcd"), min_size=1, max_size=6),
    fail_at=st.integers(0, 6),
    interrupt=st.booleans(),
)
@settings(max_examples=60, deadline=None)
def test_a_set_that_raises_changes_nothing(
    writes: list[str], fail_at: int, interrupt: bool
) -> None:
    """Whatever was written before the failure (Ctrl-C too), the old files stay as they were
    and no temporary is left; without a failure every file holds its last write."""
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        for name in "ab":
            (root / name).write_text("old")
        before = {p.name: p.read_text() for p in root.iterdir()}
        error: type[BaseException] = KeyboardInterrupt if interrupt else RuntimeError
        try:
            with output_set():
                for i, name in enumerate(writes):
                    if i == fail_at:
                        raise error
                    atomic_write_text(root / name, f"new {i}")
        except (KeyboardInterrupt, RuntimeError):
            assert {p.name: p.read_text() for p in root.iterdir()} == before
            return
        expected = dict(before)
        for i, name in enumerate(writes):
            expected[name] = f"new {i}"
        assert {p.name: p.read_text() for p in root.iterdir()} == expected


def test_a_set_whose_direct_write_fails_renames_nothing(tmp_path: Path) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")

    def write_both() -> None:
        with output_set():
            atomic_write_text(tmp_path / "a.json", "1")
            atomic_write_text("/dev/full", "2")

    with pytest.raises(OutputError, match="/dev/full"):
        write_both()
    assert list(tmp_path.iterdir()) == []


# ----- checks before any work ---------------------------------------------------------------


def test_writable_destinations_pass(tmp_path: Path) -> None:
    check_output_file("--json", "-")
    check_output_file("--json", "/dev/null")
    check_output_file("--json", tmp_path / "new" / "deeper" / "r.json")
    (tmp_path / "old.json").write_text("x")
    check_output_file("--json", tmp_path / "old.json")
    check_output_dir("--out", tmp_path / "new" / "dir", ["a.json", "b.csv"])
    check_output_dir("--out", tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]  # nothing made


def test_bad_destinations_are_config_errors_naming_flag_and_path(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    (tmp_path / "dir" / "a.json").mkdir(parents=True)
    cases: list[tuple[Callable[[], None], str]] = [
        (lambda: check_output_file("--json", tmp_path), "is a directory"),
        (lambda: check_output_file("--json", a_file / "r.json"), "is not a directory"),
        (lambda: check_output_dir("--out", a_file), "is not a directory"),
        (lambda: check_output_dir("--out", a_file / "sub"), "is not a directory"),
        (lambda: check_output_dir("--out", tmp_path / "dir", ["a.json"]), "is a directory"),
        (lambda: check_output_file("--json", "/dev/pagedkv-nope"), "does not exist"),
    ]
    for call, why in cases:
        with pytest.raises(ConfigError, match=why) as info:
            call()
        assert info.value.field in ("--json", "--out")
        assert str(tmp_path) in str(info.value) or "/dev/" in str(info.value)
    assert a_file.read_text() == "x"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only directory")
def test_a_read_only_directory_is_refused(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(ConfigError, match="not writable"):
            check_output_file("--json", ro / "r.json")
        with pytest.raises(ConfigError, match="not writable"):
            check_output_dir("--out", ro / "sub")
    finally:
        ro.chmod(0o755)


KINDS = ("missing", "dir", "file", "link-to-dir", "link-to-file", "dangling-link")


def _make(path: Path, kind: str, root: Path) -> None:
    """``path`` as ``kind``, when its parent is a directory to make it in."""
    if kind == "missing" or not path.parent.is_dir():
        return
    if kind == "dir":
        path.mkdir()
    elif kind == "file":
        path.write_text("old")
    else:
        target = {"link-to-dir": root / "elsewhere", "link-to-file": root / "other.txt"}
        path.symlink_to(target.get(kind, root / "nowhere" / "deeper"))


@given(st.lists(st.sampled_from(KINDS), min_size=1, max_size=4))
@settings(max_examples=150, deadline=None)
def test_the_check_agrees_with_the_write(kinds: list[str]) -> None:
    """Differential: the check before the work passes exactly when the write would succeed,
    and then the path (or the file behind its links) holds the data, links kept as links."""
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "elsewhere").mkdir()
        (root / "other.txt").write_text("old")
        path = root / "out"
        for i, kind in enumerate(kinds):
            path = path / f"c{i}" if i else path
            _make(path, kind, root)
        was_link = path.is_symlink()
        try:
            check_output_file("--json", path)
            checked = True
        except ConfigError:
            checked = False
        try:
            atomic_write_text(path, "data")
            written = True
        except OutputError:
            written = False
        assert checked == written, kinds
        if written:
            assert path.read_text() == "data"
            assert path.is_symlink() == was_link
        assert not list(root.rglob(".*.tmp"))


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=40) | st.dictionaries(st.text(max_size=5), inner, max_size=5)
    ),
    max_leaves=200,
)


@given(_JSON)
def test_dumps_json_round_trips_and_keeps_the_indented_format_of_short_lists(data: object) -> None:
    text = dumps_json(data)
    assert json.loads(text) == data
    assert text == dumps_json(json.loads(text))  # deterministic, a fixed point
    if max((len(v) for v in _lists(data)), default=0) <= LONG_LIST:
        assert text == json.dumps(data, sort_keys=True, indent=2) + "\n"  # json's own text


def _lists(value: object) -> Iterator[list[object]]:
    if isinstance(value, list):
        yield value
        for v in value:
            yield from _lists(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _lists(v)


def test_a_long_list_puts_one_element_on_each_line() -> None:
    records = [{"b": i, "a": [i]} for i in range(LONG_LIST + 1)]
    lines = dumps_json({"requests": records}).splitlines()
    assert lines[2] == '    {"a": [0], "b": 0},'
    assert len(lines) == len(records) + 4


def _reference_dumps(value: object, level: int = 0) -> str:
    """``dumps_json``'s format written out directly, as one recursive text (the oracle of the
    streamed writer): sorted keys, two-space indents, a long list one element per line."""
    inner = "  " * (level + 1)
    if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
        body = ",\n".join(
            f"{inner}{json.dumps(k)}: {_reference_dumps(value[k], level + 1)}"
            for k in sorted(value)
        )
        return "{\n" + body + "\n" + "  " * level + "}"
    if isinstance(value, (list, tuple)) and len(value) > LONG_LIST:
        items = [json.dumps(v, sort_keys=True) for v in value]
        return "[\n" + inner + f",\n{inner}".join(items) + "\n" + "  " * level + "]"
    text = json.dumps(value, sort_keys=True, indent=2)
    return text.replace("\n", "\n" + "  " * level)


# Records whose strings and nested values hold the text of separators ("}, {", quotes).
_TRICKY = st.text(alphabet='}, {"\\a', max_size=8)
_RECORD = st.dictionaries(
    st.text(alphabet="abc}, {", max_size=3),
    st.none() | st.integers() | st.floats() | _TRICKY | st.lists(st.dictionaries(_TRICKY, _TRICKY)),
    max_size=4,
)


@settings(max_examples=80, deadline=None)
@given(
    _JSON,
    st.sampled_from([0, 1, LONG_LIST + 1, 1023, 1024, 1025, 2049]),
    st.lists(_RECORD | _JSON, max_size=LONG_LIST + 6),
)
def test_the_streamed_file_has_the_bytes_of_dumps_json(
    data: object, long: int, tricky: list[object]
) -> None:
    """atomic_write_json streams iter_json's pieces; the file holds dumps_json's bytes, which
    are the reference format's, for lists of every length around the writer's batches, and
    for long lists of records whose strings look like separators."""
    records = [{"i": i, "t": i / 7, "s": None} for i in range(long)]
    data = {"d": data, "requests": records, "tricky": tricky + records[:LONG_LIST]}
    expected = _reference_dumps(data) + "\n"
    assert dumps_json(data) == expected
    with tempfile.TemporaryDirectory() as tmp:
        path = atomic_write_json(Path(tmp) / "r.json", data)
        assert path.read_bytes() == expected.encode("utf-8")


def test_a_streamed_write_that_fails_midway_leaves_nothing(tmp_path: Path) -> None:
    """An element that cannot be encoded, far into a long list (after pieces were written):
    the old file stays, and no temporary or new directory is left."""
    old = atomic_write_text(tmp_path / "r.json", "old")
    bad = {"requests": [*range(5000), object()]}
    with pytest.raises(TypeError):
        atomic_write_json(old, bad)
    with pytest.raises(TypeError):
        atomic_write_json(tmp_path / "new" / "deeper" / "r.json", bad)
    assert old.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]

"""The kernel's build cache as a trust boundary (issue 17, defect 10): a private directory, a
digest checked before anything is loaded, a verified build usable without a compiler, and
``$CXX`` honoured with its arguments or refused."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from pagedkv.tensors import _build

needs_compiler = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


@pytest.fixture
def build_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "build"
    monkeypatch.setenv("PAGEDKV_BUILD_DIR", str(d))
    monkeypatch.delenv("CXX", raising=False)
    return d


def no_compiler(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "empty-path"
    empty.mkdir(exist_ok=True)
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CXX", raising=False)


@needs_compiler
def test_a_build_is_private_and_recorded(build_dir: Path) -> None:
    lib = _build.build("paged_decode")
    assert stat.S_IMODE(os.lstat(build_dir).st_mode) == 0o700
    assert _build.record_path(lib).is_file()
    assert _build.build("paged_decode") == lib  # cached: the same file, verified


@needs_compiler
def test_a_verified_build_needs_no_compiler(
    build_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = _build.build("paged_decode")
    no_compiler(monkeypatch, tmp_path)
    assert _build.build("paged_decode") == lib
    import ctypes

    assert ctypes.CDLL(str(lib)).pagedkv_abi_version() > 0


@needs_compiler
def test_an_edited_source_gets_its_own_build(
    build_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the file name carries the source's hash: a stale library of the old source is never loaded
    lib = _build.build("paged_decode")
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    text = (_build.CSRC / "paged_decode.cpp").read_text()
    (csrc / "paged_decode.cpp").write_text(text + "\n// an edit\n")
    monkeypatch.setattr(_build, "CSRC", csrc)
    edited = _build.build("paged_decode")
    assert edited != lib
    assert sorted(build_dir.glob("paged_decode-*.so")) == sorted([lib, edited])


@needs_compiler
@pytest.mark.parametrize("tamper", ["library", "record", "no record"])
def test_a_tampered_build_is_rebuilt_or_refused_never_loaded(
    build_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tamper: str
) -> None:
    lib = _build.build("paged_decode")
    good = lib.read_bytes()
    record = _build.record_path(lib)
    if tamper == "library":
        lib.write_bytes(good + b"planted")
    elif tamper == "record":
        record.write_text('{"sha256": "0", "source_key": "0"}')
    else:
        record.unlink()
    assert _build.build("paged_decode") == lib  # a compiler on the PATH: built again
    assert b"planted" not in lib.read_bytes()
    assert _build.verified(lib, _build_source_key(lib))
    lib.write_bytes(good + b"planted")
    no_compiler(monkeypatch, tmp_path)
    with pytest.raises(_build.BuildError, match=r"no verified build of paged_decode\.cpp"):
        _build.build("paged_decode")


def _build_source_key(lib: Path) -> str:
    import json

    key = json.loads(_build.record_path(lib).read_text())["source_key"]
    assert isinstance(key, str)
    return key


def test_a_directory_others_may_write_is_refused(build_dir: Path) -> None:
    build_dir.mkdir()
    build_dir.chmod(0o777)
    with pytest.raises(_build.BuildError, match=r"has mode 0777: others may write in it"):
        _build.build("paged_decode")


def test_a_readable_directory_of_ours_is_tightened(build_dir: Path) -> None:
    build_dir.mkdir()
    build_dir.chmod(0o755)
    assert _build.private_dir(build_dir) == build_dir
    assert stat.S_IMODE(os.lstat(build_dir).st_mode) == 0o700


def test_a_linked_directory_is_refused(build_dir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    build_dir.symlink_to(elsewhere)
    with pytest.raises(_build.BuildError, match="is not a directory"):
        _build.build("paged_decode")


@pytest.mark.skipif(os.getuid() != 0, reason="giving a directory away needs root")
def test_a_directory_of_another_user_is_refused(build_dir: Path) -> None:
    build_dir.mkdir(mode=0o700)
    os.chown(build_dir, 4242, -1)
    with pytest.raises(_build.BuildError, match="owned by uid 4242, not by this user"):
        _build.build("paged_decode")


@needs_compiler
def test_cxx_with_arguments_is_honoured(build_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "env LC_ALL=C g++")  # a launcher with arguments, as ccache g++
    assert _build.compiler() == ["env", "LC_ALL=C", "g++"]
    lib = _build.build("paged_decode")
    monkeypatch.delenv("CXX")
    assert _build.build("paged_decode") != lib  # another compiler line, another build


@pytest.mark.parametrize(
    ("cxx", "message"),
    [
        ("no-such-compiler-x --flag", "'no-such-compiler-x' is not on the PATH"),
        ("g++ 'unclosed", "cannot be split into words"),
    ],
)
def test_a_cxx_that_cannot_run_is_refused_not_replaced(
    monkeypatch: pytest.MonkeyPatch, cxx: str, message: str
) -> None:
    monkeypatch.setenv("CXX", cxx)
    with pytest.raises(_build.BuildError, match=message):
        _build.compiler()

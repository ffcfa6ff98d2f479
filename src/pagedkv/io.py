"""Output, written so that a run that fails writes no half result and destroys nothing.

* A regular file (or a path that does not exist yet) is written atomically: a temporary file
  beside it, then a rename over it.
* Anything else that exists (a FIFO, a character device such as ``/dev/null``), and every
  path under ``/dev`` or ``/proc``, is opened for writing and written in place: never created,
  replaced or unlinked. A directory is refused.
* ``-``, ``/dev/stdout`` and ``/dev/fd/1`` are standard output, written through this process's
  own descriptor (``/dev/stderr``, ``/dev/fd/N`` likewise).
* A symbolic link is followed: the link stays, and its target is written as above (atomically
  if it is a regular file). The rename never replaces the link itself; a link into ``/dev``
  (to ``/dev/stdout``, say) writes there in place.
* ``output_set()``: the atomic writes inside it are held back and renamed together at its end,
  or, if anything inside raises (Ctrl-C included), none is, and their temporaries are removed.
* ``check_output_file`` / ``check_output_dir``: before any work, can this be written? A
  ``ConfigError`` naming the flag and the path if not. ``path_arg``: every output flag's
  argparse type (an empty path is refused as the flags are read).

A write that fails (a full disk, a vanished directory) raises ``OutputError`` naming the path.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import errno
import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagedkv.errors import ConfigError, PagedKVError

STDOUT = "-"
"""The output path that means standard output."""


class OutputError(PagedKVError):
    """An output could not be written (after the work: the result is lost, the target kept)."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"cannot write {path}: {reason}")


@dataclass
class _Pending:
    """The writes of one ``output_set``: temporaries to rename, direct writes to make."""

    renames: list[tuple[str, Path, str]] = field(default_factory=list)  # (tmp, target, shown)
    direct: list[tuple[str, bytes, str]] = field(default_factory=list)  # (target, data, shown)

    def discard(self) -> None:
        for tmp, _, _ in self.renames:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        self.renames.clear()
        self.direct.clear()

    def commit(self) -> None:
        """Direct writes first (they cannot be undone, but a failed one still renames
        nothing), then the renames."""
        try:
            for where, data, shown in self.direct:
                _write_direct(where, data, shown)
            while self.renames:
                tmp, target, shown = self.renames[0]
                _rename(tmp, target, shown)
                self.renames.pop(0)
        finally:
            self.discard()


# The enclosing output_set, if any. A context variable rather than a parameter: the writes of
# one set happen deep in code that knows nothing of sets (each experiment's plot functions).
_PENDING: contextvars.ContextVar[_Pending | None] = contextvars.ContextVar(
    "pagedkv_output_set", default=None
)


@contextlib.contextmanager
def output_set() -> Iterator[None]:
    """All or nothing: the atomic writes inside appear together at the end, or none does.

    Nested sets join the outermost one. Reads inside the block do not see the held-back files.
    """
    if _PENDING.get() is not None:
        yield
        return
    pending = _Pending()
    token = _PENDING.set(pending)
    try:
        yield
    except BaseException:
        pending.discard()
        raise
    finally:
        _PENDING.reset(token)
    pending.commit()


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` as the module docstring says; returns ``Path(path)``."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data must be bytes, not {type(data).__name__}")
    return atomic_write_chunks(path, (data,))


def atomic_write_chunks(path: str | Path, chunks: Iterable[bytes]) -> Path:
    """``atomic_write_bytes`` of the concatenation of ``chunks``, drawn one at a time: into the
    temporary file of a regular target (so a large output is never held whole), joined first
    for a target written in place. If drawing a chunk raises, nothing is written: the
    temporary and any directory made for it are removed, and the error propagates."""
    shown = str(path)
    where, direct = _destination(path)
    pending = _PENDING.get()
    if direct:
        data = b"".join(chunks)
        if pending is not None:
            pending.direct.append((where, data, shown))
        else:
            _write_direct(where, data, shown)
        return Path(path)
    tmp = _write_temporary(Path(where), chunks, shown)
    if pending is not None:
        pending.renames.append((tmp, Path(where), shown))
    else:
        _rename(tmp, Path(where), shown)
    return Path(path)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """``atomic_write_bytes`` of ``text`` in UTF-8."""
    if not isinstance(text, str):
        raise TypeError(f"text must be str, not {type(text).__name__}")
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, data: Any) -> Path:
    """Deterministic JSON (``dumps_json``'s bytes) written atomically, streamed piece by piece
    (``iter_json``): a run's records are encoded as they are written, never as one text."""
    return atomic_write_chunks(path, (piece.encode("utf-8") for piece in iter_json(data)))


LONG_LIST = 16
"""Lists longer than this are written one element per line, each element on its line."""
_BATCH = 1024  # elements of a long list encoded per piece of iter_json


def dumps_json(data: Any) -> str:
    """Deterministic JSON text: sorted keys and two-space indents, as ``json.dumps(data,
    sort_keys=True, indent=2)`` writes it (the same bytes for data without long lists), except
    that a list of more than ``LONG_LIST`` elements (a run's per-request records, its steps)
    puts each element on one line of its own. ``json`` with ``indent`` runs its pure-Python
    encoder; without it the C encoder, about ten times faster, does the bulk of a large
    result, and the file stays readable line by line. The text is ``iter_json``'s pieces."""
    return "".join(iter_json(data))


def iter_json(data: Any) -> Iterator[str]:
    """``dumps_json(data)`` in pieces, a long list ``_BATCH`` elements at a time: written as
    they come, a large result is never held as one text (nor its pieces all at once)."""
    yield from _pieces(data, 0, json.JSONEncoder(sort_keys=True).encode)
    yield "\n"


def _pieces(value: Any, level: int, compact: Callable[[Any], str]) -> Iterator[str]:
    inner = "  " * (level + 1)
    if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
        sep = "{\n"
        for key in sorted(value):
            yield f"{sep}{inner}{json.dumps(key)}: "
            yield from _pieces(value[key], level + 1, compact)
            sep = ",\n"
        yield "\n" + "  " * level + "}"
        return
    if isinstance(value, (list, tuple)) and len(value) > LONG_LIST:
        # one encoder for every element: json.dumps would build a new one per call
        sep = f",\n{inner}"
        start = "[\n" + inner
        for i in range(0, len(value), _BATCH):
            yield start + sep.join(map(compact, value[i : i + _BATCH]))
            start = sep
        yield "\n" + "  " * level + "]"
        return
    text = json.dumps(value, sort_keys=True, indent=2)
    yield text.replace("\n", "\n" + "  " * level) if level else text


def is_stdout(path: str | Path | None) -> bool:
    """Does ``path`` name standard output (``-``, ``/dev/stdout``, ``/dev/fd/1``)? A command
    then prints its tables on stderr, so that stdout holds the output alone."""
    if path is None:
        return False
    try:
        return _destination(path)[0] == f"{_FD}1"
    except OutputError:
        return False


def path_arg(value: str) -> str:
    """The argparse ``type`` of every output path flag: an empty path names nothing (and
    ``Path("")`` would quietly be the working directory), so it is refused as flags are read."""
    if not value:
        raise argparse.ArgumentTypeError("an empty path names no file or directory")
    return value


def check_output_file(flag: str, path: str | Path) -> None:
    """Before any work: could ``path`` (a file output) be written? ``ConfigError`` if not."""
    try:
        where, direct = _destination(path)
    except OutputError as e:
        raise ConfigError(flag, str(path), e.reason) from None
    if where.startswith(_FD):
        return
    if direct or os.path.exists(where):
        if not os.path.exists(where):
            raise ConfigError(flag, str(path), "does not exist (a special path is never created)")
        if not os.access(where, os.W_OK):
            raise ConfigError(flag, str(path), "is not writable")
        if direct:
            return  # a FIFO or a device: written in place, its directory does not matter
    _check_creatable(flag, str(path), Path(where).parent)


def check_output_dir(flag: str, path: str | Path, files: Iterable[str] = ()) -> None:
    """Before any work: could ``path`` be made a directory and ``files`` be written in it?"""
    if not str(path):  # (Path("") is the working directory)
        raise ConfigError(flag, str(path), "an empty path names no directory")
    target = Path(os.path.realpath(path))
    if target.exists() and not target.is_dir():
        raise ConfigError(flag, str(path), "is not a directory")
    _check_creatable(flag, str(path), target)
    for name in files:
        check_output_file(flag, target / name)


def _check_creatable(flag: str, shown: str, directory: Path) -> None:
    """``directory`` exists and is writable, or its nearest existing ancestor is a writable
    directory (so that ``mkdir -p`` would make it)."""
    d = directory
    while not d.exists() and d != d.parent:
        if d.is_symlink():  # a dangling link in the way: mkdir would fail on it
            raise ConfigError(flag, shown, f"{d} is a broken symbolic link")
        d = d.parent
    if not d.is_dir():
        raise ConfigError(flag, shown, f"{d} is not a directory")
    if not os.access(d, os.W_OK | os.X_OK):
        raise ConfigError(flag, shown, f"the directory {d} is not writable")


_FD = "fd:"  # _destination's name for an open file descriptor
_FD_NAMES = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
_MAX_LINKS = 40  # as the kernel's own limit on a chain of symbolic links


def _destination(path: str | Path) -> tuple[str, bool]:
    """(where to write, written directly?). Standard output and the /dev/fd names become
    ``fd:N`` (written to the descriptor this process already has: reopening /dev/stdout
    would start at offset 0 of a redirected file); any other path under /dev or /proc, and
    anything that exists and is not a regular file, is written in place; a regular file or
    a new path is the real path behind any symbolic links, replaced atomically."""
    if str(path) == STDOUT:
        return f"{_FD}1", True
    if not str(path):  # (abspath would make it the working directory)
        raise OutputError(path, "an empty path names no file")
    hop = os.path.abspath(path)
    for _ in range(_MAX_LINKS):  # each link of the chain: one into /dev or /proc is special
        fd = _FD_NAMES.get(hop)
        for prefix in ("/dev/fd/", "/proc/self/fd/"):
            if fd is None and hop.startswith(prefix) and hop[len(prefix) :].isdigit():
                fd = int(hop[len(prefix) :])
        if fd is not None:
            return f"{_FD}{fd}", True
        if hop.startswith(("/dev/", "/proc/")):
            return hop, True
        if not os.path.islink(hop):
            break
        hop = os.path.normpath(os.path.join(os.path.dirname(hop), os.readlink(hop)))
    real = os.path.realpath(path)
    try:
        mode: int | None = os.stat(real).st_mode
    except (FileNotFoundError, NotADirectoryError):  # a path under a file: the check says so
        mode = None
    except OSError as e:
        raise OutputError(path, e.strerror or type(e).__name__) from None
    if mode is not None and stat.S_ISDIR(mode):
        raise OutputError(path, "it is a directory")
    return real, mode is not None and not stat.S_ISREG(mode)


def _write_temporary(target: Path, chunks: Iterable[bytes], shown: str) -> str:
    try:
        made = _make_dirs(target.parent)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as e:
        raise OutputError(shown, e.strerror or type(e).__name__) from None
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
        # mkstemp makes the file private (0600); give it the mode a plain open() would
        os.chmod(tmp, 0o666 & ~_umask())
    except BaseException as e:
        os.unlink(tmp)
        for directory in made:  # a failed call changes nothing: not even a new directory
            with contextlib.suppress(OSError):
                directory.rmdir()
        if isinstance(e, OSError):
            raise OutputError(shown, e.strerror or type(e).__name__) from None
        raise
    return tmp


def _make_dirs(directory: Path) -> list[Path]:
    """``mkdir -p directory``; the directories it made, deepest first."""
    missing = []
    d = directory
    while not d.exists() and d != d.parent:
        missing.append(d)
        d = d.parent
    directory.mkdir(parents=True, exist_ok=True)
    return missing


def _rename(tmp: str, target: Path, shown: str) -> None:
    try:
        os.replace(tmp, target)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise OutputError(shown, e.strerror or type(e).__name__) from None
        raise


def _write_direct(target: str, data: bytes, shown: str) -> None:
    """Write into what exists: never create, replace or unlink (no O_CREAT, no O_TRUNC)."""
    try:
        if target.startswith(_FD):
            _write_fd(int(target[len(_FD) :]), data)
            return
        fd = os.open(target, os.O_WRONLY)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
    except BrokenPipeError:
        raise
    except OSError as e:
        raise OutputError(shown, e.strerror or type(e).__name__) from None


def _write_fd(fd: int, data: bytes) -> None:
    """Standard output and error through their Python streams (what was printed before comes
    first, and a captured stream is honoured); any other descriptor as it is."""
    stream = {1: sys.stdout, 2: sys.stderr}.get(fd)
    if stream is None:
        _write_all(fd, data)
        return
    stream.flush()
    binary = getattr(stream, "buffer", None)
    if binary is None:  # a text-only stand-in (contextlib.redirect_stdout to a StringIO)
        stream.write(data.decode("utf-8", errors="replace"))
        return
    view = memoryview(data)
    while view:  # a buffered write into a pipe closed midway returns a short count, no error
        written = binary.write(view)
        if not written:
            raise OSError(errno.EIO, "the stream accepted nothing")
        view = view[written:]
    binary.flush()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it
    os.umask(mask)
    return mask

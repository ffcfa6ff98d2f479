"""Compile a C++ source of ``csrc/`` into a shared library, once per machine, cached.

The fast attention kernel is plain C++ with OpenMP and a C ABI (loaded with ``ctypes``): it
needs no Python or torch headers, so it compiles in a few seconds with the system compiler at
first use, inside whatever process first asks for it (``make test`` included).

Where: ``$PAGEDKV_BUILD_DIR`` if set, else ``$XDG_CACHE_HOME/pagedkv`` (``~/.cache/pagedkv``).
The file name carries a hash of the source, the compiler, the flags and this CPU's feature
flags (the code is built with ``-march=native``), so an edited source, another compiler or
another CPU sharing the home directory gets its own build and a stale one is never loaded.
Concurrent first uses (pytest-xdist workers) may both compile; each writes a temporary file and
renames it into place, so a reader never sees half a library.

Trust: loading a library runs its constructors, so nothing is loaded that this user did not
build. The directory must be a real directory (not a link), owned by the current user and
private (mode 0700: created so; one of ours that nobody else could write is tightened; any
other is refused with one line). Beside each library a record (``<lib>.json``, written
atomically after the library) holds its SHA-256 and the key of its source, flags and CPU; a
library is returned only when its digest matches: a mismatch or a missing record rebuilds it,
or, with no compiler, refuses it. The record also lets a verified build be found without a
compiler on the PATH (its version is part of the file name).

``$CXX`` is split as a shell would (``CXX="ccache g++"`` runs ``ccache g++ ...``); a ``$CXX``
whose program is not on the PATH is refused, never silently replaced by another compiler.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from pagedkv.io import atomic_write_json

CSRC = Path(__file__).parent / "csrc"
# -O3 and -march=native vectorise the dot products (AVX2/AVX-512 where present);
# reassociation (not -ffast-math: the softmax relies on -inf) lets float sums vectorise.
FLAGS = (
    "-O3",
    "-march=native",
    "-fopenmp",
    "-ffp-contract=fast",  # fused multiply-adds (an ISO -std would turn them off)
    "-fno-math-errno",
    "-fno-trapping-math",
    "-fassociative-math",
    "-fno-signed-zeros",
    "-std=c++17",
    "-shared",
    "-fPIC",
)
COMPILE_TIMEOUT_S = 300


class BuildError(RuntimeError):
    """No compiler, or the compiler failed: the caller falls back to plain torch."""


def build_dir() -> Path:
    if os.environ.get("PAGEDKV_BUILD_DIR"):
        return Path(os.environ["PAGEDKV_BUILD_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "pagedkv"


def private_dir(path: Path) -> Path:
    """``path``, created mode 0700 if absent; refused (``BuildError``, one line) unless it is a
    directory, not a link, owned by this user; tightened to 0700 if only its owner can write
    in it (nobody else could have put a file there)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(path)
    except OSError as exc:
        raise BuildError(f"build directory {path}: {exc.strerror or exc}") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise BuildError(f"build directory {path} is not a directory (a link?): refused")
    if info.st_uid != os.getuid():
        raise BuildError(
            f"build directory {path} is owned by uid {info.st_uid}, not by this user "
            f"({os.getuid()}): refused (set PAGEDKV_BUILD_DIR to a directory of your own)"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o022:
        raise BuildError(
            f"build directory {path} has mode {mode:04o}: others may write in it, so its "
            "libraries are not trusted (chmod 700 it after emptying it, or set "
            "PAGEDKV_BUILD_DIR)"
        )
    if mode & 0o077:
        os.chmod(path, 0o700)
    return path


def compiler() -> list[str]:
    """``$CXX`` split into its words (``ccache g++``), else the first of g++, c++, clang++ on
    the PATH. A ``$CXX`` that cannot be run is refused, not replaced."""
    cxx = os.environ.get("CXX", "").strip()
    if cxx:
        try:
            argv = shlex.split(cxx)
        except ValueError as exc:
            raise BuildError(f"CXX={cxx!r} cannot be split into words: {exc}") from None
        if not shutil.which(argv[0]):
            raise BuildError(f"CXX={cxx!r}: {argv[0]!r} is not on the PATH")
        return argv
    for name in ("g++", "c++", "clang++"):
        if shutil.which(name):
            return [name]
    raise BuildError("no C++ compiler found (set CXX, or install g++)")


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return ""


def _version(cxx: list[str]) -> str:
    try:
        return subprocess.run(
            [*cxx, "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"{shlex.join(cxx)} --version failed: {exc}") from exc


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def record_path(library: Path) -> Path:
    """The record beside ``library``: its digest and the key of what it was built from."""
    return library.with_name(library.name + ".json")


def verified(library: Path, source_key: str) -> bool:
    """Is ``library`` a regular file (not a link) whose SHA-256 and source key are what its
    record says?"""
    try:
        if not stat.S_ISREG(os.lstat(library).st_mode):
            return False
        record = json.loads(record_path(library).read_text(encoding="utf-8"))
        return (
            isinstance(record, dict)
            and record.get("source_key") == source_key
            and record.get("sha256") == _sha256_file(library)
        )
    except (OSError, ValueError):
        return False


def _cached(directory: Path, name: str, source_key: str) -> Path | None:
    """A verified build of this source, flags and CPU by any compiler (when none is on the
    PATH to tell which): the first in name order, so every process picks the same one."""
    for library in sorted(directory.glob(f"{name}-*.so")):
        if verified(library, source_key):
            return library
    return None


def build(name: str) -> Path:
    """The shared library compiled from ``csrc/<name>.cpp``: built if absent, else the cached
    one. Raises ``BuildError`` when it cannot be built."""
    source = CSRC / f"{name}.cpp"
    text = source.read_text()
    directory = private_dir(build_dir())
    source_key = hashlib.sha256("\0".join([text, *FLAGS, _cpu_flags()]).encode()).hexdigest()
    try:
        cxx = compiler()
    except BuildError as exc:
        cached = _cached(directory, name, source_key)
        if cached is not None:
            return cached
        raise BuildError(f"{exc}; no verified build of {source.name} in {directory}") from None
    key = hashlib.sha256(
        "\0".join([text, *cxx, _version(cxx), *FLAGS, _cpu_flags()]).encode()
    ).hexdigest()[:16]
    target = directory / f"{name}-{key}.so"
    if verified(target, source_key):
        return target
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{name}.", suffix=".so")
    os.close(fd)
    try:
        result = subprocess.run(
            [*cxx, *FLAGS, str(source), "-o", tmp],
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT_S,
            check=False,
        )
        if result.returncode != 0:
            raise BuildError(f"{shlex.join(cxx)} failed on {source.name}:\n{result.stderr.strip()}")
        digest = _sha256_file(Path(tmp))
        os.replace(tmp, target)
        # after the library: a reader between the two sees no match and builds its own
        atomic_write_json(record_path(target), {"sha256": digest, "source_key": source_key})
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"compiling {source.name} with {shlex.join(cxx)} failed: {exc}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    if not verified(target, source_key):  # replaced since (by a concurrent build): never load
        raise BuildError(f"{target} changed while it was being built: refused")
    return target

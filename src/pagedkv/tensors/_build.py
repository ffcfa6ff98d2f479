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
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

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


def compiler() -> str:
    """``$CXX``, else the first of g++, c++, clang++ on the PATH."""
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return name
    raise BuildError("no C++ compiler found (set CXX, or install g++)")


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return ""


def _version(cxx: str) -> str:
    try:
        return subprocess.run(
            [cxx, "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"{cxx} --version failed: {exc}") from exc


def build(name: str) -> Path:
    """The shared library compiled from ``csrc/<name>.cpp``: built if absent, else the cached
    one. Raises ``BuildError`` when it cannot be built."""
    source = CSRC / f"{name}.cpp"
    cxx = compiler()
    key = hashlib.sha256(
        "\0".join([source.read_text(), cxx, _version(cxx), *FLAGS, _cpu_flags()]).encode()
    ).hexdigest()[:16]
    target = build_dir() / f"{name}-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{name}.", suffix=".so")
    os.close(fd)
    try:
        result = subprocess.run(
            [cxx, *FLAGS, str(source), "-o", tmp],
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT_S,
            check=False,
        )
        if result.returncode != 0:
            raise BuildError(f"{cxx} failed on {source.name}:\n{result.stderr.strip()}")
        os.replace(tmp, target)
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"compiling {source.name} with {cxx} failed: {exc}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target

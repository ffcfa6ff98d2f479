"""The memory layer is pure Python: importing it (or the CLI) must not import torch."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "module",
    [
        "pagedkv",
        "pagedkv.memory",
        "pagedkv.cli",
        "pagedkv.simulation",
        "pagedkv.engine.profiled_cost",
        "pagedkv.tensors.profile_config",
    ],
)
def test_no_torch_on_import(module: str) -> None:
    code = (
        "import importlib, sys, pkgutil\n"
        f"import {module}\n"
        "import pagedkv.memory as mem\n"
        "for m in pkgutil.iter_modules(mem.__path__):\n"
        "    importlib.import_module('pagedkv.memory.' + m.name)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)

"""Fixtures of the tensor tests: tiny real checkpoint directories (``checkpoints.py``), built
once per session (per xdist worker) in a temporary directory, only for the families asked for."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def checkpoint_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``checkpoint_dir(family, sharded=False)``: the path of that family's checkpoint
    (``sharded``: weights split into many ``model-*.safetensors`` with their index)."""
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from tests.tensors.checkpoints import save_checkpoint

    root = tmp_path_factory.mktemp("checkpoints")
    made: dict[tuple[str, bool], Path] = {}

    def get(family: str, sharded: bool = False) -> Path:
        key = (family, sharded)
        if key not in made:
            name = family + ("-sharded" if sharded else "")
            made[key] = save_checkpoint(
                family, root / name, max_shard_size="40KB" if sharded else None
            )
        return made[key]

    return get

"""A local Hugging Face checkpoint directory: config, weights, generation defaults, tokenizer.

    DIR/config.json                   the architecture (``pagedkv.tensors.hf_config``)
    DIR/model.safetensors             the weights, or shards ``model-*.safetensors`` listed by
    DIR/model.safetensors.index.json  its ``weight_map``
    DIR/generation_config.json        optional: eos_token_id (one or a list), bos_token_id,
                                      max_new_tokens (else config.json's eos/bos)
    DIR/tokenizer.json                optional: the ``tokenizers`` library's file (text in/out)

Nothing is downloaded: ``path`` is a directory on disk. The state dict is read strictly (a
missing or unexpected tensor is a one-line error naming it, ``pagedkv.tensors.weights``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pagedkv.errors import ConfigError
from pagedkv.tensors.model import Decoder
from pagedkv.tensors.model_config import DecoderConfig
from pagedkv.tensors.text import TextTokenizer
from pagedkv.validation import read_text

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class GenerationDefaults:
    """What a checkpoint says about generating: its stop tokens and default length."""

    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    max_new_tokens: int | None = None


@dataclass
class Checkpoint:
    """A loaded checkpoint: the decoder, its generation defaults, its tokenizer (if any)."""

    path: Path
    decoder: Decoder
    generation: GenerationDefaults
    tokenizer: TextTokenizer | None


def _read_json(path: Path, field: str) -> dict[str, Any]:
    text = read_text(field, path)  # missing, a directory, not UTF-8, too large: one error
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(field, str(path), f"must be valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(field, str(path), "must hold a JSON object")
    return data


def _ids(field: str, value: Any) -> tuple[int, ...]:
    values = value if isinstance(value, list) else [] if value is None else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise ConfigError(field, value, "must be a token id or a list of token ids")
    return tuple(values)


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint directory (one, or the index's shards)."""
    if (path / INDEX).is_file():
        index = _read_json(path / INDEX, INDEX)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ConfigError(INDEX, str(path / INDEX), "must hold a non-empty weight_map")
        names = sorted(set(weight_map.values()))
        missing = [n for n in names if not (path / n).is_file()]
        if missing:
            raise ConfigError(INDEX, ", ".join(missing), "shards named by the index are missing")
        return [path / n for n in names]
    if (path / WEIGHTS).is_file():
        return [path / WEIGHTS]
    raise ConfigError(
        "model", str(path), f"must hold {WEIGHTS}, or {INDEX} with its shards (safetensors only)"
    )


def read_state_dict(files: list[Path]) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint's safetensors files (``weight_files``), on the CPU."""
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            part = load_file(str(file))
        except Exception as exc:  # safetensors raises its own error types for a bad file
            raise ConfigError("model", str(file), f"must be a safetensors file ({exc})") from exc
        twice = sorted(set(part) & set(state))
        if twice:
            raise ConfigError("model", ", ".join(twice[:6]), "tensors stored in two shards")
        state.update(part)
    return state


def generation_defaults(path: Path, config: dict[str, Any]) -> GenerationDefaults:
    """eos / bos / max_new_tokens from generation_config.json, else from config.json."""
    gen = config
    if (path / "generation_config.json").is_file():
        gen = {**config, **_read_json(path / "generation_config.json", "generation_config")}
    bos = _ids("bos_token_id", gen.get("bos_token_id"))
    max_new = gen.get("max_new_tokens")
    if max_new is not None and (not isinstance(max_new, int) or max_new < 1):
        raise ConfigError("max_new_tokens", max_new, "must be an integer >= 1")
    return GenerationDefaults(
        eos_token_ids=_ids("eos_token_id", gen.get("eos_token_id")),
        bos_token_id=bos[0] if bos else None,
        max_new_tokens=max_new,
    )


def load_checkpoint(
    path: str | Path, *, dtype: torch.dtype | None = None, device: torch.device | str = "cpu"
) -> Checkpoint:
    """Load ``path`` (see the module docstring). ``dtype`` converts the weights (default: as
    stored); every check runs before any tensor is read."""
    root = Path(path)
    if not root.is_dir():
        raise ConfigError("model", str(path), "must be a built-in name or a checkpoint directory")
    if not (root / "config.json").is_file():
        raise ConfigError("model", str(path), "a checkpoint directory needs a config.json")
    config = _read_json(root / "config.json", "config")
    shape = DecoderConfig.from_hf(config)
    files = weight_files(root)
    generation = generation_defaults(root, config)
    tokenizer = None
    if (root / "tokenizer.json").is_file():
        tokenizer = TextTokenizer.from_file(root / "tokenizer.json")
    state = read_state_dict(files)
    if dtype is None:
        floats = [t.dtype for t in state.values() if t.is_floating_point()]
        dtype = floats[0] if floats else torch.float32
    state = {k: t.to(dtype=dtype, device=device) for k, t in state.items()}
    return Checkpoint(root, Decoder.from_hf(state, config=shape), generation, tokenizer)

"""The model a profile or a fidelity run measures: a ``DecoderConfig`` for the real decoder and
the ``ModelSpec`` the simulator prices, with the same shapes.

``--model`` is one of ``BUILTIN`` (random-weight shapes run on a CPU: the tests' tiny Llama, a
small one, and a Llama of about 110M parameters), a simulator preset (``pagedkv.models.models``:
OPT presets run as the GPT-2 layout with ReLU, which has the same matrices), or a Hugging Face
``config.json`` (gpt2 or llama). Torch-free, so the CLI validates before torch is imported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pagedkv.engine.profile import DTYPE_BYTES
from pagedkv.errors import ConfigError
from pagedkv.models.models import MODELS, Architecture, ModelSpec
from pagedkv.tensors.model_config import DecoderConfig
from pagedkv.validation import read_text

_LLAMA = {"model_type": "llama", "max_position_embeddings": 512}
BUILTIN: dict[str, dict[str, Any]] = {
    "tiny-llama": {
        **_LLAMA,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 256,
    },
    "small-llama": {
        **_LLAMA,
        "hidden_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "intermediate_size": 1376,
        "vocab_size": 4096,
    },
    "llama-110m": {  # 12 layers of 768: 85M parameters in the layers, 25M in the embedding
        **_LLAMA,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "num_key_value_heads": 12,
        "intermediate_size": 2048,
        "vocab_size": 32000,
        "tie_word_embeddings": True,
    },
}


def _from_spec(spec: ModelSpec) -> DecoderConfig:
    if spec.architecture is Architecture.OPT:
        return DecoderConfig(
            arch="gpt2",
            vocab_size=spec.vocab_size,
            hidden_size=spec.hidden_size,
            num_layers=spec.num_layers,
            num_heads=spec.num_heads,
            num_kv_heads=spec.num_heads,
            head_dim=spec.head_dim,
            intermediate_size=spec.intermediate_size,
            max_position=spec.max_model_len,
            activation="relu",
            tie_word_embeddings=spec.tied,
        )
    return DecoderConfig(
        arch="llama",
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        num_layers=spec.num_layers,
        num_heads=spec.num_heads,
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        intermediate_size=spec.intermediate_size,
        max_position=spec.max_model_len,
        tie_word_embeddings=spec.tied,
    )


def spec_of(config: DecoderConfig, name: str, dtype: str) -> ModelSpec:
    """The simulator's view of ``config`` in ``dtype`` (gpt2 counts as the OPT layout)."""
    return ModelSpec(
        name=name,
        architecture=Architecture.OPT if config.arch == "gpt2" else Architecture.LLAMA,
        num_layers=config.num_layers,
        hidden_size=config.hidden_size,
        num_heads=config.num_heads,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        intermediate_size=config.intermediate_size,
        vocab_size=config.vocab_size,
        max_model_len=config.max_position,
        dtype_bytes=DTYPE_BYTES[dtype],
        tie_word_embeddings=config.tie_word_embeddings,
    )


def resolve_model(name_or_path: str, dtype: str) -> tuple[DecoderConfig, ModelSpec]:
    """(decoder config, model spec) of ``--model``; ConfigError naming ``model`` if unknown."""
    if dtype not in DTYPE_BYTES or dtype == "float16":
        raise ConfigError("dtype", dtype, "must be one of float32, float64, bfloat16")
    if name_or_path in BUILTIN:
        config = DecoderConfig.from_hf(BUILTIN[name_or_path])
        return config, spec_of(config, name_or_path, dtype)
    for key, spec in MODELS.items():
        if key.lower() == name_or_path.lower():
            return _from_spec(spec), spec_of(_from_spec(spec), key, dtype)
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        text = read_text("model", path)  # missing, a directory, not UTF-8: one error
        try:
            data = json.loads(text)
        except ValueError as err:
            raise ConfigError("model", name_or_path, f"must be valid JSON ({err})") from None
        if not isinstance(data, dict):
            raise ConfigError("model", name_or_path, "must hold a JSON object")
        if data.get("model_type") == "opt":
            from pagedkv.models.hf_config import model_from_hf_config

            config = _from_spec(model_from_hf_config(path))
        else:
            config = DecoderConfig.from_hf(data)
        return config, spec_of(config, str(data.get("_name_or_path") or path.parent.name), dtype)
    allowed = "must be one of " + ", ".join([*BUILTIN, *MODELS]) + ", or a config.json"
    raise ConfigError("model", name_or_path, allowed)

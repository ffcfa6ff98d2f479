"""Model presets and Hugging Face ``config.json`` reading: a decoder's shapes, and what follows.

A ``ModelSpec`` holds the shapes (layers, hidden size, heads, KV heads, ...); parameter counts,
weight bytes and K/V bytes per token are derived from them, for the two layouts we count (OPT,
and Llama / Mistral). ``check_tensor_parallel`` is here because the heads decide which tensor
parallel sizes split a model evenly. GPUs are in ``gpus.py``, KV sizing in ``capacity.py``.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagedkv.errors import ConfigError
from pagedkv.validation import check_choice, check_int, read_text


class Architecture(enum.Enum):
    """The decoder families whose parameter layout we count."""

    OPT = "opt"
    """LayerNorm (weight + bias), biases everywhere, ReLU MLP of 2 matrices, learned positions
    (max_position_embeddings + 2 rows: OPT offsets positions by 2), lm head tied by default."""
    LLAMA = "llama"
    """RMSNorm (weight only), no biases, SwiGLU MLP of 3 matrices, rotary positions (no
    parameters), grouped-query attention, lm head untied by default. Mistral is the same."""


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's shapes; everything the simulator needs is derived from them."""

    name: str
    architecture: Architecture
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_model_len: int
    dtype_bytes: int = 2
    tie_word_embeddings: bool | None = None
    """Whether the lm head reuses the token embedding; None: as the architecture has it."""

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "architecture", check_choice("architecture", self.architecture, Architecture)
        )
        for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim"):
            check_int(field, getattr(self, field), 1)
        for field in ("intermediate_size", "vocab_size", "max_model_len"):
            check_int(field, getattr(self, field), 1)
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                "num_kv_heads", self.num_kv_heads, f"must divide num_heads ({self.num_heads})"
            )
        if self.dtype_bytes not in (1, 2, 4) or isinstance(self.dtype_bytes, bool):
            raise ConfigError("dtype_bytes", self.dtype_bytes, "must be 1, 2 or 4")

    @property
    def is_opt(self) -> bool:
        return self.architecture is Architecture.OPT

    @property
    def tied(self) -> bool:
        """The lm head is the token embedding matrix (counted once in num_params)."""
        return self.is_opt if self.tie_word_embeddings is None else self.tie_word_embeddings

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer: attention (q, k, v, o), MLP, norms."""
        h, q, kv, ffn = (
            self.hidden_size,
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
            self.intermediate_size,
        )
        attn = h * q + 2 * h * kv + q * h
        if self.is_opt:  # biases on q, k, v, o and both MLP matrices; 2 LayerNorms (w + b)
            return attn + q + 2 * kv + h + 2 * h * ffn + ffn + h + 2 * 2 * h
        return attn + 3 * h * ffn + 2 * h  # gate, up, down; 2 RMSNorms (w only)

    @property
    def non_embedding_params(self) -> int:
        """All layers plus the final norm: the weights every token goes through."""
        final_norm = 2 * self.hidden_size if self.is_opt else self.hidden_size
        return self.num_layers * self.layer_params + final_norm

    @property
    def lm_head_params(self) -> int:
        """vocab x hidden: the output projection, applied to each sampled position."""
        return self.vocab_size * self.hidden_size

    @property
    def embedding_params(self) -> int:
        """Token embeddings, plus OPT's learned positions (max_position_embeddings + 2 rows)."""
        positions = (self.max_model_len + 2) * self.hidden_size if self.is_opt else 0
        return self.vocab_size * self.hidden_size + positions

    @property
    def num_params(self) -> int:
        """Distinct parameters: embeddings + layers + final norm (+ an untied lm head)."""
        head = 0 if self.tied else self.lm_head_params
        return self.embedding_params + self.non_embedding_params + head

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers: 2 x layers x kv_heads x head_dim x dtype."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def kv_bytes_per_token_per_gpu(self, tensor_parallel_size: int = 1) -> int:
        """One GPU's share of a token's K/V under tensor parallelism.

        Heads are split across GPUs; with fewer KV heads than GPUs each GPU keeps a replica of
        one KV head (as vLLM does), so the share is kv_bytes_per_token / tp when tp divides
        num_kv_heads, and one head's worth otherwise.
        """
        tp = check_tensor_parallel(self, tensor_parallel_size)
        kv_heads = max(1, self.num_kv_heads // tp)
        return 2 * self.num_layers * kv_heads * self.head_dim * self.dtype_bytes


def check_tensor_parallel(model: ModelSpec, tensor_parallel_size: object) -> int:
    """tp must split the attention heads evenly, and the KV heads (or be split by them)."""
    tp = check_int("tensor_parallel_size", tensor_parallel_size, 1)
    kv = model.num_kv_heads
    if model.num_heads % tp or (kv % tp and tp % kv):
        raise ConfigError(
            "tensor_parallel_size",
            tp,
            f"must divide num_heads ({model.num_heads}) and divide or be a multiple of "
            f"num_kv_heads ({kv}) of {model.name}",
        )
    return tp


def _opt(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    # OPT: head_dim = hidden / heads, ffn_dim = 4 x hidden, vocab 50272, 2048 positions.
    return ModelSpec(
        name,
        Architecture.OPT,
        layers,
        hidden,
        heads,
        heads,
        hidden // heads,
        4 * hidden,
        50272,
        2048,
    )


def _llama(name: str, shape: tuple[int, int, int, int, int], vocab: int, max_len: int) -> ModelSpec:
    layers, hidden, heads, kv_heads, ffn = shape
    return ModelSpec(
        name,
        Architecture.LLAMA,
        layers,
        hidden,
        heads,
        kv_heads,
        hidden // heads,
        ffn,
        vocab,
        max_len,
    )


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        # config.json of facebook/opt-13b and facebook/opt-66b on Hugging Face; OPT-175B is not
        # published there: its shape is Table 1 of the OPT paper (Zhang et al., arXiv 2205.01068).
        _opt("OPT-13B", 40, 5120, 40),
        _opt("OPT-66B", 64, 9216, 72),
        _opt("OPT-175B", 96, 12288, 96),
        # config.json of meta-llama/Llama-2-{7b,13b,70b}-hf, meta-llama/Meta-Llama-3-8B and
        # mistralai/Mistral-7B-v0.1: (layers, hidden, heads, kv heads, intermediate).
        _llama("Llama-2-7B", (32, 4096, 32, 32, 11008), 32000, 4096),
        _llama("Llama-2-13B", (40, 5120, 40, 40, 13824), 32000, 4096),
        _llama("Llama-2-70B", (80, 8192, 64, 8, 28672), 32000, 4096),
        _llama("Llama-3-8B", (32, 4096, 32, 8, 14336), 128256, 8192),
        _llama("Mistral-7B", (32, 4096, 32, 8, 14336), 32000, 32768),
    )
}

_DTYPE_BYTES = {"float16": 2, "half": 2, "bfloat16": 2, "float32": 4, "float": 4}
_MODEL_TYPES = {"opt": Architecture.OPT, "llama": Architecture.LLAMA, "mistral": Architecture.LLAMA}


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """Read a Hugging Face ``config.json`` (or a directory holding one) into a ModelSpec.

    ``model_type`` picks the layout ('opt', or 'llama' / 'mistral'). A missing or bad key raises
    ConfigError whose field is the key and whose message names the file. A missing
    ``torch_dtype`` (``dtype`` in newer files) means 16 bits, what vLLM serves by default.
    """
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    text = read_text("model", file)  # missing, a directory, not UTF-8: one error naming it
    try:
        raw = json.loads(text)
    except ValueError as err:  # a JSONDecodeError, or an integer of over 4300 digits
        raise ConfigError("model", str(file), f"must be valid JSON ({err})") from None
    if not isinstance(raw, dict):
        raise ConfigError("model", str(file), "must hold a JSON object")
    where = f" (in {file})"

    def get(key: str, default: Any = None) -> Any:
        value = raw.get(key)
        value = default if value is None else value  # absent or null: the default
        if value is None:
            raise ConfigError(key, None, f"is missing{where}")
        return value

    def get_int(key: str, default: int | None = None) -> int:
        value = get(key, default)
        try:
            return check_int(key, value, 1)
        except ConfigError as err:
            raise ConfigError(key, value, err.allowed + where) from None

    model_type = get("model_type")
    if model_type not in _MODEL_TYPES:
        raise ConfigError("model_type", model_type, f"must be one of {sorted(_MODEL_TYPES)}{where}")
    arch = _MODEL_TYPES[model_type]
    dtype_key = "torch_dtype" if "torch_dtype" in raw else "dtype"
    dtype = raw.get(dtype_key) or "float16"
    if dtype not in _DTYPE_BYTES:
        raise ConfigError(dtype_key, dtype, f"must be one of {sorted(_DTYPE_BYTES)}{where}")
    hidden, heads = get_int("hidden_size"), get_int("num_attention_heads")
    if arch is Architecture.OPT:
        kv_heads, ffn, head_dim = heads, get_int("ffn_dim"), 0
    else:
        kv_heads, ffn = get_int("num_key_value_heads", heads), get_int("intermediate_size")
        head_dim = raw.get("head_dim") or 0  # optional; null in some files
    if not head_dim and hidden % heads:
        raise ConfigError("num_attention_heads", heads, f"must divide hidden_size{where}")
    if heads % kv_heads:
        raise ConfigError("num_key_value_heads", kv_heads, f"must divide {heads} heads{where}")
    tied = raw.get("tie_word_embeddings", arch is Architecture.OPT)
    try:
        return ModelSpec(
            name=str(raw.get("_name_or_path") or file.parent.name or "model"),
            architecture=arch,
            num_layers=get_int("num_hidden_layers"),
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim or hidden // heads,
            intermediate_size=ffn,
            vocab_size=get_int("vocab_size"),
            max_model_len=get_int("max_position_embeddings"),
            dtype_bytes=_DTYPE_BYTES[dtype],
            tie_word_embeddings=bool(tied),
        )
    except ConfigError as err:  # e.g. num_key_value_heads not dividing the heads
        raise ConfigError(err.field, err.value, err.allowed + where) from None


def get_model(name_or_path: str | Path) -> ModelSpec:
    """A preset model by name (case-insensitive), or a path to a config.json or its directory."""
    for key, model in MODELS.items():
        if key.lower() == str(name_or_path).lower():
            return model
    if Path(name_or_path).exists():
        return model_from_hf_config(name_or_path)
    allowed = "must be one of " + ", ".join(MODELS) + ", or a path to a config.json"
    raise ConfigError("model", str(name_or_path), allowed)

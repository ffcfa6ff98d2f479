"""Model presets: a decoder's shapes, and what follows from them.

A ``ModelSpec`` holds the shapes (layers, hidden size, heads, KV heads, experts, windows, ...);
parameter counts, weight bytes and K/V bytes per token are derived from them, for the layouts we
count (OPT and GPT-2; Llama and its kin: Mistral, Qwen, Gemma, Mixtral and other mixtures of
experts, ``moe.py``; DeepSeek's latent attention, ``mla.py``). ``check_tensor_parallel`` is
here because the heads decide which tensor parallel sizes split a model evenly. Hugging Face
``config.json`` reading is in ``hf_config.py``, GPUs in ``gpus.py``, KV sizing in
``capacity.py``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

from pagedkv.errors import ConfigError
from pagedkv.models.mla import MLASpec
from pagedkv.models.moe import MoESpec
from pagedkv.validation import check_bool, check_choice, check_int


class Architecture(enum.Enum):
    """The parameter layouts we count."""

    OPT = "opt"
    """LayerNorm (weight + bias), biases everywhere, ReLU MLP of 2 matrices, learned positions
    (max_position_embeddings + 2 rows: OPT offsets positions by 2), lm head tied by default."""
    GPT2 = "gpt2"
    """OPT's layout (fused q/k/v with biases, GELU MLP of 2 matrices with biases, LayerNorms),
    learned positions without an offset (n_positions rows), lm head tied."""
    LLAMA = "llama"
    """RMSNorm (weight only), no biases, gated MLP of 3 matrices (SwiGLU; Gemma's GeGLU has the
    same shapes), rotary positions (no parameters), grouped-query attention, lm head untied by
    default. Mistral, Qwen2/3, Gemma 1/2/3 and Mixtral are this with the variations of
    ``ModelSpec`` (biases, q/k norms, extra norms, windows, experts)."""


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
    """The dense MLP's width (OPT's ffn_dim, GPT-2's n_inner)."""
    vocab_size: int
    max_model_len: int
    dtype_bytes: int = 2
    """Bytes per weight (and per activation)."""
    tie_word_embeddings: bool | None = None
    """Whether the lm head reuses the token embedding; None: as the architecture has it."""
    kv_dtype_bytes: int | None = None
    """Bytes per cached K or V element (1 for an fp8 KV cache); None: dtype_bytes."""
    qkv_bias: bool = False
    """Biases on q, k and v (Qwen2; Llama's attention_bias). OPT and GPT-2 always have them."""
    o_bias: bool = False
    """A bias on the attention output (Llama's attention_bias)."""
    qk_norm: bool = False
    """RMSNorm of head_dim on queries and keys in every layer (Qwen3, Gemma 3)."""
    norms_per_layer: int = 2
    """RMSNorms per layer: 2 (before attention and MLP), 4 in Gemma 2/3 (and after each)."""
    sliding_window: int | None = None
    """Tokens a sliding-window layer attends to (itself included); None: no window."""
    num_sliding_layers: int = 0
    """How many layers use ``sliding_window``; the others attend to the whole sequence."""
    moe: MoESpec | None = None
    """The mixture-of-experts MLP; None: every layer has the dense MLP."""
    mla: MLASpec | None = None
    """Multi-head latent attention (``mla.py``) instead of q/k/v heads; None: standard."""
    notes: tuple[str, ...] = field(default=(), compare=False)
    """What the config reader assumed (an unknown model_type, an uncounted vision tower)."""

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "architecture", check_choice("architecture", self.architecture, Architecture)
        )
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim"):
            check_int(name, getattr(self, name), 1)
        for name in ("intermediate_size", "vocab_size", "max_model_len", "norms_per_layer"):
            check_int(name, getattr(self, name), 1)
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                "num_kv_heads", self.num_kv_heads, f"must divide num_heads ({self.num_heads})"
            )
        for name in ("dtype_bytes", "kv_dtype_bytes"):
            value = getattr(self, name)
            if value is not None and (value not in (1, 2, 4) or isinstance(value, bool)):
                raise ConfigError(name, value, "must be 1, 2 or 4")
        if self.dtype_bytes is None:
            raise ConfigError("dtype_bytes", None, "must be 1, 2 or 4")
        for name in ("qkv_bias", "o_bias", "qk_norm"):
            check_bool(name, getattr(self, name))
        check_int("num_sliding_layers", self.num_sliding_layers, 0)
        if self.num_sliding_layers > self.num_layers:
            raise ConfigError(
                "num_sliding_layers", self.num_sliding_layers, f"must be <= {self.num_layers}"
            )
        if self.sliding_window is None:
            if self.num_sliding_layers:
                raise ConfigError("sliding_window", None, "must be set for num_sliding_layers")
        else:
            check_int("sliding_window", self.sliding_window, 1)
            if not self.num_sliding_layers:
                raise ConfigError("num_sliding_layers", 0, "must be >= 1 with a sliding_window")
        if self.moe is not None and self.moe.num_moe_layers > self.num_layers:
            raise ConfigError(
                "num_moe_layers", self.moe.num_moe_layers, f"must be <= {self.num_layers}"
            )

    @property
    def is_opt(self) -> bool:
        return self.architecture is Architecture.OPT

    @property
    def layer_norm(self) -> bool:
        """OPT and GPT-2: LayerNorms with biases, biases on every matrix, a 2-matrix MLP."""
        return self.architecture is not Architecture.LLAMA

    @property
    def tied(self) -> bool:
        """The lm head is the token embedding matrix (counted once in num_params)."""
        return self.layer_norm if self.tie_word_embeddings is None else self.tie_word_embeddings

    @property
    def kv_dtype(self) -> int:
        """Bytes per cached K or V element."""
        return self.dtype_bytes if self.kv_dtype_bytes is None else self.kv_dtype_bytes

    @property
    def attention_params(self) -> int:
        """One layer's attention: q, k, v, o (+ their biases, + q/k norms), or MLA's."""
        if self.mla is not None:
            return self.mla.attention_params(self.hidden_size, self.num_heads)
        h, q, kv = (
            self.hidden_size,
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
        )
        weights = h * q + 2 * h * kv + q * h
        if self.layer_norm:
            return weights + q + 2 * kv + h
        biases = (q + 2 * kv if self.qkv_bias else 0) + (h if self.o_bias else 0)
        return weights + biases + (2 * self.head_dim if self.qk_norm else 0)

    @property
    def dense_mlp_params(self) -> int:
        """One dense MLP: 2 matrices with biases (OPT, GPT-2) or 3 without (gated)."""
        h, ffn = self.hidden_size, self.intermediate_size
        return 2 * h * ffn + ffn + h if self.layer_norm else 3 * h * ffn

    @property
    def layer_norm_params(self) -> int:
        """One layer's norms: 2 LayerNorms (weight + bias), or norms_per_layer RMSNorms."""
        h = self.hidden_size
        return 2 * 2 * h if self.layer_norm else self.norms_per_layer * h

    @property
    def layer_params(self) -> int:
        """Parameters of one dense decoder layer: attention (q, k, v, o), MLP, norms."""
        return self.attention_params + self.dense_mlp_params + self.layer_norm_params

    def _layers(self, *, active: bool) -> int:
        if self.moe is None:
            return self.num_layers * self.layer_params
        moe_layers = self.moe.num_moe_layers
        dense = (self.num_layers - moe_layers) * self.layer_params
        shared = self.attention_params + self.layer_norm_params
        return dense + moe_layers * (shared + self.moe.mlp_params(self.hidden_size, active=active))

    @property
    def non_embedding_params(self) -> int:
        """All layers (every expert) plus the final norm: the weights that take memory."""
        final_norm = 2 * self.hidden_size if self.layer_norm else self.hidden_size
        return self._layers(active=False) + final_norm

    @property
    def active_non_embedding_params(self) -> int:
        """The layer weights one token goes through (only its experts): what prices FLOPs."""
        final_norm = 2 * self.hidden_size if self.layer_norm else self.hidden_size
        return self._layers(active=True) + final_norm

    @property
    def lm_head_params(self) -> int:
        """vocab x hidden: the output projection, applied to each sampled position."""
        return self.vocab_size * self.hidden_size

    @property
    def embedding_params(self) -> int:
        """Token embeddings, plus learned positions (OPT: max_position_embeddings + 2 rows)."""
        rows = {Architecture.OPT: self.max_model_len + 2, Architecture.GPT2: self.max_model_len}
        positions = rows.get(self.architecture, 0) * self.hidden_size
        return self.vocab_size * self.hidden_size + positions

    @property
    def num_params(self) -> int:
        """Distinct parameters: embeddings + layers + final norm (+ an untied lm head)."""
        head = 0 if self.tied else self.lm_head_params
        return self.embedding_params + self.non_embedding_params + head

    @property
    def num_active_params(self) -> int:
        """num_params with only the experts one token uses (= num_params for a dense model)."""
        return self.num_params - self.non_embedding_params + self.active_non_embedding_params

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    @property
    def num_full_layers(self) -> int:
        """Layers that attend to (and keep the K/V of) the whole sequence."""
        return self.num_layers - self.num_sliding_layers

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers: 2 x layers x kv_heads x head_dim x kv dtype
        (MLA: layers x (kv_lora_rank + qk_rope_head_dim) x kv dtype).

        What a token costs while it is inside every layer's window (always, without windows).
        """
        if self.mla is not None:
            return self.num_layers * self.mla.cached_elements * self.kv_dtype
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_dtype

    def kv_bytes_per_layer_per_gpu(self, tensor_parallel_size: int = 1) -> int:
        """One token's K/V in one layer on one GPU under tensor parallelism.

        Heads are split across GPUs; with fewer KV heads than GPUs each GPU keeps a replica of
        one KV head (as vLLM does), so the share is 1 / tp when tp divides num_kv_heads, and
        one head's worth otherwise.
        """
        tp = check_tensor_parallel(self, tensor_parallel_size)
        if self.mla is not None:  # one latent shared by the heads: every GPU holds it whole
            return self.mla.cached_elements * self.kv_dtype
        return 2 * max(1, self.num_kv_heads // tp) * self.head_dim * self.kv_dtype

    @property
    def attention_flops_per_pair_per_layer(self) -> int:
        """FLOPs of one (token, attended position) pair in one layer: QK^T and AV over every
        head, 2 FLOPs per multiply-add (4 x heads x head_dim), or MLA's (``mla.py``)."""
        if self.mla is not None:
            return self.mla.flops_per_pair(self.num_heads)
        return 4 * self.num_heads * self.head_dim

    def kv_bytes_per_token_per_gpu(self, tensor_parallel_size: int = 1) -> int:
        """One GPU's share of a token's K/V over all layers (kv_bytes_per_token / tp when tp
        divides num_kv_heads; see ``kv_bytes_per_layer_per_gpu``)."""
        return self.num_layers * self.kv_bytes_per_layer_per_gpu(tensor_parallel_size)

    def sequence_kv_bytes_per_gpu(self, tokens: int, tensor_parallel_size: int = 1) -> int:
        """K/V a sequence of ``tokens`` needs on one GPU: full layers keep every token,
        sliding-window layers at most the last ``sliding_window`` (Mistral-style windows)."""
        check_int("tokens", tokens, 0)
        kept = self.num_full_layers * tokens
        if self.sliding_window is not None:
            kept += self.num_sliding_layers * min(tokens, self.sliding_window)
        return kept * self.kv_bytes_per_layer_per_gpu(tensor_parallel_size)


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


def get_model(name_or_path: str | Path) -> ModelSpec:
    """A preset model by name (case-insensitive), or a path to a config.json or its directory."""
    for key, model in MODELS.items():
        if key.lower() == str(name_or_path).lower():
            return model
    if Path(name_or_path).exists():
        from pagedkv.models.hf_config import model_from_hf_config

        return model_from_hf_config(name_or_path)
    allowed = "must be one of " + ", ".join(MODELS) + ", or a path to a config.json"
    raise ConfigError("model", str(name_or_path), allowed)

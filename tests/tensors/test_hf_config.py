"""config.json dicts in the shape published checkpoints ship them (transformers 4 style:
``rope_scaling`` beside a top-level ``rope_theta``): each family reads into the fields that
matter, and the Llama 3.1 RoPE of such a dict equals transformers' own."""

from __future__ import annotations

from typing import Any

import pytest

from pagedkv.tensors.model_config import DecoderConfig

LLAMA_31_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "vocab_size": 128256,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "torch_dtype": "bfloat16",
}
MISTRAL_7B: dict[str, Any] = {
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
}
QWEN2: dict[str, Any] = {
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "sliding_window": 32768,
    "use_sliding_window": False,
    "max_window_layers": 24,
    "tie_word_embeddings": True,
    "vocab_size": 151936,
}


def test_llama_31() -> None:
    c = DecoderConfig.from_hf(LLAMA_31_8B)
    assert (c.arch, c.model_type, c.rope_type, c.rope_theta) == ("llama", "llama", "llama3", 5e5)
    assert (c.num_heads, c.num_kv_heads, c.head_dim) == (32, 8, 128)
    assert c.rope_param("original_max_position_embeddings") == 8192
    assert (c.qkv_bias, c.o_bias, c.mlp_bias, c.tie_word_embeddings) == (False,) * 4


def test_llama_31_rope_equals_transformers() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import torch
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from pagedkv.tensors.rope import Rope

    hf = LlamaConfig(**LLAMA_31_8B)
    expected, factor = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    mine = Rope(DecoderConfig.from_hf(LLAMA_31_8B), "cpu")
    torch.testing.assert_close(mine.inv_freq, expected, atol=0, rtol=1e-6)
    assert mine.attention_factor == factor


def test_mistral_and_qwen2() -> None:
    m = DecoderConfig.from_hf(MISTRAL_7B)
    assert (m.sliding_window, m.layer_window(0), m.layer_window(31)) == (4096, 4096, 4096)
    q = DecoderConfig.from_hf(QWEN2)
    assert (q.qkv_bias, q.o_bias, q.tie_word_embeddings) == (True, False, True)
    assert q.sliding_window is None  # use_sliding_window false: every layer sees everything
    assert q.head_dim == 64

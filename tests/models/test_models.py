"""Hugging Face config.json per model family: parameters (all and active), K/V bytes per token
and windows, each against a count worked out by hand from the family's layout.

The configs are the published ones of each checkpoint (the keys that matter); the totals the
hand counts reach agree with the parameter counts Hugging Face shows for those checkpoints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedkv.errors import ConfigError
from pagedkv.models.hf_config import FAMILIES, model_from_hf_config
from pagedkv.models.models import Architecture, ModelSpec, get_model
from pagedkv.models.moe import MoESpec


def _load(tmp_path: Path, raw: dict[str, Any]) -> ModelSpec:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    return model_from_hf_config(path)


GPT2 = {  # openai-community/gpt2
    "model_type": "gpt2",
    "n_embd": 768,
    "n_head": 12,
    "n_layer": 12,
    "n_positions": 1024,
    "n_inner": None,
    "vocab_size": 50257,
}
OPT_125M = {  # facebook/opt-125m
    "model_type": "opt",
    "hidden_size": 768,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "ffn_dim": 3072,
    "max_position_embeddings": 2048,
    "vocab_size": 50272,
    "torch_dtype": "float16",
}
LLAMA_31_8B = {  # meta-llama/Llama-3.1-8B
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "max_position_embeddings": 131072,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
MISTRAL_V01 = {  # mistralai/Mistral-7B-v0.1
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "max_position_embeddings": 32768,
    "sliding_window": 4096,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
}
QWEN2_7B = {  # Qwen/Qwen2-7B
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "num_hidden_layers": 28,
    "max_position_embeddings": 131072,
    "sliding_window": 131072,
    "use_sliding_window": False,
    "max_window_layers": 28,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
}
QWEN3_06B = {  # Qwen/Qwen3-0.6B: head_dim 128 although 1024 / 16 = 64
    "model_type": "qwen3",
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "num_hidden_layers": 28,
    "max_position_embeddings": 40960,
    "attention_bias": False,
    "use_sliding_window": False,
    "sliding_window": None,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}
GEMMA_7B = {  # google/gemma-7b: no tie_word_embeddings key, tied as Gemma always is
    "model_type": "gemma",
    "hidden_size": 3072,
    "intermediate_size": 24576,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "head_dim": 256,
    "num_hidden_layers": 28,
    "max_position_embeddings": 8192,
    "vocab_size": 256000,
}
GEMMA2_9B = {  # google/gemma-2-9b
    "model_type": "gemma2",
    "hidden_size": 3584,
    "intermediate_size": 14336,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "num_hidden_layers": 42,
    "max_position_embeddings": 8192,
    "sliding_window": 4096,
    "vocab_size": 256000,
}
GEMMA3_1B = {  # google/gemma-3-1b-it
    "model_type": "gemma3_text",
    "hidden_size": 1152,
    "intermediate_size": 6912,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "num_hidden_layers": 26,
    "max_position_embeddings": 32768,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "rope_scaling": None,
    "vocab_size": 262144,
}
MIXTRAL = {  # mistralai/Mixtral-8x7B-v0.1
    "model_type": "mixtral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 32768,
    "sliding_window": None,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
}
QWEN3_30B_A3B = {  # Qwen/Qwen3-30B-A3B
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_hidden_layers": 48,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "max_position_embeddings": 40960,
    "use_sliding_window": False,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
}
QWEN15_MOE = {  # Qwen/Qwen1.5-MoE-A2.7B
    "model_type": "qwen2_moe",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "num_hidden_layers": 24,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "decoder_sparse_step": 1,
    "max_position_embeddings": 8192,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
}
DEEPSEEK_MOE_16B = {  # deepseek-ai/deepseek-moe-16b-base
    "model_type": "deepseek",
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "num_hidden_layers": 28,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "max_position_embeddings": 4096,
    "vocab_size": 102400,
    "tie_word_embeddings": False,
}

DEEPSEEK_V3 = {  # deepseek-ai/DeepSeek-V3
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "num_hidden_layers": 61,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "topk_method": "noaux_tc",
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "max_position_embeddings": 163840,
    "rope_scaling": {
        "type": "yarn",
        "factor": 40,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
    },
    "vocab_size": 129280,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
DEEPSEEK_V2_LITE = {  # deepseek-ai/DeepSeek-V2-Lite: no query bottleneck
    **DEEPSEEK_V3,
    "model_type": "deepseek_v2",
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "num_hidden_layers": 27,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "topk_method": "greedy",
    "q_lora_rank": None,
    "vocab_size": 102400,
}


def test_gpt2(tmp_path: Path) -> None:
    m = _load(tmp_path, GPT2)
    assert m.architecture is Architecture.GPT2
    assert m.tied
    assert m.intermediate_size == 4 * 768
    layer = (4 * 768 * 768 + 4 * 768) + (2 * 768 * 3072 + 3072 + 768) + 2 * 2 * 768
    assert layer == 2_362_368 + 4_722_432 + 3_072
    # tokens + 1024 learned positions (no offset) + 12 layers + final LayerNorm; tied head
    assert m.num_params == 50257 * 768 + 1024 * 768 + 12 * layer + 2 * 768 == 124_439_808
    assert m.kv_bytes_per_token == 2 * 12 * 12 * 64 * 2 == 36_864
    assert m.max_model_len == 1024


def test_opt(tmp_path: Path) -> None:
    m = _load(tmp_path, OPT_125M)
    layer = 2_362_368 + 4_722_432 + 3_072  # GPT-2's layer: the same shapes
    # OPT keeps max_position_embeddings + 2 learned positions
    assert m.num_params == 50272 * 768 + 2050 * 768 + 12 * layer + 2 * 768 == 125_239_296


def test_llama_31_rope_scaling_and_gqa(tmp_path: Path) -> None:
    m = _load(tmp_path, LLAMA_31_8B)
    attn = 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096  # q, k and v of 8 KV heads, o
    layer = attn + 3 * 4096 * 14336 + 2 * 4096
    head_and_embeddings = 2 * 128256 * 4096  # untied
    assert m.num_params == 32 * layer + 4096 + head_and_embeddings == 8_030_261_248
    assert m.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072
    # 'llama3' scaling already states the stretched length: not multiplied again (as vLLM)
    assert m.max_model_len == 131072
    assert m.dtype_bytes == 2


@pytest.mark.parametrize(
    ("scaling", "length"),
    [
        ({"rope_type": "linear", "factor": 4.0}, 4096 * 4),
        ({"type": "dynamic", "factor": 2.0}, 4096 * 2),
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}, 2048 * 4),
        ({"rope_type": "longrope", "factor": 4.0}, 4096),
        ({"rope_type": "default"}, 4096),
    ],
)
def test_rope_scaling_stretches_max_len(
    tmp_path: Path, scaling: dict[str, Any], length: int
) -> None:
    raw = {**LLAMA_31_8B, "max_position_embeddings": 4096, "rope_scaling": scaling}
    assert _load(tmp_path, raw).max_model_len == length


def test_mistral_window_on_every_layer(tmp_path: Path) -> None:
    m = _load(tmp_path, MISTRAL_V01)
    assert m.num_params == 7_241_732_096  # as the Mistral-7B preset, which leaves the window out
    assert (m.sliding_window, m.num_sliding_layers, m.num_full_layers) == (4096, 32, 0)
    per_layer = 2 * 8 * 128 * 2  # one token's K and V in one layer
    assert m.kv_bytes_per_layer_per_gpu() == per_layer == 4096
    # 8192 tokens: every layer keeps only the last 4096
    assert m.sequence_kv_bytes_per_gpu(8192) == 32 * 4096 * per_layer
    assert m.sequence_kv_bytes_per_gpu(1000) == 32 * 1000 * per_layer == 1000 * 131_072


def test_qwen2_biases_and_disabled_window(tmp_path: Path) -> None:
    m = _load(tmp_path, QWEN2_7B)
    assert m.qkv_bias
    assert not m.o_bias
    assert m.sliding_window is None
    attn = 3584 * 3584 + 2 * 3584 * 512 + 3584 * 3584 + (3584 + 2 * 512)  # q, k, v biases
    layer = attn + 3 * 3584 * 18944 + 2 * 3584
    assert m.num_params == 28 * layer + 3584 + 2 * 152064 * 3584 == 7_615_616_512
    assert m.kv_bytes_per_token == 2 * 28 * 4 * 128 * 2 == 57_344


def test_qwen2_window_on_layers_from_max_window_layers(tmp_path: Path) -> None:
    raw = {**QWEN2_7B, "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 21}
    m = _load(tmp_path, raw)
    assert (m.sliding_window, m.num_sliding_layers) == (4096, 28 - 21)


def test_qwen3_explicit_head_dim_qk_norm_tied(tmp_path: Path) -> None:
    m = _load(tmp_path, QWEN3_06B)
    assert m.head_dim == 128
    assert m.qk_norm
    assert m.tied
    q, kv = 16 * 128, 8 * 128
    attn = 1024 * q + 2 * 1024 * kv + q * 1024 + 2 * 128  # + q_norm and k_norm of head_dim
    layer = attn + 3 * 1024 * 3072 + 2 * 1024
    assert attn == 6_291_712
    assert layer == 15_730_944
    assert m.num_params == 151936 * 1024 + 28 * layer + 1024 == 596_049_920
    assert m.kv_bytes_per_token == 2 * 28 * 8 * 128 * 2 == 114_688


def test_gemma_tied_by_default(tmp_path: Path) -> None:
    m = _load(tmp_path, GEMMA_7B)
    assert m.tied
    assert m.head_dim == 256
    attn = 3072 * 4096 + 2 * 3072 * 4096 + 4096 * 3072  # 16 heads of 256 = 4096
    layer = attn + 3 * 3072 * 24576 + 2 * 3072
    assert m.num_params == 256000 * 3072 + 28 * layer + 3072 == 8_537_680_896
    assert m.kv_bytes_per_token == 2 * 28 * 16 * 256 * 2 == 458_752


def test_gemma2_alternating_windows_and_four_norms(tmp_path: Path) -> None:
    m = _load(tmp_path, GEMMA2_9B)
    attn = 3584 * 4096 + 2 * 3584 * 2048 + 4096 * 3584
    layer = attn + 3 * 3584 * 14336 + 4 * 3584  # 4 RMSNorms per layer
    assert m.num_params == 256000 * 3584 + 42 * layer + 3584 == 9_241_705_984
    assert (m.sliding_window, m.num_sliding_layers) == (4096, 21)  # layers 0, 2, ..., 40
    per_layer = 2 * 8 * 256 * 2
    assert m.sequence_kv_bytes_per_gpu(8192) == (21 * 8192 + 21 * 4096) * per_layer
    assert m.kv_bytes_per_token == 42 * per_layer


def test_gemma3_window_pattern(tmp_path: Path) -> None:
    m = _load(tmp_path, GEMMA3_1B)
    attn = 1152 * 1024 + 2 * 1152 * 256 + 1024 * 1152 + 2 * 256  # q/k norms
    layer = attn + 3 * 1152 * 6912 + 4 * 1152
    assert m.num_params == 262144 * 1152 + 26 * layer + 1152 == 999_885_952
    # every 6th layer (1-based) is global: layers 6, 12, 18, 24 -> 26 - 4 slide
    assert (m.sliding_window, m.num_sliding_layers) == (512, 22)
    per_layer = 2 * 1 * 256 * 2
    assert m.sequence_kv_bytes_per_gpu(2048) == (4 * 2048 + 22 * 512) * per_layer


def test_gemma3_multimodal_reads_text_config(tmp_path: Path) -> None:
    text = {k: v for k, v in GEMMA3_1B.items() if k != "model_type"}
    raw = {"model_type": "gemma3", "text_config": {**text, "model_type": "gemma3_text"}}
    m = _load(tmp_path, raw)
    assert m.num_params == 999_885_952
    assert m.num_sliding_layers == 22
    assert len(m.notes) == 1
    assert "vision tower" in m.notes[0]


def test_layer_types_count_per_layer(tmp_path: Path) -> None:
    types = ["sliding_attention", "full_attention", "full_attention"] * 14
    m = _load(tmp_path, {**GEMMA2_9B, "layer_types": types})
    assert m.num_sliding_layers == 14  # the list wins over Gemma 2's alternation
    with pytest.raises(ConfigError, match="one type per layer") as info:
        _load(tmp_path, {**GEMMA2_9B, "layer_types": types[:-1]})
    assert info.value.field == "layer_types"


def test_mixtral_active_and_total(tmp_path: Path) -> None:
    m = _load(tmp_path, MIXTRAL)
    assert m.moe is not None
    assert m.moe.num_moe_layers == 32
    attn = 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096
    expert = 3 * 4096 * 14336
    router = 4096 * 8
    total_layer = attn + 8 * expert + router + 2 * 4096
    active_layer = attn + 2 * expert + router + 2 * 4096
    embeddings = 2 * 32000 * 4096  # untied
    assert m.num_params == 32 * total_layer + 4096 + embeddings == 46_702_792_704
    assert m.num_active_params == 32 * active_layer + 4096 + embeddings == 12_879_925_248
    assert m.weight_bytes == 2 * 46_702_792_704  # memory holds every expert
    assert m.kv_bytes_per_token == 131_072  # attention as Mistral's


def test_qwen3_moe(tmp_path: Path) -> None:
    m = _load(tmp_path, QWEN3_30B_A3B)
    attn = 2048 * 4096 + 2 * 2048 * 512 + 4096 * 2048 + 2 * 128
    expert, router = 3 * 2048 * 768, 2048 * 128
    embeddings = 2 * 151936 * 2048
    total = 48 * (attn + 128 * expert + router + 2 * 2048) + 2048 + embeddings
    active = 48 * (attn + 8 * expert + router + 2 * 2048) + 2048 + embeddings
    assert (m.num_params, m.num_active_params) == (total, active)
    assert (total, active) == (30_532_122_624, 3_353_032_704)  # "30B-A3B"
    assert m.kv_bytes_per_token == 2 * 48 * 4 * 128 * 2


def test_qwen2_moe_shared_expert(tmp_path: Path) -> None:
    m = _load(tmp_path, QWEN15_MOE)
    attn = 4 * 2048 * 2048 + 3 * 2048  # q, k, v biases
    expert, router = 3 * 2048 * 1408, 2048 * 60
    shared = 3 * 2048 * 5632 + 2048  # the shared expert and its sigmoid gate
    embeddings = 2 * 151936 * 2048
    total = 24 * (attn + 60 * expert + router + shared + 2 * 2048) + 2048 + embeddings
    active = 24 * (attn + 4 * expert + router + shared + 2 * 2048) + 2048 + embeddings
    assert (m.num_params, m.num_active_params) == (total, active)
    assert (total, active) == (14_315_784_192, 2_689_173_504)  # "A2.7B"


def test_deepseek_moe_dense_first_layer(tmp_path: Path) -> None:
    m = _load(tmp_path, DEEPSEEK_MOE_16B)
    assert m.moe is not None
    assert m.moe.num_moe_layers == 27
    attn, norms = 4 * 2048 * 2048, 2 * 2048
    dense = attn + 3 * 2048 * 10944 + norms
    moe = attn + 64 * 3 * 2048 * 1408 + 2048 * 64 + 3 * 2048 * (2 * 1408) + norms
    embeddings = 2 * 102400 * 2048
    assert m.num_params == dense + 27 * moe + 2048 + embeddings == 16_375_728_128
    active = dense + 27 * (moe - 58 * 3 * 2048 * 1408) + 2048 + embeddings  # 6 of 64 experts
    assert m.num_active_params == active


def test_deepseek_v3_latent_attention(tmp_path: Path) -> None:
    m = _load(tmp_path, DEEPSEEK_V3)
    assert m.mla is not None
    assert m.moe is not None
    h, heads = 7168, 128
    q = h * 1536 + 1536 + 1536 * heads * (128 + 64)  # bottleneck, its norm, up to every head
    kv = h * (512 + 64) + 512 + 512 * heads * (128 + 128)  # latent + rotary key; up-projection
    attn = q + kv + heads * 128 * h
    assert m.attention_params == attn == 187_107_328
    dense = attn + 3 * h * 18432 + 2 * h  # layers 0-2
    router = (h + 1) * 256  # + e_score_correction_bias
    moe = attn + 256 * 3 * h * 2048 + router + 3 * h * 2048 + 2 * h  # 256 routed, 1 shared
    embeddings = 2 * 129280 * h
    assert m.num_params == 3 * dense + 58 * moe + h + embeddings == 671_026_419_200  # "671B"
    active = 3 * dense + 58 * (moe - 248 * 3 * h * 2048) + h + embeddings  # 8 of 256 routed
    assert m.num_active_params == active == 37_552_297_472  # "37B activated"
    # the cache holds the latent and the rotary key: 576 elements a layer, on every GPU
    assert m.kv_bytes_per_token == 61 * (512 + 64) * 2 == 70_272
    assert m.kv_bytes_per_token_per_gpu(8) == 70_272
    assert m.attention_flops_per_pair_per_layer == heads * (2 * 576 + 2 * 512)
    assert m.max_model_len == 4096 * 40  # yarn


def test_deepseek_v2_lite(tmp_path: Path) -> None:
    m = _load(tmp_path, DEEPSEEK_V2_LITE)
    assert m.mla is not None
    assert m.mla.q_lora_rank == 0
    h, heads = 2048, 16
    attn = h * heads * 192 + h * 576 + 512 + 512 * heads * 256 + heads * 128 * h
    dense = attn + 3 * h * 10944 + 2 * h
    moe = attn + 64 * 3 * h * 1408 + h * 64 + 2 * 3 * h * 1408 + 2 * h  # no router bias
    assert m.num_params == dense + 26 * moe + h + 2 * 102400 * h == 15_706_484_224  # "15.7B"
    assert m.kv_bytes_per_token == 27 * 576 * 2


def test_unknown_model_type_reads_standard_fields(tmp_path: Path) -> None:
    raw = {
        "model_type": "my_decoder",
        "hidden_size": 512,
        "num_attention_heads": 8,
        "num_hidden_layers": 4,
        "intermediate_size": 1024,
        "vocab_size": 1000,
        "max_position_embeddings": 2048,
    }
    m = _load(tmp_path, raw)
    layer = 4 * 512 * 512 + 3 * 512 * 1024 + 2 * 512  # Llama-style, 8 KV heads (MHA)
    assert m.num_params == 4 * layer + 512 + 2 * 1000 * 512
    assert m.kv_bytes_per_token == 2 * 4 * 8 * 64 * 2
    assert len(m.notes) == 1
    assert "'my_decoder' is not a known family" in m.notes[0]
    assert not _load(tmp_path, {**raw, "model_type": "llama"}).notes


@pytest.mark.parametrize(
    "key", ["hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size"]
)
def test_unknown_model_type_missing_key(tmp_path: Path, key: str) -> None:
    raw = {
        "model_type": "my_decoder",
        "hidden_size": 512,
        "num_attention_heads": 8,
        "num_hidden_layers": 4,
        "intermediate_size": 1024,
        "vocab_size": 1000,
        "max_position_embeddings": 2048,
    }
    del raw[key]
    with pytest.raises(ConfigError, match="is missing") as info:
        _load(tmp_path, raw)
    assert info.value.field == key
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({**GPT2, "n_embd": None}, "n_embd"),  # a family's own name for the key
        ({**MIXTRAL, "num_experts_per_tok": None}, "num_experts_per_tok"),
        ({**MIXTRAL, "num_experts_per_tok": 9}, "num_experts_per_tok"),
        ({**QWEN3_30B_A3B, "moe_intermediate_size": None}, "moe_intermediate_size"),
        ({**MISTRAL_V01, "sliding_window": 0}, "sliding_window"),
        ({**LLAMA_31_8B, "rope_scaling": [8]}, "rope_scaling"),
        (
            {**LLAMA_31_8B, "rope_scaling": {"rope_type": "linear", "factor": 0.5}},
            "rope_scaling.factor",
        ),
        ({**DEEPSEEK_V3, "qk_nope_head_dim": None}, "qk_nope_head_dim"),
        ({**DEEPSEEK_V3, "kv_lora_rank": 0}, "kv_lora_rank"),
        ({**OPT_125M, "hidden_size": 1536, "word_embed_proj_dim": 768}, "word_embed_proj_dim"),
        ({**LLAMA_31_8B, "attention_bias": "no"}, "attention_bias"),
        ({**GEMMA_7B, "tie_word_embeddings": 1}, "tie_word_embeddings"),
        ({**QWEN15_MOE, "mlp_only_layers": 3}, "mlp_only_layers"),
    ],
)
def test_bad_family_configs(tmp_path: Path, raw: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, raw)
    assert info.value.field == field
    assert str(tmp_path / "config.json") in str(info.value)


def test_every_family_is_read(tmp_path: Path) -> None:
    configs = [GPT2, OPT_125M, LLAMA_31_8B, MISTRAL_V01, QWEN2_7B, QWEN3_06B, GEMMA_7B]
    configs += [GEMMA2_9B, GEMMA3_1B, MIXTRAL, QWEN3_30B_A3B, QWEN15_MOE, DEEPSEEK_MOE_16B]
    configs += [DEEPSEEK_V2_LITE, DEEPSEEK_V3]
    assert {c["model_type"] for c in configs} == set(FAMILIES)
    for raw in configs:
        path = tmp_path / str(raw["model_type"])
        path.mkdir()
        (path / "config.json").write_text(json.dumps(raw))
        m = get_model(path)
        assert not m.notes
        assert m.num_active_params <= m.num_params
        assert (m.moe is None) == (m.num_active_params == m.num_params)


def test_simulate_notes_an_unknown_family_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pagedkv.cli import main

    raw = {**MISTRAL_V01, "model_type": "my_decoder", "num_hidden_layers": 4}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    flags = ["simulate", "--model", str(path), "--gpu", "L4", "--quiet"]
    assert main([*flags, "--workload", "fixed", "--prompt-len", "64", "--output-len", "8"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert err[0].startswith("pagedkv: note: ")
    assert "'my_decoder' is not a known family" in err[0]
    del raw["intermediate_size"]
    path.write_text(json.dumps(raw))
    assert main(flags) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"pagedkv: error: intermediate_size: got None; is missing (in {path})"]


@st.composite
def _specs(draw: st.DrawFn) -> ModelSpec:
    kv_heads = draw(st.integers(1, 4))
    layers = draw(st.integers(1, 12))
    experts = draw(st.integers(1, 8))
    moe = draw(
        st.one_of(
            st.none(),
            st.builds(
                MoESpec,
                st.just(experts),
                st.integers(1, experts),
                st.integers(1, 64),
                st.integers(1, layers),
                st.integers(0, 64),
                st.booleans(),
            ),
        )
    )
    sliding = draw(st.integers(0, layers))
    return ModelSpec(
        "m",
        draw(st.sampled_from(Architecture)),
        layers,
        draw(st.integers(1, 8)) * 16,
        kv_heads * draw(st.integers(1, 4)),
        kv_heads,
        draw(st.integers(1, 8)) * 8,
        draw(st.integers(1, 256)),
        draw(st.integers(1, 1000)),
        draw(st.integers(1, 4096)),
        qkv_bias=draw(st.booleans()),
        qk_norm=draw(st.booleans()),
        sliding_window=draw(st.integers(1, 512)) if sliding else None,
        num_sliding_layers=sliding,
        moe=moe,
    )


@given(_specs(), st.integers(0, 2000))
def test_counts_are_consistent(m: ModelSpec, tokens: int) -> None:
    assert m.num_active_params <= m.num_params
    if m.moe is None or m.moe.experts_per_token == m.moe.num_experts:
        assert m.num_active_params == m.num_params  # every expert active: nothing idle
    seq = m.sequence_kv_bytes_per_gpu(tokens)
    assert seq <= tokens * m.kv_bytes_per_token  # windows only ever keep less
    if m.sliding_window is None or tokens <= m.sliding_window:
        assert seq == tokens * m.kv_bytes_per_token
    assert m.kv_bytes_per_token == m.num_layers * m.kv_bytes_per_layer_per_gpu()


def test_latent_attention_in_the_roofline_and_the_pool(tmp_path: Path) -> None:
    from pagedkv.engine.batch_shape import BatchShape
    from pagedkv.engine.cost_model import RooflineConfig, RooflineCost
    from pagedkv.models.gpus import GPUS, GiB
    from pagedkv.simulation import SimulationConfig, simulate

    v3 = _load(tmp_path, DEEPSEEK_V3)
    cfg = RooflineConfig()
    cost = RooflineCost(GPUS["H200"], v3, tensor_parallel_size=8, config=cfg)
    flop_s = 989e12 * cfg.compute_efficiency * 8
    pair = BatchShape(0, 0, 1, 0)
    assert cost.compute_time(pair) == pytest.approx(61 * 128 * (2 * 576 + 2 * 512) / flop_s)
    byte_s = 4.8e12 * cfg.memory_efficiency
    read = cost.memory_time(BatchShape(0, 0, 0, 1)) - cost.memory_time(BatchShape())
    blocks = 1 + cfg.paged_block_overhead  # the paged kernel's per-block cost, block size 16
    assert read == pytest.approx(70_272 / byte_s * blocks)  # the whole latent on every GPU

    lite = tmp_path / "lite"
    lite.mkdir()
    (lite / "config.json").write_text(json.dumps(DEEPSEEK_V2_LITE))
    flat = {"model": str(lite), "gpu": "H100-SXM", "workload": "sharegpt-like"}
    result = simulate(SimulationConfig.from_flat({**flat, "num_requests": 40}))
    kv_bytes = int(80 * GiB * 0.9) - 2 * 15_706_484_224 - 128 * 2**20
    assert result.summary["num_gpu_blocks"] == kv_bytes // (16 * 27 * 576 * 2)
    assert result.summary["finished"] == 40

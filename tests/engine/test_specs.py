"""GPU and model presets, config.json reading, the KV capacity they give (vLLM paper Table 1)."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from pagedkv.engine.capacity import kv_capacity, swap_space_blocks
from pagedkv.errors import ConfigError
from pagedkv.models.gpus import GPUS, GiB, GPUSpec, get_gpu
from pagedkv.models.hf_config import model_from_hf_config
from pagedkv.models.models import MODELS, Architecture, ModelSpec, get_model
from pagedkv.models.moe import MoESpec

NOMINAL = {
    "OPT-13B": 13e9,
    "OPT-66B": 66e9,
    "OPT-175B": 175e9,
    "Llama-2-7B": 7e9,
    "Llama-2-13B": 13e9,
    "Llama-2-70B": 70e9,
    "Llama-3-8B": 8e9,
    "Mistral-7B": 7.2e9,
}

# Exact parameter counts Hugging Face reports for these checkpoints (model cards / safetensors
# metadata): the layouts are counted right, not just roughly.
EXACT = {
    "Llama-2-7B": 6_738_415_616,
    "Llama-2-13B": 13_015_864_320,
    "Llama-2-70B": 68_976_648_192,
    "Llama-3-8B": 8_030_261_248,
    "Mistral-7B": 7_241_732_096,
}


def test_every_preset_has_a_nominal_size() -> None:
    assert set(MODELS) == set(NOMINAL)


@pytest.mark.parametrize("name", sorted(NOMINAL))
def test_param_count_near_nominal(name: str) -> None:
    assert MODELS[name].num_params == pytest.approx(NOMINAL[name], rel=0.05)


@pytest.mark.parametrize("name", sorted(EXACT))
def test_param_count_exact(name: str) -> None:
    assert MODELS[name].num_params == EXACT[name]


def test_opt_13b_kv_per_token_is_800_kib() -> None:
    # vLLM paper, Sec. 3: 2 (K and V) x 5120 (hidden) x 40 (layers) x 2 bytes = 800 KB.
    assert MODELS["OPT-13B"].kv_bytes_per_token == 819_200 == 800 * 1024


def test_gqa_shrinks_kv() -> None:
    llama70 = MODELS["Llama-2-70B"]
    assert llama70.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2  # 8 KV heads, not 64


def test_weight_bytes() -> None:
    opt = MODELS["OPT-13B"]
    assert opt.weight_bytes == 2 * opt.num_params
    assert opt.tied
    assert not MODELS["Llama-2-7B"].tied


def test_paper_capacity_opt_13b_on_a100_40gb() -> None:
    # vLLM paper Table 1: 12 GB for KV, 15.7K token slots.
    cap = kv_capacity(GPUS["A100-40GB"], MODELS["OPT-13B"])
    assert cap.kv_bytes_per_gpu / GiB == pytest.approx(12, rel=0.03)
    assert cap.token_slots == pytest.approx(15_700, rel=0.03)
    assert cap.token_slots == cap.num_gpu_blocks * 16
    assert cap.num_gpu_blocks * cap.block_bytes_per_gpu <= cap.kv_bytes_per_gpu


def test_paper_capacity_opt_66b_on_4_a100() -> None:
    # vLLM paper Table 1: 4 x A100, 21 GB for KV, 9.7K token slots.
    cap = kv_capacity(GPUS["A100-40GB"], MODELS["OPT-66B"], tensor_parallel_size=4)
    assert 4 * cap.kv_bytes_per_gpu / GiB == pytest.approx(21, rel=0.03)
    assert cap.token_slots == pytest.approx(9_700, rel=0.03)


def test_tensor_parallelism_divides_weights_and_kv() -> None:
    gpu, model = GPUS["A100-80GB"], MODELS["Llama-2-13B"]
    caps = [kv_capacity(gpu, model, tensor_parallel_size=tp) for tp in (1, 2, 4, 8)]
    for a, b in itertools.pairwise(caps):
        assert b.num_gpu_blocks > a.num_gpu_blocks
        assert b.weight_bytes_per_gpu == pytest.approx(a.weight_bytes_per_gpu / 2, abs=1)
        assert b.kv_bytes_per_token_per_gpu * 2 == a.kv_bytes_per_token_per_gpu


def test_fewer_kv_heads_than_gpus_replicates() -> None:
    model = MODELS["Llama-2-70B"]  # 8 KV heads
    one_head = 2 * 80 * 128 * 2
    assert model.kv_bytes_per_token_per_gpu(8) == one_head
    assert model.kv_bytes_per_token_per_gpu(16) == one_head


def test_weights_that_do_not_fit() -> None:
    with pytest.raises(ConfigError, match=r"weights.*gpu_memory_utilization") as info:
        kv_capacity(GPUS["RTX-2070"], MODELS["OPT-13B"])
    assert info.value.field == "tensor_parallel_size"
    kv_capacity(GPUS["A100-80GB"], MODELS["Llama-2-70B"], tensor_parallel_size=2)  # fits
    with pytest.raises(ConfigError):
        kv_capacity(GPUS["A100-80GB"], MODELS["Llama-2-70B"])


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"tensor_parallel_size": 3}, "tensor_parallel_size"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"activation_reserve_bytes": -1}, "activation_reserve_bytes"),
        ({"block_size": 0}, "block_size"),
    ],
)
def test_capacity_rejects(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        kv_capacity(GPUS["A100-40GB"], MODELS["OPT-13B"], **kwargs)
    assert info.value.field == field


def test_swap_space_blocks() -> None:
    opt = MODELS["OPT-13B"]
    assert swap_space_blocks(4 * GiB, opt) == 4 * GiB // (16 * 819_200)
    assert swap_space_blocks(4 * GiB, opt, block_size=32) == 4 * GiB // (32 * 819_200)
    assert swap_space_blocks(0, opt) == 0
    with pytest.raises(ConfigError, match="swap_space_bytes"):
        swap_space_blocks(-1, opt)


def _hf(model: ModelSpec) -> dict[str, Any]:
    """The config.json a Hugging Face checkpoint of ``model`` would ship."""
    common = {
        "num_hidden_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "num_attention_heads": model.num_heads,
        "vocab_size": model.vocab_size,
        "max_position_embeddings": model.max_model_len,
        "torch_dtype": "float16",
        "_name_or_path": model.name,
    }
    if model.architecture is Architecture.OPT:
        return {**common, "model_type": "opt", "ffn_dim": model.intermediate_size}
    return {
        **common,
        "model_type": "llama",
        "num_key_value_heads": model.num_kv_heads,
        "intermediate_size": model.intermediate_size,
    }


def _write(tmp_path: Path, raw: object) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    return path


@pytest.mark.parametrize("name", ["OPT-13B", "Llama-2-70B", "Mistral-7B"])
def test_config_json_round_trips(tmp_path: Path, name: str) -> None:
    preset = MODELS[name]
    path = _write(tmp_path, _hf(preset))
    loaded = model_from_hf_config(path)
    assert dataclasses.replace(loaded, tie_word_embeddings=None) == preset
    assert loaded.num_params == preset.num_params
    assert get_model(path) == loaded
    assert get_model(str(tmp_path)) == loaded  # a directory holding config.json


def test_config_json_optional_keys(tmp_path: Path) -> None:
    raw = {
        **_hf(MODELS["Llama-3-8B"]),
        "head_dim": 256,
        "torch_dtype": "float32",
        "tie_word_embeddings": True,
    }
    del raw["_name_or_path"]
    model = model_from_hf_config(_write(tmp_path, raw))
    assert (model.head_dim, model.dtype_bytes, model.tied) == (256, 4, True)
    assert model.kv_bytes_per_token == 2 * 32 * 8 * 256 * 4
    raw.pop("num_key_value_heads")
    raw.pop("torch_dtype")
    model = model_from_hf_config(_write(tmp_path, raw))
    assert (model.num_kv_heads, model.dtype_bytes) == (32, 2)  # defaults: MHA, 16 bits


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"num_hidden_layers": None}, "num_hidden_layers"),
        ({"hidden_size": "4096"}, "hidden_size"),
        ({"intermediate_size": 0}, "intermediate_size"),
        ({"num_key_value_heads": 5}, "num_key_value_heads"),
        ({"num_attention_heads": 3}, "num_attention_heads"),
        ({"vocab_size": None}, "vocab_size"),
        ({"model_type": None}, "model_type"),
        ({"torch_dtype": "int3"}, "torch_dtype"),
        ({"max_position_embeddings": True}, "max_position_embeddings"),
    ],
)
def test_bad_config_json(tmp_path: Path, change: dict[str, Any], field: str) -> None:
    raw = {**_hf(MODELS["Llama-2-7B"]), **change}
    path = _write(tmp_path, {k: v for k, v in raw.items() if v is not None})
    with pytest.raises(ConfigError) as info:
        model_from_hf_config(path)
    assert info.value.field == field
    assert str(path) in str(info.value)


def test_opt_config_needs_ffn_dim(tmp_path: Path) -> None:
    raw = _hf(MODELS["OPT-13B"])
    del raw["ffn_dim"]
    with pytest.raises(ConfigError, match="ffn_dim: got None; is missing"):
        model_from_hf_config(_write(tmp_path, raw))


def test_unreadable_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="valid JSON"):
        model_from_hf_config(tmp_path)
    with pytest.raises(ConfigError, match="JSON object"):
        model_from_hf_config(_write(tmp_path, [1, 2]))
    with pytest.raises(ConfigError, match="readable"):
        model_from_hf_config(tmp_path / "missing.json")


def test_lookup_by_name() -> None:
    assert get_gpu("a100-40gb") is GPUS["A100-40GB"]
    assert get_model("llama-2-7b") is MODELS["Llama-2-7B"]
    with pytest.raises(ConfigError, match="A100-40GB") as info:
        get_gpu("V100")
    assert info.value.field == "gpu"
    with pytest.raises(ConfigError, match="OPT-13B") as err:
        get_model("GPT-5")
    assert err.value.field == "model"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_layers": 0}, "num_layers"),
        ({"num_kv_heads": 3}, "num_kv_heads"),
        ({"dtype_bytes": 3}, "dtype_bytes"),
        ({"architecture": "bert"}, "architecture"),
        ({"kv_dtype_bytes": 3}, "kv_dtype_bytes"),
        ({"norms_per_layer": 0}, "norms_per_layer"),
        ({"qk_norm": 1}, "qk_norm"),
        ({"sliding_window": 4096}, "num_sliding_layers"),
        ({"num_sliding_layers": 2}, "sliding_window"),
        ({"sliding_window": 0, "num_sliding_layers": 2}, "sliding_window"),
        ({"sliding_window": 64, "num_sliding_layers": 33}, "num_sliding_layers"),
        ({"moe": MoESpec(8, 2, 128, 33)}, "num_moe_layers"),
    ],
)
def test_model_spec_rejects(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        dataclasses.replace(MODELS["Llama-2-7B"], **kwargs)
    assert info.value.field == field


def test_gpu_spec_rejects() -> None:
    with pytest.raises(ConfigError) as info:
        GPUSpec("x", 1, 0.0, 1.0, 1.0)
    assert info.value.field == "bf16_flops"
    with pytest.raises(ConfigError) as info:
        GPUSpec("x", 1, 1.0, 1.0, 1.0, float("inf"))
    assert info.value.field == "interconnect_bandwidth"
    assert GPUSpec("x", 1, 1.0, 1.0, 2.0).peer_bandwidth == 2.0


def test_gpu_presets() -> None:
    kept = {"A100-40GB", "A100-80GB", "H100-SXM", "H200", "L4", "RTX-2070"}
    assert set(GPUS) == kept | {"H100-PCIe", "L40S", "A10", "MI300X"}  # test_gpus.py
    assert GPUS["A100-40GB"].memory_bytes == 40 * GiB
    assert all(g.bf16_flops > g.mem_bandwidth for g in GPUS.values())


MISTRAL_V01 = dataclasses.replace(  # mistralai/Mistral-7B-v0.1: a 4096-token window, every layer
    MODELS["Mistral-7B"], sliding_window=4096, num_sliding_layers=32
)


def test_max_concurrency_counts_the_window_by_hand() -> None:
    kv_bytes = int(80 * GiB * 0.9) - 2 * 7_241_732_096 - 128 * 2**20
    assert kv_bytes == 62_691_729_408
    layer_block = 16 * (2 * 8 * 128 * 2)  # 16 tokens of one layer's K and V: 65,536 bytes
    plain = kv_capacity(GPUS["A100-80GB"], MODELS["Mistral-7B"])
    windowed = kv_capacity(GPUS["A100-80GB"], MISTRAL_V01)
    # 16,384 tokens: every layer holds 1,024 blocks without the window ...
    assert plain.layer_blocks_per_request(16_384) == 32 * 1024
    assert plain.max_concurrency(16_384) == kv_bytes // (layer_block * 32 * 1024) == 29
    # ... and at most ceil(4095 / 16) + 1 = 257 blocks with it
    assert windowed.layer_blocks_per_request(16_384) == 32 * 257
    assert windowed.max_concurrency(16_384) == kv_bytes // (layer_block * 32 * 257) == 116
    # shorter than the window: the same either way; the pool itself is the same
    assert windowed.max_concurrency(2000) == plain.max_concurrency(2000)
    assert windowed.num_gpu_blocks == plain.num_gpu_blocks


def test_max_concurrency_mixed_layers() -> None:
    half = dataclasses.replace(MISTRAL_V01, num_sliding_layers=16)
    cap = kv_capacity(GPUS["A100-80GB"], half, block_size=32)
    # 10,000 tokens in blocks of 32: 313 per full layer, min(313, ceil(4095 / 32) + 1 = 129)
    assert cap.layer_blocks_per_request(10_000) == 16 * 313 + 16 * 129


@pytest.mark.parametrize("name", sorted(NOMINAL))
@pytest.mark.parametrize("tokens", [1, 15, 16, 17, 2048, 4097])
def test_max_concurrency_without_a_window_is_whole_requests_of_blocks(
    name: str, tokens: int
) -> None:
    gpu = GPUS["H200"]
    tp = 8 if name == "OPT-175B" else 2
    cap = kv_capacity(gpu, MODELS[name], tensor_parallel_size=tp)
    assert cap.max_concurrency(tokens) == cap.num_gpu_blocks // -(-tokens // 16)


_MOE = MoESpec(num_experts=8, experts_per_token=2, expert_intermediate_size=1, num_moe_layers=1)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"num_experts": 0, "experts_per_token": 0}, "num_experts"),
        ({"experts_per_token": 9}, "experts_per_token"),
        ({"expert_intermediate_size": 0}, "expert_intermediate_size"),
        ({"num_moe_layers": 0}, "num_moe_layers"),
        ({"shared_intermediate_size": -1}, "shared_intermediate_size"),
    ],
)
def test_moe_spec_rejects(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        dataclasses.replace(_MOE, **change)
    assert info.value.field == field

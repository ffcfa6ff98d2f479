"""--dtype and --kv-cache-dtype (vLLM's names and defaults): the bytes they give, the capacity
and the roofline terms that follow, the flags; and mixtures of experts in the roofline."""

from __future__ import annotations

import dataclasses

import pytest

from pagedkv.cli import main
from pagedkv.engine.batch_shape import BatchShape
from pagedkv.engine.capacity import DEFAULT_ACTIVATION_RESERVE_BYTES, kv_capacity
from pagedkv.engine.cost_model import RooflineConfig, RooflineCost
from pagedkv.errors import ConfigError
from pagedkv.memory.manager import KVCacheManager
from pagedkv.models.dtypes import KVCacheDType, ModelDType, serving_model
from pagedkv.models.gpus import GPUS, GiB
from pagedkv.models.models import MODELS
from pagedkv.models.moe import MoESpec
from pagedkv.simulation import SimulationConfig, build_engine

OPT13 = MODELS["OPT-13B"]


def test_auto_is_the_model_itself() -> None:
    assert serving_model(OPT13, ModelDType.AUTO, KVCacheDType.AUTO) is OPT13
    assert serving_model(OPT13, ModelDType.BFLOAT16, KVCacheDType.AUTO) is OPT13  # 2 bytes


@pytest.mark.parametrize("kind", [KVCacheDType.FP8, KVCacheDType.FP8_E4M3, KVCacheDType.FP8_E5M2])
def test_fp8_halves_kv_bytes(kind: KVCacheDType) -> None:
    fp8 = serving_model(OPT13, ModelDType.AUTO, kind)
    assert fp8.kv_bytes_per_token == 2 * 40 * 5120 * 1 == 409_600  # 800 KiB / 2
    assert fp8.weight_bytes == OPT13.weight_bytes  # weights stay 16-bit


def test_float32_doubles_weights_and_kv() -> None:
    f32 = serving_model(OPT13, ModelDType.FLOAT32, KVCacheDType.AUTO)
    assert f32.weight_bytes == 4 * OPT13.num_params
    assert f32.kv_bytes_per_token == 2 * 40 * 5120 * 4
    f32_fp8 = serving_model(OPT13, ModelDType.FLOAT, KVCacheDType.FP8)
    assert f32_fp8.kv_bytes_per_token == 409_600


def test_auto_serves_a_float32_checkpoint_in_16_bits() -> None:
    checkpoint = dataclasses.replace(OPT13, dtype_bytes=4)  # torch_dtype float32
    served = serving_model(checkpoint, ModelDType.AUTO, KVCacheDType.AUTO)
    assert served.dtype_bytes == 2
    assert served.kv_bytes_per_token == 819_200


def test_capacity_with_fp8_by_hand() -> None:
    # vLLM paper's setup: OPT-13B on an A100-40GB, 90% of memory, 128 MiB for activations
    kv_bytes = int(40 * GiB * 0.9) - 2 * 12_853_473_280 - DEFAULT_ACTIVATION_RESERVE_BYTES
    assert kv_bytes == 38_654_705_664 - 25_706_946_560 - 134_217_728 == 12_813_541_376
    fp8 = serving_model(OPT13, ModelDType.AUTO, KVCacheDType.FP8)
    assert kv_capacity(GPUS["A100-40GB"], OPT13).num_gpu_blocks == kv_bytes // (16 * 819_200)
    assert kv_capacity(GPUS["A100-40GB"], fp8).num_gpu_blocks == kv_bytes // (16 * 409_600)
    assert (kv_bytes // (16 * 819_200), kv_bytes // (16 * 409_600)) == (977, 1955)


def test_simulate_flags_reach_the_pool() -> None:
    def blocks(**flat: object) -> int:
        engine = build_engine(SimulationConfig.from_flat({"workload": "lesson", **flat}))
        return engine.scheduler.kv.capacity // 16

    assert blocks() == 977
    assert blocks(kv_cache_dtype="fp8") == 1955
    # float32 weights (51.4 GB) do not fit an A100-40GB
    with pytest.raises(ConfigError, match="weights"):
        blocks(dtype="float32")
    assert blocks(dtype="float32", gpu="A100-80GB", kv_cache_dtype="fp8_e5m2") == (
        int(80 * GiB * 0.9) - 4 * 12_853_473_280 - 128 * 2**20
    ) // (16 * 409_600)


def test_fp8_doubles_the_swap_pool() -> None:
    def cpu_blocks(**flat: object) -> int:
        engine = build_engine(SimulationConfig.from_flat({"workload": "lesson", **flat}))
        kv = engine.scheduler.kv
        assert isinstance(kv, KVCacheManager)
        return kv.cpu.num_blocks

    # vLLM's 4 GiB of swap space per GPU, in blocks of 16 tokens
    assert cpu_blocks() == 4 * GiB // (16 * 819_200)
    assert cpu_blocks(kv_cache_dtype="fp8") == 4 * GiB // (16 * 409_600)


@pytest.mark.parametrize(("key", "value"), [("dtype", "int8"), ("kv_cache_dtype", "fp4")])
def test_bad_dtypes(key: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        SimulationConfig.from_flat({key: value})
    assert info.value.field == key


def test_dtype_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--workload", "lesson", "--kv-cache-dtype", "fp8", "--quiet"]) == 0
    assert main(["simulate", "--dtype", "bfloat16", "--quiet", "--workload", "lesson"]) == 0
    assert main(["simulate", "--kv-cache-dtype", "int4", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "pagedkv: error: kv_cache_dtype: got 'int4'; must be one of 'auto', 'fp8', "
        "'fp8_e4m3', 'fp8_e5m2'"
    ]


def test_fp8_halves_the_roofline_kv_terms() -> None:
    cfg = RooflineConfig()
    auto = RooflineCost(GPUS["A100-40GB"], OPT13, config=cfg)
    fp8 = RooflineCost(GPUS["A100-40GB"], serving_model(OPT13, ModelDType.AUTO, KVCacheDType.FP8))
    byte_s = GPUS["A100-40GB"].mem_bandwidth * cfg.memory_efficiency
    reads = BatchShape(0, 0, 0, 10_000)
    empty = BatchShape()
    blocks = 1 + cfg.paged_block_overhead  # the paged kernel's per-block cost, at block size 16
    assert auto.memory_time(reads) - auto.memory_time(empty) == pytest.approx(
        10_000 * 819_200 / byte_s * blocks
    )
    assert fp8.memory_time(reads) - fp8.memory_time(empty) == pytest.approx(
        10_000 * 409_600 / byte_s * blocks
    )
    assert fp8.memory_time(empty) == auto.memory_time(empty)  # the weights are unchanged
    assert fp8.block_bytes_per_gpu * 2 == auto.block_bytes_per_gpu  # swaps move half


MIXTRAL = dataclasses.replace(  # Mixtral-8x7B: Mistral-7B's attention, 8 experts, 2 per token
    MODELS["Mistral-7B"], name="Mixtral-8x7B", moe=MoESpec(8, 2, 14336, 32)
)


def test_moe_compute_is_priced_by_active_parameters() -> None:
    cfg = RooflineConfig()
    cost = RooflineCost(GPUS["H100-SXM"], MIXTRAL, tensor_parallel_size=2, config=cfg)
    flop_s = 989e12 * cfg.compute_efficiency * 2
    attn = 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096
    active_layers = 32 * (attn + 2 * 3 * 4096 * 14336 + 4096 * 8 + 2 * 4096) + 4096
    assert MIXTRAL.active_non_embedding_params == active_layers
    one_token = BatchShape(1, 0, 0, 0)
    assert cost.compute_time(one_token) == pytest.approx(2 * active_layers / flop_s)
    # ... while every expert's weights are streamed and held
    all_layers = 32 * (attn + 8 * 3 * 4096 * 14336 + 4096 * 8 + 2 * 4096) + 4096
    weights = (all_layers + 32000 * 4096) * 2 / 2  # + lm head, 2 bytes, over tp = 2
    byte_s = 3.35e12 * cfg.memory_efficiency
    assert cost.memory_time(BatchShape()) == pytest.approx(weights / byte_s)
    assert kv_capacity(GPUS["H100-SXM"], MIXTRAL, tensor_parallel_size=2).weight_bytes_per_gpu == (
        MIXTRAL.num_params * 2 // 2
    )

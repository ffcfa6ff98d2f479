"""``pagedkv profile`` and ``pagedkv fidelity`` on the tiny model (small budgets; no timing
assertions: what is checked is that the machinery runs and writes what the cost model reads)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from pagedkv.cli import main
from pagedkv.engine.profile import Profile, load_profile
from pagedkv.engine.profiled_cost import ProfiledCost
from pagedkv.errors import ConfigError
from pagedkv.tensors.model_shapes import resolve_model
from pagedkv.tensors.profile_config import FidelityConfig, ProfileConfig
from pagedkv.tensors.profile_ops import MAX_PASSES, MIN_PASSES, points
from pagedkv.tensors.profiler import profile

SMALL = {"budget_s": 0.3, "max_tokens": 64, "max_seqs": 8}


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("profile") / "tiny.json"
    ticks: list[int] = []  # the total known at each tick
    result = profile(
        ProfileConfig(model="tiny-llama", block_sizes=(1, 16), **SMALL),  # type: ignore[arg-type]
        tick=ticks.append,
    )
    n = points(ProfileConfig(block_sizes=(1, 16), **SMALL))  # type: ignore[arg-type]
    assert ticks[0] == n  # the warm-up pass over every point, then the timed passes
    assert result.timing is not None
    runs = [r for t in result.timing.points.values() for r in t.runs]
    assert len(runs) == n
    assert len(ticks) == ticks[-1] == n + sum(r for r in runs if r > 1)
    assert all(r in (1, result.timing.passes) for r in runs)
    assert MIN_PASSES <= result.timing.passes <= MAX_PASSES
    result.write(path)
    return path


def test_the_profile_is_of_the_model_and_round_trips(tiny_profile: Path) -> None:
    p = load_profile(tiny_profile)
    assert Profile.from_dict(json.loads(tiny_profile.read_text())) == p
    _, spec = resolve_model("tiny-llama", "float32")
    p.check_model(spec)
    assert p.block_sizes == (1, 16)
    assert p.layer_residual is not None  # the whole forwards were measured and fitted
    assert p.source["device"] == "cpu"
    assert {"torch", "numpy", "date", "platform", "clock"} <= set(p.source)
    for bs in (1, 16):
        cost = ProfiledCost(p, spec, bs)
        assert cost.step_time(cost_shape()) > 0


def cost_shape() -> Any:
    from pagedkv.engine.batch_shape import BatchShape

    return BatchShape.decode(4, 40)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"device": "tpu"}, "device"),
        ({"model": "no-such-model"}, "model"),
        ({"dtype": "int8"}, "dtype"),
        ({"block_sizes": ()}, "block_sizes"),
        ({"block_sizes": (16, 0)}, "block_size"),
        ({"block_sizes": (16, 16)}, "block_sizes"),
        ({"budget_s": 0}, "budget_s"),
        ({"threads": 0}, "threads"),
    ],
)
def test_profile_config_rejects(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        ProfileConfig(**kwargs)
    assert err.value.field == field


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without CUDA")
def test_cuda_without_a_gpu_is_one_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["profile", "--device", "cuda", "--out", str(tmp_path / "p.json")])
    assert code == 2
    assert capsys.readouterr().err.startswith("pagedkv: error: device")
    assert not (tmp_path / "p.json").exists()


FIDELITY_KEYS = ("throughput_error", "ttft_error", "tpot_error", "e2e_error")


@pytest.mark.parametrize(
    "flags",
    [
        [],
        ["--block-size", "1", "--request-rate", "200"],
        ["--num-gpu-blocks", "24", "--preemption-mode", "swap", "--max-output-len", "40"],
        ["--num-gpu-blocks", "24", "--max-output-len", "40"],  # recompute preemption
        ["--enable-chunked-prefill", "--max-num-batched-tokens", "256", "--enable-prefix-caching"],
        ["--shared-prefix-len", "32", "--enable-prefix-caching"],
    ],
)
def test_fidelity_runs_and_writes_its_keys(
    tiny_profile: Path, tmp_path: Path, flags: list[str]
) -> None:
    out = tmp_path / "fidelity.json"
    argv = ["fidelity", "--model", "tiny-llama", "--profile", str(tiny_profile)]
    assert main([*argv, "--num-requests", "6", *flags, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    for part in ("summary", "roofline", "operators"):  # the profile has a layer_residual
        s = data[part]
        assert s["step_error"]["median"] >= 0
        assert s["step_error"]["p90"] >= s["step_error"]["median"]
        assert all(isinstance(s[k], float) for k in FIDELITY_KEYS)
        assert s["iterations_real"] == data["real"]["iterations"] > 0
        assert s["iterations_sim"] > 0
    steps = data["steps"]  # every real step, its kind and both times
    assert len(steps) == data["real"]["iterations"]
    assert all(x["measured_s"] > 0 and x["profiled_s"] > 0 and x["chunks"] for x in steps)
    # every request finishes, so each block swapped out comes back in
    assert sum(x["swap_out"] for x in steps) == sum(x["swap_in"] for x in steps)
    if "swap" not in flags and "--enable-chunked-prefill" not in flags:
        # recompute: each preemption re-prefills its request once, in one chunk
        assert sum(x["recomputes"] for x in steps) == data["real"]["preemptions"]
    if "swap" in flags:
        assert sum(x["swap_out"] for x in steps) > 0


def test_fidelity_rejects_a_profile_of_another_model(
    tiny_profile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["fidelity", "--model", "small-llama", "--profile", str(tiny_profile)])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pagedkv: error: profile.model.")
    assert "\n" not in err
    with pytest.raises(ConfigError) as e:
        FidelityConfig(profile="")
    assert e.value.field == "profile"


def test_fidelity_rejects_an_unprofiled_block_size(tiny_profile: Path) -> None:
    code = main(["fidelity", "--profile", str(tiny_profile), "--block-size", "64"])
    assert code == 2


def test_profile_command_writes_a_loadable_file(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    argv = ["profile", "--model", "tiny-llama", "--block-size", "16", "32", "--out", str(out)]
    assert main([*argv, "--budget-s", "0.2", "--max-tokens", "16", "--max-seqs", "4"]) == 0
    assert load_profile(out).block_sizes == (16, 32)


def test_fidelity_reports_the_noise_floor_of_a_second_real_run(tiny_profile: Path) -> None:
    """All arrivals at t = 0: the second real run schedules what the first did, step for step,
    so every step is compared; its errors are real against real."""
    from pagedkv.tensors.fidelity import fidelity

    run = fidelity(
        FidelityConfig(
            model="tiny-llama",
            profile=str(tiny_profile),
            num_requests=5,
            num_gpu_blocks=24,
            preemption_mode="swap",
            repeats=2,
            noise_floor=True,
        )
    )
    noise = run["noise"]
    assert noise["iterations_agree"]
    assert noise["step_error"]["steps"] == noise["iterations_real"] == run["real"]["iterations"]
    assert noise["step_error"]["p90"] >= noise["step_error"]["median"] >= 0
    assert run["real_again"]["iterations"] == run["real"]["iterations"]
    assert all(isinstance(noise[k], float) for k in FIDELITY_KEYS)
    # every step ran alike, so each step record has the second run's time beside its own
    assert all(x["measured_again_s"] > 0 for x in run["steps"])


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"repeats": 0}, "repeats"),
        ({"noise_floor": 1}, "noise_floor"),
        ({"num_gpu_blocks": 5}, "num_gpu_blocks"),  # 80 slots; the longest request holds 191
        ({"num_gpu_blocks": 191, "block_size": 1, "max_output_len": 65}, "num_gpu_blocks"),
    ],
)
def test_fidelity_config_rejects(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        FidelityConfig(profile="p.json", **kwargs)
    assert err.value.field == field

"""num_gpu_blocks (usable blocks) and vLLM's num_gpu_blocks_override (all blocks, vLLM v1's
null block included): one relation, ``allocated_gpu_blocks``, for every policy."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.cli import main
from pagedkv.engine.policies import SCHEDULERS
from pagedkv.errors import ConfigError
from pagedkv.exits import EXIT_BAD_INPUT
from pagedkv.simulation import SimulationConfig, simulate

LESSON = {"workload": "lesson", "cost_model": "unit", "max_model_len": 256}


def _run(flat: dict[str, object]) -> dict[str, object]:
    result = simulate(SimulationConfig.from_flat({**LESSON, **flat})).to_dict()
    del result["config"]  # the two spellings differ there, and only there
    return result


@settings(max_examples=8, deadline=None)
@given(st.sampled_from(sorted(SCHEDULERS)), st.integers(20, 120))
def test_usable_blocks_and_the_override_are_one_pool(scheduler: str, usable: int) -> None:
    null = SCHEDULERS[scheduler].null_blocks
    by_usable = _run({"scheduler": scheduler, "num_gpu_blocks": usable})
    by_total = _run({"scheduler": scheduler, "num_gpu_blocks_override": usable + null})
    both = _run(
        {
            "scheduler": scheduler,
            "num_gpu_blocks": usable,
            "num_gpu_blocks_override": usable + null,
        }
    )
    assert json.dumps(by_usable, sort_keys=True) == json.dumps(by_total, sort_keys=True)
    assert json.dumps(both, sort_keys=True) == json.dumps(by_total, sort_keys=True)
    assert by_usable["summary"]["num_gpu_blocks"] == usable  # type: ignore[index]


def test_only_vllm_v1_keeps_a_null_block() -> None:
    assert SCHEDULERS["vllm-v1"].null_blocks == 1
    assert {SCHEDULERS[s].null_blocks for s in SCHEDULERS if s != "vllm-v1"} == {0}
    v1 = _run({"scheduler": "vllm-v1", "num_gpu_blocks_override": 100})
    v0 = _run({"scheduler": "vllm", "num_gpu_blocks_override": 100})
    assert (v1["summary"]["num_gpu_blocks"], v0["summary"]["num_gpu_blocks"]) == (99, 100)  # type: ignore[index]


@pytest.mark.parametrize(
    "flat",
    [
        {"scheduler": "vllm-v1", "num_gpu_blocks": 100, "num_gpu_blocks_override": 100},
        {"scheduler": "vllm", "num_gpu_blocks": 100, "num_gpu_blocks_override": 101},
        {"scheduler": "vllm-v1", "num_gpu_blocks_override": 1},
        {"num_gpu_blocks_override": 0},
    ],
)
def test_a_conflicting_or_empty_override_is_one_error(flat: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as info:
        SimulationConfig.from_flat({**LESSON, **flat})
    assert info.value.field == "num_gpu_blocks_override"


def test_the_cli_says_it_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--scheduler", "vllm-v1", "--num-gpu-blocks", "50"]
    assert main([*argv, "--num-gpu-blocks-override", "50", "--quiet"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert "num_gpu_blocks_override" in err
    assert "51" in err

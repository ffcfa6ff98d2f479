"""pagedkv.simulate and its flat, validated config."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest

from pagedkv.engine.metrics import request_record
from pagedkv.errors import ConfigError
from pagedkv.models.models import get_model
from pagedkv.simulation import FLAT_KEYS, SimulationConfig, build_engine, flat_help, simulate
from pagedkv.workloads.factory import make_workload

LESSON = {"workload": "lesson", "cost_model": "unit", "num_gpu_blocks": 100, "max_model_len": 256}


def test_lesson_through_the_api() -> None:
    result = simulate(SimulationConfig.from_flat(LESSON), check_integrity=True)
    s = result.summary
    assert s["finished"] == s["num_requests"] == 20
    assert not s["deadlocked"]
    assert s["num_gpu_blocks"] == 100
    assert len(result.requests) == 20
    assert result.requests_df().shape[0] == 20


@pytest.mark.parametrize("pinned", [False, True])
def test_records_are_each_requests_record_in_the_runs_order(pinned: bool) -> None:
    """simulate hands the workload over spec by spec and makes the records while letting the
    requests go: the same records as an engine built and run by hand, none lost."""
    flat = {"workload": "shared-prefix", "prefix_len": 64, "num_requests": 40, "request_rate": 8.0}
    cfg = SimulationConfig.from_flat({**flat, "enable_pinned_prefixes": pinned})
    run = build_engine(cfg).run()
    expected = [request_record(r) for r in run.requests]
    assert len(expected) == len(make_workload(cfg.workload)) == 40
    assert simulate(cfg).requests == expected


def test_the_collector_is_restored_after_a_run_and_after_a_failed_one(tmp_path: Path) -> None:
    simulate(SimulationConfig.from_flat(LESSON))
    assert gc.isenabled()
    bad = tmp_path / "trace.csv"
    bad.write_text("arrival_time,prompt_len,output_len\n0,10,x\n")
    cfg = SimulationConfig.from_flat({"workload": "trace", "trace_path": str(bad)})
    with pytest.raises(ConfigError):
        simulate(cfg)
    assert gc.isenabled()
    gc.disable()
    try:
        simulate(SimulationConfig.from_flat(LESSON))
        assert not gc.isenabled()  # a caller's own choice is kept too
    finally:
        gc.enable()


def test_same_config_gives_identical_json() -> None:
    cfg = SimulationConfig.from_flat(
        {"workload": "sharegpt-like", "num_requests": 60, "request_rate": 5.0, "seed": 3}
    )
    a = json.dumps(simulate(cfg).to_dict(), sort_keys=True)
    b = json.dumps(simulate(cfg).to_dict(), sort_keys=True)
    assert a == b
    other = SimulationConfig.from_flat(
        {"workload": "sharegpt-like", "num_requests": 60, "request_rate": 5.0, "seed": 4}
    )
    assert json.dumps(simulate(other).to_dict(), sort_keys=True) != a


def test_trace_steps_records_every_iteration() -> None:
    result = simulate(SimulationConfig.from_flat({**LESSON, "trace_steps": True}))
    assert len(result.steps) == result.summary["iterations"]
    assert result.steps_df().shape[0] == len(result.steps)
    for step in result.steps:
        allocated = step["token_states"] + step["reservation"] + step["internal_fragmentation"]
        assert step["token_states"] <= allocated


def test_defaults_follow_the_model() -> None:
    cfg = SimulationConfig.from_flat({"model": "Llama-2-7B"})
    assert cfg.scheduler.max_model_len == get_model("Llama-2-7B").max_model_len
    assert cfg.workload.max_model_len == cfg.scheduler.max_model_len


def test_a_rate_alone_means_poisson() -> None:
    cfg = SimulationConfig.from_flat({"workload": "alpaca-like", "request_rate": 2.0})
    assert cfg.workload.arrival is not None
    assert cfg.workload.arrival.value == "poisson"


@pytest.mark.parametrize(
    ("flat", "field"),
    [
        ({"no_such_option": 1}, "no_such_option"),
        ({"block_size": 0}, "block_size"),
        ({"scheduler": "fifo"}, "scheduler"),
        ({"model": "GPT-5"}, "model"),
        ({"gpu": "TPU"}, "gpu"),
        ({"cost_model": "exact"}, "cost_model"),
        ({"preemption_mode": "kill"}, "preemption_mode"),
        ({"reference": "yes"}, "reference"),
    ],
)
def test_bad_options_name_their_field(flat: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        SimulationConfig.from_flat(flat)
    assert info.value.field == field


def test_yaml_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("workload: lesson\ncost_model: unit\nnum_gpu_blocks: 100\nmax_model_len: 256\n")
    cfg = SimulationConfig.from_yaml(path, {"scheduler": "reserve"})
    assert cfg.scheduler.scheduler == "reserve"
    assert cfg.hardware.num_gpu_blocks == 100
    path.write_text("- just a list\n")
    with pytest.raises(ConfigError):
        SimulationConfig.from_yaml(path)


def test_flat_view_round_trips_and_is_documented() -> None:
    cfg = SimulationConfig.from_flat({**LESSON, "scheduler": "orca-pow2", "seed": 9})
    assert SimulationConfig.from_flat(cfg.to_flat()) == cfg
    helps = flat_help()
    assert set(FLAT_KEYS) <= set(helps)
    assert all(helps[k] for k in FLAT_KEYS)


@pytest.mark.parametrize("values", ["lesson", ["lesson"], None, 3])
def test_from_flat_wants_a_mapping(values: object) -> None:
    with pytest.raises(ConfigError, match=r"^config: got .*must be a mapping"):
        SimulationConfig.from_flat(values)  # type: ignore[arg-type]

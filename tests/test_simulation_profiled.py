"""``cost_model: profiled`` through pagedkv.simulate and the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pagedkv.cli import main
from pagedkv.errors import ConfigError
from pagedkv.models.models import get_model
from pagedkv.simulation import SimulationConfig, simulate
from tests.engine.profiles import profile_dict
from tests.engine.test_fast_forward import same


@pytest.fixture
def profile(tmp_path: Path) -> str:
    path = tmp_path / "opt13b.json"
    path.write_text(json.dumps(profile_dict(get_model("OPT-13B"), [16, 32], 4)))
    return str(path)


def flat(profile: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": "OPT-13B",
        "workload": "sharegpt-like",
        "num_requests": 60,
        "request_rate": 4.0,
        "cost_model": "profiled",
        "profile": profile,
        "preemption_mode": "swap",
        "num_gpu_blocks": 300,
        **extra,
    }


def test_fast_equals_reference_and_seconds_come_from_the_profile(profile: str) -> None:
    fast = simulate(SimulationConfig.from_flat(flat(profile)), check_integrity=True)
    ref = simulate(SimulationConfig.from_flat(flat(profile, reference=True)))
    same(fast.summary, ref.summary)
    same(fast.requests, ref.requests)
    roofline = {**flat(profile), "cost_model": "roofline", "profile": None}
    roof = simulate(SimulationConfig.from_flat(roofline))
    assert fast.summary["sim_time"] != roof.summary["sim_time"]


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"profile": None, "gpu": "L4"}, "profile"),  # no built-in profile of L4 x OPT-13B
        ({"cost_model": "roofline"}, "profile"),
        ({"block_size": 8}, "block_size"),
        ({"model": "OPT-66B"}, "profile.model.num_layers"),
        ({"profile": "no/such/file.json"}, "profile"),
    ],
)
def test_bad_profile_settings(profile: str, extra: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        SimulationConfig.from_flat({**flat(profile), **extra})
    assert err.value.field == field


def test_cli_flags(profile: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.json"
    argv = ["simulate", "--model", "OPT-13B", "--workload", "sharegpt-like"]
    argv += ["--num-requests", "20", "--cost-model", "profiled", "--quiet"]
    assert main([*argv, "--profile", profile, "--json", str(out)]) == 0
    assert json.loads(out.read_text())["config"]["profile"] == profile
    assert main([*argv, "--profile", profile, "--block-size", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pagedkv: error: block_size")
    assert "\n" not in err

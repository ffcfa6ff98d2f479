"""GPU presets against their datasheets, and a user's own GPU from a YAML file."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedkv.cli import main
from pagedkv.errors import ConfigError
from pagedkv.models.gpu_file import gpu_from_yaml
from pagedkv.models.gpus import GPUS, GiB, GPUSpec, get_gpu
from pagedkv.simulation import SimulationConfig, simulate

# name: (memory GiB, dense BF16 TFLOP/s, memory GB/s, PCIe GB/s one way, link GB/s one way)
DATASHEETS = {
    "A100-40GB": (40, 312, 1555, 32, 300),
    "A100-80GB": (80, 312, 2039, 32, 300),
    "H100-SXM": (80, 989, 3350, 64, 900 / 2),  # NVLink 4: 900 GB/s both ways
    "H100-PCIe": (80, 1513 // 2, 2000, 64, 600 / 2),  # 1,513 sparse, halved as SXM's
    "H200": (141, 989, 4800, 64, 450),
    "L4": (24, 242 / 2, 300, 32, None),
    "L40S": (48, 362.05, 864, 64 / 2, None),  # PCIe 4.0 x16: 64 GB/s both ways
    "A10": (24, 250 / 2, 600, 32, None),
    "MI300X": (192, 1307.4, 5300, 64, 7 * 128 / 2),  # 7 Infinity Fabric links x 128 GB/s
    "RTX-2070": (8, 29.9, 448, 15.75, None),
}


def test_every_preset_has_a_datasheet_row() -> None:
    assert set(GPUS) == set(DATASHEETS)


@pytest.mark.parametrize("name", sorted(DATASHEETS))
def test_preset_matches_its_datasheet(name: str) -> None:
    gib, tflops, mem, pcie, link = DATASHEETS[name]
    gpu = GPUS[name]
    assert gpu.memory_bytes == gib * GiB
    assert gpu.bf16_flops == pytest.approx(tflops * 1e12)
    assert gpu.mem_bandwidth == pytest.approx(mem * 1e9)
    assert gpu.pcie_bandwidth == pytest.approx(pcie * 1e9)
    if link is None:
        assert gpu.interconnect_bandwidth is None
    else:
        assert gpu.interconnect_bandwidth == pytest.approx(link * 1e9)


L40S_YAML = """\
name: my-l40s
memory_gib: 48
bf16_tflops: 362.05
memory_bandwidth_gb_s: 864
pcie_bandwidth_gb_s: 32
"""


def _write(tmp_path: Path, text: str, name: str = "gpu.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_gpu_yaml_restating_a_preset_is_that_preset(tmp_path: Path) -> None:
    path = _write(tmp_path, L40S_YAML)
    assert gpu_from_yaml(path) == GPUSpec("my-l40s", 48 * GiB, 362.05e12, 864e9, 32e9)
    assert get_gpu(str(path)) == gpu_from_yaml(path)
    nvlink = _write(tmp_path, L40S_YAML + "interconnect_bandwidth_gb_s: 300\n", "link.yml")
    assert gpu_from_yaml(nvlink).peer_bandwidth == 300e9
    unnamed = _write(tmp_path, L40S_YAML.replace("name: my-l40s\n", ""), "box.yaml")
    assert gpu_from_yaml(unnamed).name == "box"


def test_simulating_on_a_gpu_file_equals_the_preset(tmp_path: Path) -> None:
    path = _write(tmp_path, L40S_YAML)
    flat = {"model": "Llama-3-8B", "workload": "sharegpt-like", "num_requests": 30}
    preset = simulate(SimulationConfig.from_flat({**flat, "gpu": "L40S"}))
    own = simulate(SimulationConfig.from_flat({**flat, "gpu": str(path)}))
    assert own.summary == preset.summary


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (L40S_YAML.replace("memory_gib: 48\n", ""), "gpu.memory_gib"),
        (L40S_YAML.replace("864", "-864"), "gpu.memory_bandwidth_gb_s"),
        (L40S_YAML.replace("362.05", "fast"), "gpu.bf16_tflops"),
        (
            L40S_YAML.replace("pcie_bandwidth_gb_s: 32", "pcie_bandwidth_gb_s: .inf"),
            "gpu.pcie_bandwidth_gb_s",
        ),
        (L40S_YAML + "interconnect_bandwidth_gb_s: 0\n", "gpu.interconnect_bandwidth_gb_s"),
        (L40S_YAML + "fp8_tflops: 733\n", "gpu.fp8_tflops"),
        (L40S_YAML.replace("name: my-l40s", "name: 7"), "gpu.name"),
        ("- 48\n- 362\n", "gpu"),
        ("memory_gib: [48\n", "gpu"),
    ],
)
def test_bad_gpu_yaml(tmp_path: Path, text: str, field: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        gpu_from_yaml(path)
    assert info.value.field == field
    assert "\n" not in str(info.value)


def test_missing_gpu_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="no such file") as info:
        get_gpu(str(missing))
    assert info.value.field == "gpu"
    assert main(["simulate", "--gpu", str(missing), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("pagedkv: error: gpu:")
    with pytest.raises(ConfigError, match=r"or a GPU \.yaml file"):
        get_gpu("V100")


def test_cli_runs_on_a_gpu_file(tmp_path: Path) -> None:
    path = _write(tmp_path, L40S_YAML)
    assert main(["simulate", "--gpu", str(path), "--model", "Llama-3-8B", "--quiet"]) == 0


def test_a_plan_takes_gpu_files_as_candidates(tmp_path: Path) -> None:
    from pagedkv.sweep.plan_spec import PlanSpec

    path = _write(tmp_path, L40S_YAML)
    spec = PlanSpec.from_dict(
        {"model": "Llama-3-8B", "gpus": {str(path): 1.2, "L40S": 1.0}, "slo": {"ttft_p99": 2.0}}
    )
    assert [c.gpu for c in spec.candidates()] == [str(path), "L40S"]

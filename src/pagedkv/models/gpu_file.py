"""A user's own GPU from a YAML file: its datasheet's peaks in the units datasheets use.

```yaml
name: my-gpu                      # optional; the file's stem otherwise
memory_gib: 48                    # device memory, GiB (a vendor's "48GB", see gpus.py)
bf16_tflops: 362                  # dense 16-bit tensor peak, TFLOP/s (no sparsity)
memory_bandwidth_gb_s: 864        # device memory bandwidth, GB/s
pcie_bandwidth_gb_s: 32           # host <-> device, one direction, GB/s
interconnect_bandwidth_gb_s: 300  # optional: GPU <-> GPU, one direction, GB/s; absent: PCIe
```

Every key is checked; a bad one is one ConfigError naming ``gpu.<key>`` and the file.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pagedkv.errors import ConfigError
from pagedkv.models.gpus import GiB, GPUSpec
from pagedkv.validation import read_yaml

REQUIRED = ("memory_gib", "bf16_tflops", "memory_bandwidth_gb_s", "pcie_bandwidth_gb_s")
OPTIONAL = ("name", "interconnect_bandwidth_gb_s")


def _number(key: str, value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"gpu.{key}", value, f"must be a finite number > 0{where}")
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"gpu.{key}", value, f"must be a finite number > 0{where}")
    return float(value)


def gpu_from_yaml(path: str | Path) -> GPUSpec:
    """Read a GPU YAML file (see the module docstring) into a GPUSpec."""
    file = Path(path)
    where = f" (in {file})"
    data = read_yaml("gpu", file)  # missing, not UTF-8, bad YAML: one error naming the line
    if not isinstance(data, dict):
        raise ConfigError("gpu", str(path), "must be a YAML mapping of GPU keys")
    for key in data:
        if key not in REQUIRED + OPTIONAL:
            allowed = ", ".join(REQUIRED + OPTIONAL)
            raise ConfigError(f"gpu.{key}", data[key], f"is not a GPU key ({allowed}){where}")
    for key in REQUIRED:
        if data.get(key) is None:
            raise ConfigError(f"gpu.{key}", None, f"is missing{where}")
    name = data.get("name", file.stem)
    if not isinstance(name, str) or not name:
        raise ConfigError("gpu.name", name, f"must be a non-empty string{where}")
    values = {key: _number(key, data[key], where) for key in REQUIRED}
    link = data.get("interconnect_bandwidth_gb_s")
    memory = values["memory_gib"] * GiB
    if memory < 1:
        raise ConfigError("gpu.memory_gib", data["memory_gib"], f"must be at least 1 byte{where}")
    return GPUSpec(
        name=name,
        memory_bytes=int(memory),
        bf16_flops=values["bf16_tflops"] * 1e12,
        mem_bandwidth=values["memory_bandwidth_gb_s"] * 1e9,
        pcie_bandwidth=values["pcie_bandwidth_gb_s"] * 1e9,
        interconnect_bandwidth=None
        if link is None
        else _number("interconnect_bandwidth_gb_s", link, where) * 1e9,
    )

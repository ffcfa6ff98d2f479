"""GPU presets: each accelerator's datasheet peaks (memory, FLOP/s, bandwidths), looked up by name.

Kept apart from the model shapes (``models.py``) and the KV sizing that combines the two
(``capacity.py``): a GPU is hardware only; the roofline cost model and the capacity both read it.

Memory sizes are binary: a vendor's "40GB" of HBM is 40 GiB (``nvidia-smi`` shows 40960 MiB on
an A100-40GB), and the vLLM paper's Table 1 (arXiv 2309.06180) only comes out with GiB:
OPT-13B on one A100-40GB, 0.9 x 40 GiB - 26 GB of weights = 12 GiB of KV = 15.7K slots of 800 KiB.
Bandwidths and FLOP/s are decimal, as datasheets give them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pagedkv.errors import ConfigError
from pagedkv.validation import check_int

GiB = 2**30


def check_positive(field: str, value: object) -> float:
    """``value`` must be a finite real number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, value, "must be a finite number > 0")
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(field, value, "must be a finite number > 0")
    return float(value)


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator, from its vendor datasheet (peak numbers; efficiencies live elsewhere)."""

    name: str
    memory_bytes: int
    """Device memory in bytes (binary GiB, see the module docstring)."""
    bf16_flops: float
    """Dense (no sparsity) 16-bit tensor-core peak, FLOP/s."""
    mem_bandwidth: float
    """Device memory bandwidth, bytes/s."""
    pcie_bandwidth: float
    """Host <-> device bandwidth in one direction, bytes/s (what a swap uses)."""
    interconnect_bandwidth: float | None = None
    """GPU <-> GPU bandwidth in one direction (NVLink), bytes/s; None: over PCIe."""

    def __post_init__(self) -> None:
        check_int("memory_bytes", self.memory_bytes, 1)
        for field in ("bf16_flops", "mem_bandwidth", "pcie_bandwidth"):
            check_positive(field, getattr(self, field))
        if self.interconnect_bandwidth is not None:
            check_positive("interconnect_bandwidth", self.interconnect_bandwidth)

    @property
    def peer_bandwidth(self) -> float:
        """Bandwidth a tensor-parallel all-reduce runs at: NVLink if present, else PCIe."""
        return self.interconnect_bandwidth or self.pcie_bandwidth


_PCIE4 = 32e9  # PCIe 4.0 x16: 64 GB/s both ways (NVIDIA datasheets), 32 GB/s each way
_PCIE5 = 64e9  # PCIe 5.0 x16: 128 GB/s both ways, 64 GB/s each way
GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        # NVIDIA A100 datasheet (2021): 312 TFLOPS BF16 dense; 1,555 GB/s HBM2 (40GB SXM),
        # 2,039 GB/s HBM2e (80GB SXM); NVLink 3: 600 GB/s both ways.
        GPUSpec("A100-40GB", 40 * GiB, 312e12, 1.555e12, _PCIE4, 300e9),
        GPUSpec("A100-80GB", 80 * GiB, 312e12, 2.039e12, _PCIE4, 300e9),
        # NVIDIA H100 datasheet: SXM5 989 TFLOPS BF16 dense (1,979 with sparsity), 3.35 TB/s
        # HBM3; NVLink 4: 900 GB/s both ways.
        GPUSpec("H100-SXM", 80 * GiB, 989e12, 3.35e12, _PCIE5, 450e9),
        # NVIDIA H200 datasheet: 141 GB HBM3e at 4.8 TB/s, H100's compute and NVLink.
        GPUSpec("H200", 141 * GiB, 989e12, 4.8e12, _PCIE5, 450e9),
        # NVIDIA L4 datasheet: 24 GB GDDR6 at 300 GB/s, 121 TFLOPS BF16 dense (242 sparse),
        # PCIe 4.0 x16, no NVLink.
        GPUSpec("L4", 24 * GiB, 121e12, 300e9, _PCIE4),
        # NVIDIA Turing whitepaper (Appendix A): RTX 2070, 8 GB GDDR6 at 448 GB/s, PCIe 3.0 x16
        # (15.75 GB/s each way), no NVLink. Turing has no BF16: this is the FP16 tensor peak with
        # FP32 accumulate (29.9 TFLOPS, half the FP16-accumulate rate on GeForce), as cuBLAS
        # accumulates 16-bit GEMMs in FP32.
        GPUSpec("RTX-2070", 8 * GiB, 29.9e12, 448e9, 15.75e9),
        # NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100), PCIe column: 80 GB HBM2e
        # at 2 TB/s, 756 TFLOPS BF16 dense (1,513 with sparsity), PCIe 5.0 x16, NVLink bridge
        # 600 GB/s both ways.
        GPUSpec("H100-PCIe", 80 * GiB, 756e12, 2.0e12, _PCIE5, 300e9),
        # NVIDIA L40S datasheet (nvidia.com/en-us/data-center/l40s): 48 GB GDDR6 at 864 GB/s,
        # 362.05 TFLOPS BF16 dense (733 sparse), PCIe 4.0 x16 (64 GB/s both ways), no NVLink.
        GPUSpec("L40S", 48 * GiB, 362.05e12, 864e9, _PCIE4),
        # NVIDIA A10 datasheet (nvidia.com/en-us/data-center/products/a10-gpu): 24 GB GDDR6 at
        # 600 GB/s, 125 TFLOPS BF16 dense (250 sparse), PCIe 4.0 x16, no NVLink.
        GPUSpec("A10", 24 * GiB, 125e12, 600e9, _PCIE4),
        # AMD Instinct MI300X datasheet (amd.com/en/products/accelerators/instinct/mi300/mi300x):
        # 192 GB HBM3 at 5.3 TB/s, 1,307.4 TFLOPS BF16 dense (2,614.9 sparse), PCIe 5.0 x16;
        # Infinity Fabric: 7 links x 128 GB/s both ways to the other 7 GPUs of a platform
        # = 896 GB/s, 448 GB/s each way.
        GPUSpec("MI300X", 192 * GiB, 1307.4e12, 5.3e12, _PCIE5, 448e9),
    )
}


def get_gpu(name: str) -> GPUSpec:
    """A preset GPU by name (case-insensitive), or a GPU YAML file (``gpu_file.py``)."""
    for key, gpu in GPUS.items():
        if key.lower() == str(name).lower():
            return gpu
    if str(name).endswith((".yaml", ".yml")):
        from pagedkv.models.gpu_file import gpu_from_yaml

        return gpu_from_yaml(name)
    raise ConfigError("gpu", name, "must be one of " + ", ".join(GPUS) + ", or a GPU .yaml file")

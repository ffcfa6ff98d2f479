"""The fixed parts of the experiments: the paper's first setup and the two workloads.

Defaults (issue 4): OPT-13B on one A100-40GB (the vLLM paper's Table 1 setup, ~15.6K token
slots), the roofline cost model, block size 16. ShareGPT-like and Alpaca-like lengths follow
the paper's means (Kwon et al. 2023, §6.1); arrivals are Poisson.
"""

from __future__ import annotations

from typing import Any

MODEL = "OPT-13B"
GPU = "A100-40GB"
WORKLOADS = ("sharegpt-like", "alpaca-like")
HARDWARE: dict[str, Any] = {
    "model": MODEL,
    "gpu": GPU,
    "cost_model": "roofline",
    "block_size": 16,
}


def flat(
    workload: str, num_requests: int, rate: float | None = None, **extra: Any
) -> dict[str, Any]:
    """A complete flat config: the hardware defaults, the workload, Poisson arrivals at
    ``rate`` requests/s (None: all at t = 0), and ``extra`` keys on top."""
    out: dict[str, Any] = {**HARDWARE, "workload": workload, "num_requests": num_requests}
    if rate is not None:
        out["request_rate"] = rate
    return {**out, **extra}


COST_MODEL = HARDWARE["cost_model"]
"""The clock of every experiment here: ``pagedkv.engine.cost_model``'s roofline (GPU x model)."""


def time_model(why: str) -> str:
    """The note an experiment or claim carries when its figures need a time model (rates,
    latencies, throughput): which cost model, and why it matters."""
    return f"needs a time model: the {COST_MODEL} cost model (pagedkv.engine.cost_model); {why}"


def setup(**extra: Any) -> dict[str, Any]:
    """The fixed part of an experiment's ``setup`` record."""
    return {"model": MODEL, "gpu": GPU, "cost_model": "roofline", **extra}

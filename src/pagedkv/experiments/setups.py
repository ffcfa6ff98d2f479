"""The fixed parts of the experiments: the paper's first setup and the two workloads.

Defaults (issue 4): OPT-13B on one A100-40GB (the vLLM paper's Table 1 setup, ~15.6K token
slots), the roofline cost model (``pagedkv experiment NAME --cost-model profiled [--profile P]``
prices every run with a profile instead: ``with_clock``), block size 16. ShareGPT-like and
Alpaca-like lengths follow the paper's means (Kwon et al. 2023, §6.1); arrivals are Poisson.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pagedkv.simulation import SimulationConfig

if TYPE_CHECKING:
    from pagedkv.experiments.framework import ExperimentResult, Plan

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


def with_clock(plan: Plan, cost_model: str | None, profile: str | None = None) -> Plan:
    """``plan`` priced by another clock: every point's ``cost_model`` (and ``profile``) replaced,
    and the setup record saying so. ``profile`` alone implies ``cost_model`` 'profiled'; a
    profiled clock without a profile takes the built-in of the setup's GPU x model
    (``pagedkv.profiles``). Every point is validated before any runs (a bad profile, or one
    without a point's block size, is one ConfigError)."""
    if cost_model is None and profile is None:
        return plan
    clock: dict[str, Any] = {"cost_model": cost_model or "profiled"}
    if profile is not None:
        clock["profile"] = profile
    points = [replace(p, flat={**p.flat, **clock}) for p in plan.points]
    checked: dict[Any, str | None] = {}
    for p in points:
        key = tuple(sorted((k, repr(v)) for k, v in p.flat.items() if k != "seed"))
        if key not in checked:
            checked[key] = SimulationConfig.from_flat(dict(p.flat)).hardware.profile
    profiles = sorted({v for v in checked.values() if v is not None})
    setup = {**plan.setup, "cost_model": clock["cost_model"]}
    if profiles:
        setup["profile"] = profiles[0] if len(profiles) == 1 else profiles
    return replace(plan, setup=setup, points=points)


def clock_of(result: ExperimentResult, plan: Plan) -> Plan:
    """``plan`` (runs an experiment adds after its grid) on the clock ``result``'s grid ran on."""
    profile = result.setup.get("profile")
    return with_clock(
        plan, result.setup["cost_model"], profile if isinstance(profile, str) else None
    )

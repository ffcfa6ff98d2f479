"""The raw columns an experiment may take from one run's summary, with their units.

Each is read from ``SimulationResult.summary`` (DESIGN.md's definitions, computed once in
``pagedkv.engine.metrics``); nothing here combines metrics into a score. Memory categories stay
apart: ``token_states`` .. ``free`` are shares of the capacity C, ``token_utilization`` is token
states / allocated slots and ``pool_occupancy`` allocated / C. ``waste`` is the one sum, and it
is the vLLM paper's own definition of wasted KV memory (Fig. 2): reservation + internal +
external fragmentation, as a share of C.

Two denominators for the waste, reported side by side: ``waste`` (share of C: idle free slots
are in the denominator, not the waste) and ``waste_of_used`` = waste / (1 - free) (share of the
memory not idle: allocated + external fragmentation). The paper's Fig. 2 bars are shares of the
whole KV cache that sum to 100% with no idle category ("External frag. & Others"), i.e. they
are measured with memory bound; there both denominators agree. ``waste_with_idle`` =
1 - token_states counts idle slots as waste too (the bar's complement as drawn).

Two accounting conventions for a buddy allocator's rounding (``pagedkv.memory.usage``): the
categories above use the slot convention (rounding is internal fragmentation);
``*_allocator_convention`` move ``allocator_rounding`` to external fragmentation, as the paper's
Fig. 2 does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

Summary = Mapping[str, Any]


def _latency(name: str, stat: str) -> Callable[[Summary], float | None]:
    def read(s: Summary) -> float | None:
        block = s[name]
        return None if block is None else float(block[stat])

    return read


def _memory(name: str) -> Callable[[Summary], float | None]:
    def read(s: Summary) -> float | None:
        value = s["memory"][name]  # None: token utilization of a run that held nothing
        return None if value is None else float(value)

    return read


def _waste_of_used(m: Mapping[str, Any]) -> float | None:
    """(reservation + internal + external) / (1 - free); None when memory was idle throughout."""
    used = 1.0 - float(m["free"])
    waste = m["reservation"] + m["internal_fragmentation"] + m["external_fragmentation"]
    return float(waste) / used if used > 0 else None


METRICS: dict[str, tuple[Callable[[Summary], Any], str]] = {
    "finished": (lambda s: int(s["finished"]), "requests"),
    "deadlocked": (lambda s: int(bool(s["deadlocked"])), "0/1"),
    "iterations": (lambda s: int(s["iterations"]), "iterations"),
    "sim_time": (lambda s: float(s["sim_time"]), "s"),
    "request_throughput": (lambda s: float(s["request_throughput"]), "requests/s"),
    "output_token_throughput": (lambda s: float(s["output_token_throughput"]), "tokens/s"),
    "max_running": (lambda s: int(s["max_running"]), "requests"),
    "mean_running": (lambda s: float(s["mean_running"]), "requests"),
    "mean_batch_size": (lambda s: float(s["mean_batch_size"]), "requests"),
    "preemptions": (lambda s: int(s["preemptions"]), "preemptions"),
    "swap_outs": (lambda s: int(s["swap_outs"]), "swap-outs"),
    "recomputed_tokens": (lambda s: int(s["recomputed_tokens"]), "tokens"),
    "norm_latency_mean": (_latency("normalized_latency", "mean"), "s/token"),
    "norm_latency_p99": (_latency("normalized_latency", "p99"), "s/token"),
    "e2e_mean": (_latency("e2e", "mean"), "s"),
    "e2e_p99": (_latency("e2e", "p99"), "s"),
    "ttft_p99": (_latency("ttft", "p99"), "s"),
    "token_states": (_memory("token_states"), "share of C"),
    "reservation": (_memory("reservation"), "share of C"),
    "internal_fragmentation": (_memory("internal_fragmentation"), "share of C"),
    "external_fragmentation": (_memory("external_fragmentation"), "share of C"),
    "free": (_memory("free"), "share of C"),
    "token_utilization": (_memory("token_utilization"), "token states / allocated"),
    "pool_occupancy": (_memory("pool_occupancy"), "allocated / C"),
    "waste": (
        lambda s: float(
            s["memory"]["reservation"]
            + s["memory"]["internal_fragmentation"]
            + s["memory"]["external_fragmentation"]
        ),
        "share of C",
    ),
    "num_gpu_blocks": (lambda s: int(s["num_gpu_blocks"]), "blocks"),
    "allocator_rounding": (_memory("allocator_rounding"), "share of C"),
    "internal_fragmentation_allocator_convention": (
        lambda s: float(s["memory"]["internal_fragmentation"] - s["memory"]["allocator_rounding"]),
        "share of C",
    ),
    "external_fragmentation_allocator_convention": (
        lambda s: float(s["memory"]["external_fragmentation"] + s["memory"]["allocator_rounding"]),
        "share of C",
    ),
    "waste_of_used": (lambda s: _waste_of_used(s["memory"]), "share of memory in use"),
    "waste_with_idle": (lambda s: 1.0 - float(s["memory"]["token_states"]), "share of C"),
}
CATEGORIES = (
    "token_states",
    "reservation",
    "internal_fragmentation",
    "external_fragmentation",
    "free",
)


SHARE_UNITS = frozenset(
    {
        "0/1",
        "share of C",
        "token states / allocated",
        "allocated / C",
        "share of memory in use",
        "hit / looked-up tokens",
        "saved / needed without sharing",
    }
)
"""The units of the metrics that are shares of a whole (or 0/1 flags, whose mean is a share)."""


def bounds(name: str) -> tuple[float | None, float | None]:
    """A metric's physical bounds, read from its unit: a share lies in [0, 1]; every other
    metric here is a count, a time, a rate or a size, never negative. A name this module does
    not define (a column an experiment computes itself) is unbounded: (None, None)."""
    if name not in METRICS:
        return None, None
    return (0.0, 1.0) if unit(name) in SHARE_UNITS else (0.0, None)


def read_metrics(summary: Summary, names: Sequence[str]) -> dict[str, Any]:
    """The named metrics of one run, as raw values."""
    return {n: METRICS[n][0](summary) for n in names}


def unit(name: str) -> str:
    return METRICS[name][1]


def axis_label(name: str) -> str:
    """'request throughput (requests/s)': a metric's name with its unit, for an axis."""
    return f"{name.replace('_', ' ')} ({unit(name)})"

"""Every serving metric, defined once, computed from raw per-request and per-step counters.

Per request (simulated time):
    TTFT = first token - arrival;  E2E = finish - arrival;
    TPOT = (finish - first token) / (output tokens - 1)   (requests with >= 2 output tokens);
    normalized latency = E2E / output tokens  (the vLLM paper's metric).
Per run:
    request throughput = finished / sim_time;  output token throughput = output tokens / sim_time;
    max_running = most requests running at once (capacity, not throughput);
    mean_running = running requests per iteration, averaged over iterations;
    memory categories (pagedkv.memory.usage) averaged over iterations weighted by their duration,
    as fractions of the capacity C; token utilization = token states / allocated slots, and
    None (JSON null, "n/a" in a table) for a run that never allocated a slot (all rejected, or
    no requests): 0/0 has no value, and 100% would claim a perfect use of nothing;
    ``allocator_rounding`` as a fraction of C too (the part of the internal fragmentation a
    buddy allocator's rounding adds: the other accounting convention).
The totals are integers (ticks; ticks x slots, ``clock.py``); an average is one true division
of two ints (correctly rounded), so equal totals give the very same floats.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from pagedkv.engine.request import Request, RequestStatus

CATEGORIES = (
    "token_states",
    "reservation",
    "internal_fragmentation",
    "external_fragmentation",
    "free",
)


@dataclass(frozen=True)
class StepRecord:
    """One iteration (kept only with ``trace_steps``); memory in token slots."""

    index: int
    start_time: float
    duration: float
    num_running: int
    num_waiting: int
    num_swapped: int
    num_batched_tokens: int
    num_batched_seqs: int
    token_states: int
    reservation: int
    internal_fragmentation: int
    external_fragmentation: int
    free: int


@dataclass
class StepTotals:
    """Running sums over iterations, enough for every per-run metric (written only by the
    engine's ``Ledger``, a span of rounds at a time). Time in ticks (``clock.py``), the
    integrals in ticks x slots (or blocks)."""

    iterations: int = 0
    busy_time: int = 0
    max_running: int = 0
    sum_running: int = 0
    sum_batched_seqs: int = 0
    preemptions: int = 0
    swap_outs: int = 0
    swapped_blocks: int = 0
    weighted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    weighted_saved_blocks: int = 0  # time integral of blocks_saved_by_sharing
    weighted_rounding: int = 0  # time integral of MemoryUsage.allocator_rounding


def _stats(values: npt.NDArray[np.float64]) -> dict[str, float] | None:
    if not len(values):
        return None
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {
        "mean": float(values.mean()),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
    }


def request_record(r: Request) -> dict[str, Any]:
    """One request's record (an element of ``pagedkv simulate --json``'s ``requests``)."""
    return {
        "request_id": r.request_id,
        "status": r.status.value,
        "arrival_time": r.arrival_time,
        "prompt_len": r.prompt_len,
        "output_len": r.output_len,
        "admitted_time": r.admitted_time,
        "first_token_time": r.first_token_time,
        "finish_time": r.finish_time,
        "preemptions": r.num_preemptions,
        "swaps": r.num_swaps,
        "recomputed_tokens": r.num_recomputed_tokens,
        "reject_reason": r.reject_reason,
    }


def summarize(
    requests: list[Request], totals: StepTotals, sim_time: float, capacity: int
) -> dict[str, Any]:
    """The run's summary (the ``summary`` object of ``pagedkv simulate --json``)."""
    done = [r for r in requests if r.status is RequestStatus.FINISHED]
    # Columns of the finished requests, the per-request formulas applied to whole arrays
    # (float64 arithmetic, so each value is the one Python's floats would give; a finished
    # request always has its times: a None would fail here, loudly).
    n = len(done)
    arrival = np.fromiter((r.arrival_time for r in done), np.float64, n)
    first = np.fromiter((r.first_token_time for r in done), np.float64, n)
    finish = np.fromiter((r.finish_time for r in done), np.float64, n)
    outputs = np.fromiter((r.output_len for r in done), np.int64, n)
    e2e = finish - arrival
    several = outputs > 1
    tpot = (finish[several] - first[several]) / (outputs[several] - 1)
    # The integral of C over the busy time; where it is 0 so is every integral (0 / 1 = 0.0).
    whole = totals.busy_time * capacity or 1
    shares = {name: totals.weighted[name] / whole for name in CATEGORIES}
    allocated = shares["token_states"] + shares["reservation"] + shares["internal_fragmentation"]
    memory: dict[str, float | None] = dict(shares)
    memory["token_utilization"] = shares["token_states"] / allocated if allocated else None
    memory["pool_occupancy"] = allocated
    memory["allocator_rounding"] = totals.weighted_rounding / whole
    output_tokens = int(outputs.sum())
    iterations = totals.iterations or 1  # no iteration: the sums are 0 too
    return {
        "num_requests": len(requests),
        "finished": len(done),
        "rejected": sum(r.status is RequestStatus.REJECTED for r in requests),
        "sim_time": sim_time,
        "iterations": totals.iterations,
        "request_throughput": len(done) / sim_time if sim_time else 0.0,
        "output_token_throughput": output_tokens / sim_time if sim_time else 0.0,
        "max_running": totals.max_running,
        "mean_running": totals.sum_running / iterations,
        "mean_batch_size": totals.sum_batched_seqs / iterations,
        "preemptions": totals.preemptions,
        "swap_outs": totals.swap_outs,
        "swapped_blocks": totals.swapped_blocks,
        "recomputed_tokens": sum(r.num_recomputed_tokens for r in requests),
        "ttft": _stats(first - arrival),
        "tpot": _stats(tpot),
        "e2e": _stats(e2e),
        "normalized_latency": _stats(e2e / outputs),
        "memory": memory,
    }

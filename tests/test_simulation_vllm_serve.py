"""vllm bench serve's client options on a simulated run: --request-rate inf, --burstiness (the
gamma shape) and --max-concurrency (a closed-loop cap on requests in flight)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.errors import ConfigError
from pagedkv.simulation import SimulationConfig, simulate
from pagedkv.workloads.arrivals import Arrival
from pagedkv.workloads.factory import make_workload

RANDOM = {
    "workload": "random",
    "num_prompts": 40,
    "random_input_len": 64,
    "random_output_len": 24,
    "random_range_ratio": 0.5,
    "cost_model": "unit",
    "num_gpu_blocks": 120,
    "max_model_len": 256,
}


def test_an_infinite_rate_is_all_at_once() -> None:
    assert SimulationConfig.from_flat({**RANDOM, "request_rate": float("inf")}) == (
        SimulationConfig.from_flat(RANDOM)
    )
    assert SimulationConfig.from_flat({**RANDOM, "request_rate": "inf"}) == (
        SimulationConfig.from_flat(RANDOM)
    )
    trace = SimulationConfig.from_flat(
        {"workload": "trace", "trace_path": "t.jsonl", "request_rate": float("inf")}
    ).workload
    assert (trace.arrival, trace.request_rate) == (Arrival.ALL_AT_ONCE, None)
    with pytest.raises(ConfigError) as info:
        SimulationConfig.from_flat({**RANDOM, "arrival": "gamma", "request_rate": "inf"})
    assert info.value.field == "request_rate"


def test_a_rate_with_a_burstiness_is_gamma_of_that_shape() -> None:
    bursty = SimulationConfig.from_flat({**RANDOM, "request_rate": 4.0, "burstiness": 0.25})
    assert bursty.workload.arrival is Arrival.GAMMA
    assert bursty.workload.burstiness == 0.25
    plain = SimulationConfig.from_flat({**RANDOM, "request_rate": 4.0})
    assert plain.workload.arrival is Arrival.POISSON
    assert plain.workload.burstiness == 1.0  # vLLM's default
    with pytest.raises(ConfigError) as info:
        SimulationConfig.from_flat({**RANDOM, "burstiness": 0.5})  # no rate: all at once
    assert info.value.field == "burstiness"


def _sent_and_done(flat: dict[str, object]) -> tuple[list[float], list[dict[str, Any]]]:
    config = SimulationConfig.from_flat(flat)
    arrivals = [r.arrival_time for r in make_workload(config.workload)]
    return arrivals, simulate(config, check_integrity=True).requests


@settings(max_examples=20, deadline=None)
@given(
    st.integers(1, 12),
    st.sampled_from(["vllm", "vllm-v1", "orca-max", "static"]),
    st.sampled_from([None, 0.5, 5.0]),
    st.integers(0, 1000),
)
def test_never_more_in_flight_than_the_cap(
    cap: int, scheduler: str, rate: float | None, seed: int
) -> None:
    flat = {**RANDOM, "scheduler": scheduler, "seed": seed, "max_concurrency": cap}
    if rate is not None:
        flat["request_rate"] = rate
    arrivals, records = _sent_and_done(flat)
    served = [r for r in records if r["finish_time"] is not None]
    assert len(served) == len(records)  # every request fits this pool
    events = sorted(
        [(r["finish_time"], -1) for r in served] + [(r["arrival_time"], 1) for r in served]
    )  # at equal times an end frees its slot before a send takes it
    in_flight = peak = 0
    for _, step in events:
        in_flight += step
        peak = max(peak, in_flight)
    assert peak <= cap
    finishes = {r["finish_time"] for r in served}
    sends = [r["arrival_time"] for r in sorted(records, key=lambda r: r["request_id"])]
    assert sends == sorted(sends)  # first come, first sent
    for sent, arrived in zip(sends, arrivals, strict=True):
        assert sent >= arrived
        if sent > arrived:  # it waited: it was sent the moment a request in flight ended
            assert sent in finishes


@pytest.mark.parametrize("scheduler", ["vllm", "vllm-v1"])
def test_a_cap_above_the_requests_changes_nothing(scheduler: str) -> None:
    flat = {**RANDOM, "scheduler": scheduler, "request_rate": 2.0, "reference": True}
    free = simulate(SimulationConfig.from_flat(flat)).to_dict()
    capped = simulate(SimulationConfig.from_flat({**flat, "max_concurrency": 40})).to_dict()
    del free["config"], capped["config"]
    assert json.dumps(free, sort_keys=True) == json.dumps(capped, sort_keys=True)


def test_a_cap_of_one_serves_one_request_at_a_time() -> None:
    _, records = _sent_and_done({**RANDOM, "num_prompts": 10, "max_concurrency": 1})
    records.sort(key=lambda r: r["request_id"])
    for before, after in itertools.pairwise(records):
        assert after["arrival_time"] == before["finish_time"]

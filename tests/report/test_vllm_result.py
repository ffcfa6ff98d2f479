"""vllm bench serve's result file: every key and unit against a run worked out by hand."""

from __future__ import annotations

import math
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given

from pagedkv.engine.cost_model import UnitCost
from pagedkv.engine.metrics import request_record
from pagedkv.errors import ConfigError
from pagedkv.report.vllm_result import (
    METRICS,
    VllmResultConfig,
    simulation_vllm_result,
    vllm_result,
)
from pagedkv.workloads.spec import RequestSpec
from tests.factories import make_engine

# Unit clock (1 s a step), vllm policy. Request 0 (prompt 2, 3 outputs) arrives at 0, request 1
# (prompt 2, 2 outputs) at 1.5. Steps: [0,1] prefill 0 -> its token 1 at 1; [1,2] decode 0 ->
# 2; request 1 is admitted at 2: [2,3] its prefill -> its token 1 at 3; [3,4] both decode ->
# request 0's token 3 and request 1's token 2 at 4, both finish.
#   request 0: TTFT 1, E2EL 4, ITLs [1, 2], TPOT (4 - 1) / 2 = 1.5
#   request 1: TTFT 3 - 1.5 = 1.5, E2EL 2.5, ITLs [1], TPOT 1
WORKLOAD = [RequestSpec(0, 2, 3, 0.0), RequestSpec(1, 2, 2, 1.5)]


def run(workload: list[RequestSpec], config: VllmResultConfig | None = None) -> dict[str, Any]:
    engine = make_engine("vllm", workload, cost=UnitCost(), token_times=True)
    done = engine.run()
    assert engine.token_times is not None
    records = [request_record(r) for r in done.requests]
    return vllm_result(records, engine.token_times, done.sim_time, config)


def test_every_key_and_unit_of_a_hand_computed_run() -> None:
    got = run(WORKLOAD, VllmResultConfig.from_flags("ttft,tpot,itl,e2el", "50,99"))
    assert got.pop("duration") == 4.0  # seconds
    assert got.pop("completed") == 2
    assert got.pop("failed") == 0
    assert got.pop("total_input_tokens") == 4
    assert got.pop("total_output_tokens") == 5
    assert got.pop("request_throughput") == pytest.approx(2 / 4)
    assert got.pop("output_throughput") == pytest.approx(5 / 4)
    assert got.pop("total_token_throughput") == pytest.approx(9 / 4)
    assert got.pop("request_goodput") is None  # no --goodput
    assert got.pop("input_lens") == [2, 2]
    assert got.pop("output_lens") == [3, 2]
    assert got.pop("ttfts") == pytest.approx([1.0, 1.5])  # seconds, per request
    assert got.pop("itls") == [pytest.approx([1.0, 2.0]), pytest.approx([1.0])]
    assert got.pop("errors") == ["", ""]
    itl_std = math.sqrt(((1 - 4 / 3) ** 2 * 2 + (2 - 4 / 3) ** 2) / 3)  # population std
    expected_ms = {
        "ttft": (1250, 1250, 250, 1250, 1000 + 0.99 * 500),
        "tpot": (1250, 1250, 250, 1250, 1000 + 0.99 * 500),
        "itl": (4000 / 3, 1000, 1000 * itl_std, 1000, 1000 + 0.98 * 1000),
        "e2el": (3250, 3250, 750, 3250, 2500 + 0.99 * 1500),
    }
    for name, (mean, median, std, p50, p99) in expected_ms.items():
        assert got.pop(f"mean_{name}_ms") == pytest.approx(mean), name
        assert got.pop(f"median_{name}_ms") == pytest.approx(median), name
        assert got.pop(f"std_{name}_ms") == pytest.approx(std), name
        assert got.pop(f"p50_{name}_ms") == pytest.approx(p50), name
        assert got.pop(f"p99_{name}_ms") == pytest.approx(p99), name
    assert got == {}  # no key left unchecked


@pytest.mark.parametrize(
    ("slos", "good"),
    [
        (["ttft:1200"], 1),  # request 0 (TTFT 1 s) only
        (["tpot:1000"], 1),  # request 1 (TPOT 1 s, at the SLO: good) only
        (["e2el:3000"], 1),  # request 1 (E2EL 2.5 s) only
        (["ttft:2000", "tpot:1500"], 2),
        (["ttft:1200", "e2el:3000"], 0),  # every SLO at once: none meets both
    ],
)
def test_goodput_counts_requests_within_every_slo(slos: list[str], good: int) -> None:
    got = run(WORKLOAD, VllmResultConfig.from_flags(goodput=slos))
    assert got["request_goodput"] == pytest.approx(good / 4.0)


def test_a_one_token_request_counts_tpot_zero_for_goodput() -> None:
    got = run([RequestSpec(0, 2, 1, 0.0)], VllmResultConfig.from_flags(goodput=["tpot:0"]))
    assert got["request_goodput"] == pytest.approx(1 / got["duration"])
    assert got["mean_tpot_ms"] == 0.0  # no request has a TPOT: vLLM's np.mean(0)


def test_a_rejected_request_is_failed() -> None:
    got = run([RequestSpec(0, 2, 3, 0.0), RequestSpec(1, 300, 3, 0.0)])  # over max_model_len
    assert (got["completed"], got["failed"]) == (1, 1)
    assert got["input_lens"] == [2, 300]  # every request's prompt, as vLLM lists them
    assert got["output_lens"] == [3, 0]
    assert got["ttfts"][1] == 0.0
    assert got["itls"][1] == []
    assert got["errors"][0] == ""
    assert got["errors"][1]
    assert got["total_input_tokens"] == 2  # the completed requests' only


def test_a_run_that_completes_nothing_has_zero_metrics() -> None:
    got = run([RequestSpec(0, 300, 3, 0.0)])
    assert got["completed"] == 0
    assert got["request_throughput"] == 0.0
    assert got["mean_ttft_ms"] == got["p99_itl_ms"] == 0.0


@given(
    metrics=st.lists(st.sampled_from(METRICS), min_size=1, unique=True),
    percentiles=st.lists(
        st.sampled_from([0, 1, 25, 50, 90, 99, 99.9, 100]), min_size=1, unique=True
    ),
)
def test_percentile_flags_choose_the_keys(metrics: list[str], percentiles: list[float]) -> None:
    config = VllmResultConfig.from_flags(",".join(metrics), ",".join(map(str, percentiles)))
    got = run(WORKLOAD, config)
    words = [str(int(p)) if int(p) == p else str(p) for p in percentiles]
    expected = {
        f"{stat}_{m}_ms"
        for m in metrics
        for stat in ("mean", "median", "std", *(f"p{w}" for w in words))
    }
    assert {k for k in got if k.endswith("_ms")} == expected


def test_the_defaults_are_vllms() -> None:
    got = run(WORKLOAD)
    assert {k for k in got if k.endswith("_ms")} == {
        f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl") for s in ("mean", "median", "std", "p99")
    }


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        ({"percentile_metrics": "ttft,latency"}, "percentile_metrics"),
        ({"metric_percentiles": "ninety"}, "metric_percentiles"),
        ({"metric_percentiles": "101"}, "metric_percentiles"),
        ({"metric_percentiles": "-1"}, "metric_percentiles"),
        ({"metric_percentiles": "nan"}, "metric_percentiles"),
        ({"goodput": ["ttft"]}, "goodput"),
        ({"goodput": ["ttft:fast"]}, "goodput"),
        ({"goodput": ["itl:5"]}, "goodput"),
        ({"goodput": ["ttft:-1"]}, "goodput"),
    ],
)
def test_bad_flag_values_name_the_field(flags: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        VllmResultConfig.from_flags(**flags)
    assert err.value.field == field


def test_a_result_without_token_times_is_refused() -> None:
    from pagedkv.simulation import SimulationConfig, simulate

    result = simulate(SimulationConfig.from_flat({"cost_model": "unit"}))
    with pytest.raises(ConfigError, match="token_times=True"):
        simulation_vllm_result(result)


@pytest.mark.parametrize(
    ("flat", "rate", "cap"),
    [
        ({"request_rate": 3.0, "max_concurrency": 2}, 3.0, 2),
        ({"request_rate": float("inf")}, "inf", None),
        ({}, "inf", None),
    ],
)
def test_the_run_is_described_as_vllm_records_it(
    flat: dict[str, Any], rate: object, cap: int | None
) -> None:
    from pagedkv.simulation import SimulationConfig, simulate

    config = SimulationConfig.from_flat({"cost_model": "unit", "num_requests": 7, **flat})
    out = simulation_vllm_result(simulate(config, token_times=True))
    assert out["backend"] == "pagedkv"
    assert out["model_id"] == config.hardware.model
    assert out["num_prompts"] == 7
    assert out["request_rate"] == rate
    assert out["burstiness"] == 1.0
    assert out["max_concurrency"] == cap
    assert "date" not in out

"""summarize: the latency statistics of whole columns equal the per-request formulas (metrics'
docstring) evaluated one request at a time in Python floats, to the bit."""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
from hypothesis import given

from pagedkv.engine.metrics import StepTotals, summarize
from pagedkv.engine.request import Request, RequestStatus

_TIME = st.floats(0.0, 1e7, allow_nan=False) | st.integers(0, 10**6)


@st.composite
def finished_runs(draw: st.DrawFn) -> list[Request]:
    out = []
    for i in range(draw(st.integers(0, 30))):
        arrival, ttft, decode = draw(_TIME), draw(_TIME), draw(_TIME)
        r = Request(i, arrival, draw(st.integers(1, 4096)), draw(st.integers(1, 4096)))
        if draw(st.booleans()):
            r.status = RequestStatus.FINISHED
            r.first_token_time = arrival + ttft
            r.finish_time = r.first_token_time + decode
        else:
            r.status = draw(st.sampled_from([RequestStatus.REJECTED, RequestStatus.WAITING]))
        r.num_recomputed_tokens = draw(st.integers(0, 100))
        out.append(r)
    return out


def _reference(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    a = np.asarray(values, dtype=float)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"mean": float(a.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


@given(finished_runs(), st.floats(0.0, 1e7))
def test_latency_stats_are_the_per_request_formulas(
    requests: list[Request], sim_time: float
) -> None:
    summary = summarize(requests, StepTotals(), sim_time, capacity=16)
    done = [r for r in requests if r.status is RequestStatus.FINISHED]
    ttft, tpot, e2e, norm = [], [], [], []
    for r in done:
        assert r.first_token_time is not None
        assert r.finish_time is not None
        ttft.append(r.first_token_time - r.arrival_time)
        e2e.append(r.finish_time - r.arrival_time)
        norm.append((r.finish_time - r.arrival_time) / r.output_len)
        if r.output_len > 1:
            tpot.append((r.finish_time - r.first_token_time) / (r.output_len - 1))
    assert summary["ttft"] == _reference(ttft)
    assert summary["tpot"] == _reference(tpot)
    assert summary["e2e"] == _reference(e2e)
    assert summary["normalized_latency"] == _reference(norm)
    output_tokens = sum(r.output_len for r in done)
    assert summary["output_token_throughput"] == (output_tokens / sim_time if sim_time else 0.0)
    assert type(summary["output_token_throughput"]) is float
    assert summary["finished"] == len(done)
    assert summary["recomputed_tokens"] == sum(r.num_recomputed_tokens for r in requests)

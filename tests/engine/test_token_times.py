"""Per-token times (``Engine(token_times=True)``): the fast-forward's equal the reference loop's,
they telescope to E2E - TTFT, and recording them changes nothing else of a run."""

from __future__ import annotations

import itertools
import math
from typing import Any

import hypothesis.strategies as st
from hypothesis import given, settings

from pagedkv.engine.cost_model import CostModel, UnitCost
from pagedkv.engine.engine import Engine
from pagedkv.engine.metrics import request_record, summarize
from pagedkv.engine.policies import SCHEDULERS
from pagedkv.engine.request import RequestStatus
from pagedkv.simulation import SimulationConfig, simulate
from pagedkv.workloads.spec import RequestSpec
from tests.engine.test_fast_forward import MAX_LEN, ROOFLINE, same, workloads
from tests.factories import make_engine


def run(reference: bool, token_times: bool, workload: list[RequestSpec], **kw: Any) -> Engine:
    engine = make_engine(
        kw.pop("scheduler"), workload, reference=reference, token_times=token_times, **kw
    )
    engine.run()
    return engine


def check_times(engine: Engine) -> None:
    """Every finished request: one time per output token, the first its first token's, the
    last its finish (or before it under static batching, which holds a finished request
    until its batch ends), never decreasing; the gaps (its ITLs) sum to E2E - TTFT less that."""
    times = engine.token_times
    assert times is not None
    for r in engine.requests:
        if r.status is not RequestStatus.FINISHED:
            continue
        assert r.first_token_time is not None
        assert r.finish_time is not None
        t = times[r.request_id]
        assert len(t) == r.output_len
        assert t[0] == r.first_token_time
        # the last token is its finish, except where a policy holds finished requests back
        # (static batching returns a batch when its longest request ends)
        held = r.finish_time - t[-1]
        assert held >= 0
        if held:
            assert engine.scheduler.name == "static"
        gaps = [b - a for a, b in itertools.pairwise(t)]
        assert all(g >= 0 for g in gaps)
        e2e, ttft = r.finish_time - r.arrival_time, r.first_token_time - r.arrival_time
        assert math.isclose(sum(gaps) + held, e2e - ttft, rel_tol=1e-9, abs_tol=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    workload=workloads(),
    scheduler=st.sampled_from(sorted(SCHEDULERS)),
    block_size=st.sampled_from([1, 16, 7]),
    blocks_tokens=st.integers(MAX_LEN + 32, 2000),
    mode=st.sampled_from(["recompute", "swap"]),
    roofline=st.booleans(),
)
def test_fast_forward_token_times_equal_the_reference_loops(
    workload: list[RequestSpec],
    scheduler: str,
    block_size: int,
    blocks_tokens: int,
    mode: str,
    roofline: bool,
) -> None:
    cost: CostModel = ROOFLINE if roofline else UnitCost()
    kw: dict[str, Any] = {
        "scheduler": scheduler,
        "block_size": block_size,
        "num_gpu_blocks": blocks_tokens // block_size,
        "num_cpu_blocks": 64,
        "preemption_mode": mode,
        "max_model_len": MAX_LEN,
        "cost": cost,
    }
    ref = run(True, True, workload, **kw)
    fast = run(False, True, workload, **kw)
    plain = run(False, False, workload, **kw)  # the usual run: the cohort may take over
    assert plain.token_times is None
    same(ref.token_times, fast.token_times)
    check_times(ref)
    check_times(fast)
    # Recording the times changes nothing else of the run.
    for other in (fast, ref):
        same(
            [request_record(r) for r in plain.requests],
            [request_record(r) for r in other.requests],
        )
        same(
            summarize(plain.requests, plain.totals, plain.now, plain.scheduler.kv.capacity),
            summarize(other.requests, other.totals, other.now, other.scheduler.kv.capacity),
        )


def test_restarted_parallel_samples_keep_one_time_per_token() -> None:
    """A group of samples preempted by recompute samples its tokens again: they replace the
    old ones (its first token, streamed before, stays)."""
    workload = [RequestSpec(i, 40, 60, 0.1 * i, n=3) for i in range(6)]
    for reference in (True, False):
        engine = run(
            reference,
            True,
            workload,
            scheduler="vllm",
            block_size=4,
            num_gpu_blocks=120,
            group_preemption_mode="recompute",
        )
        assert engine.totals.preemptions > 0  # the case this test is about
        check_times(engine)


def test_simulate_with_token_times_writes_the_same_json() -> None:
    config = SimulationConfig.from_flat({"cost_model": "unit", "workload": "lesson"})
    assert simulate(config).to_dict() == simulate(config, token_times=True).to_dict()

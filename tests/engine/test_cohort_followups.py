"""The decode cohort with follow-ups (chat turns): a finish releases an arrival to come."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from pagedkv.engine import cohort
from pagedkv.engine.cost_model import UnitCost
from pagedkv.workloads.spec import RequestSpec
from tests.engine.test_cohort import count_schedules
from tests.engine.test_cohort_queue import PAGED
from tests.engine.test_fast_forward import ROOFLINE, both_equal, run, same
from tests.engine.user_policies import USER_POLICIES, registered
from tests.factories import make_engine


@pytest.fixture(autouse=True, scope="module")
def _user_policies() -> Iterator[None]:
    with registered(*USER_POLICIES):
        yield


@st.composite
def chats(draw: st.DrawFn) -> list[RequestSpec]:
    """Requests of which some follow an earlier one (its parent) after a think time of 0, a
    fraction of a round or seconds, without token ids; some done by their prefill."""
    n = draw(st.integers(1, 24))
    t = 0.0
    out = []
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.01, 0.3, 2.0]))
        prompt = draw(st.integers(1, 100))
        output = draw(st.one_of(st.just(1), st.integers(1, 250 - prompt)))
        parent = draw(st.one_of(st.none(), st.integers(0, i - 1))) if i else None
        think = draw(st.sampled_from([0.0, 0.0, 0.001, 0.05, 1.5])) if parent is not None else 0
        out.append(RequestSpec(i, prompt, output, t, parent_id=parent, think_time=think))
    return out


@settings(max_examples=60, deadline=None)
@given(
    workload=chats(),
    scheduler=st.sampled_from(PAGED),
    block_size=st.sampled_from([1, 16, 5]),
    blocks_tokens=st.integers(260, 2000),
    mode=st.sampled_from(["recompute", "swap"]),
    chunked=st.booleans(),
    max_num_seqs=st.sampled_from([None, None, 3]),
    roofline=st.booleans(),
)
def test_cohorts_with_follow_ups_equal_the_reference(
    workload: list[RequestSpec],
    scheduler: str,
    block_size: int,
    blocks_tokens: int,
    mode: str,
    chunked: bool,
    max_num_seqs: int | None,
    roofline: bool,
) -> None:
    """Follow-ups released at finishes inside a cohort (and idle gaps while every session
    thinks): the whole run equals the reference; integrity is checked at every event."""
    chunked = chunked and scheduler == "vllm"
    both_equal(
        workload,
        ROOFLINE if roofline else UnitCost(),
        scheduler,
        block_size,
        blocks_tokens,
        mode,
        max_model_len=256,
        max_num_seqs=(max_num_seqs or 32) if chunked else max_num_seqs,
        chunked=chunked,
        max_num_batched_tokens=32 if chunked else None,
    )


def test_a_conversation_runs_in_one_cohort() -> None:
    """Three sessions of five turns each, without token ids: after the first admission round
    every turn is released, admitted and decoded inside one cohort (the scheduler's
    ``schedule`` runs once), and the run equals the reference."""
    workload = []
    for s in range(3):
        for t in range(5):
            rid = 5 * s + t
            parent = rid - 1 if t else None
            workload.append(
                RequestSpec(rid, 20 + 7 * t, 30 + 11 * s, 0.0, parent_id=parent, think_time=0.4 * t)
            )
    kw: dict[str, Any] = {"num_gpu_blocks": 200, "max_model_len": 512}
    engine = make_engine("vllm", workload, cost=ROOFLINE, **kw)
    assert engine.followups
    calls = count_schedules(engine)
    result = engine.run()
    assert calls[0] == 1
    assert all(r.finish_time is not None for r in result.requests)
    assert cohort.plain(engine)
    ref = run(True, workload, ROOFLINE, scheduler="vllm", **kw)
    same(ref[:4], run(False, workload, ROOFLINE, scheduler="vllm", **kw)[:4])

"""The decode cohort with per-token times: a member's stamps are the ends of its rounds."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from pagedkv.engine import cohort
from pagedkv.engine.cost_model import UnitCost
from pagedkv.workloads.spec import RequestSpec
from tests.engine.test_cohort import count_schedules, staggered_loads
from tests.engine.test_cohort_followups import chats
from tests.engine.test_cohort_queue import PAGED, bursts
from tests.engine.test_fast_forward import ROOFLINE, both_equal, same
from tests.engine.test_token_times import check_times
from tests.engine.user_policies import USER_POLICIES, registered
from tests.factories import make_engine


@pytest.fixture(autouse=True, scope="module")
def _user_policies() -> Iterator[None]:
    with registered(*USER_POLICIES):
        yield


@settings(max_examples=80, deadline=None)
@given(
    workload=st.one_of(bursts(), staggered_loads(), chats()),
    scheduler=st.sampled_from(PAGED),
    block_size=st.sampled_from([1, 16, 5]),
    blocks_tokens=st.integers(260, 1500),
    mode=st.sampled_from(["recompute", "swap"]),
    chunked=st.booleans(),
    roofline=st.booleans(),
)
def test_cohort_token_times_equal_the_reference(
    workload: list[RequestSpec],
    scheduler: str,
    block_size: int,
    blocks_tokens: int,
    mode: str,
    chunked: bool,
    roofline: bool,
) -> None:
    """Queues, preemptions (a recomputed member samples its tokens again), swaps, chunked
    rounds and follow-ups, every token's time recorded: the times and the whole run equal the
    reference's, and they telescope to each request's E2E - TTFT."""
    chunked = chunked and scheduler == "vllm"
    ref, fast = both_equal(
        workload,
        ROOFLINE if roofline else UnitCost(),
        scheduler,
        block_size,
        blocks_tokens,
        mode,
        max_model_len=256,
        chunked=chunked,
        max_num_batched_tokens=32 if chunked else None,
        max_num_seqs=32 if chunked else None,
        token_times=True,
    )
    same(ref[4].token_times, fast[4].token_times)
    check_times(ref[4])
    check_times(fast[4])


def test_token_times_run_in_one_cohort() -> None:
    """Staggered arrivals, every token's time recorded: the scheduler runs only the first
    admission round, and every request has one time per output token, as the reference."""
    workload = [RequestSpec(i, 30, 100 + 37 * i, 0.4 * i) for i in range(10)]
    kw: dict[str, Any] = {"num_gpu_blocks": 400, "max_model_len": 512, "cost": ROOFLINE}
    engine = make_engine("vllm", workload, token_times=True, **kw)
    calls = count_schedules(engine)
    engine.run()
    assert calls[0] == 1
    assert cohort.plain(engine)
    check_times(engine)
    ref = make_engine("vllm", workload, token_times=True, reference=True, **kw)
    ref.run()
    same(ref.token_times, engine.token_times)

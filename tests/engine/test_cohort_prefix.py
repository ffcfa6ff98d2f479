"""The decode cohort under prefix caching: members' blocks and keys made when the pool is read,
in the rounds' order (memory/keyed_growth.py), the whole run equal to the reference."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from pagedkv.engine import cohort
from pagedkv.engine.cost_model import UnitCost
from pagedkv.memory.manager import KVCacheManager
from pagedkv.memory.token_runs import TokenRuns
from pagedkv.workloads.spec import RequestSpec
from pagedkv.workloads.token_ids import own_ids, prefix_ids
from tests.engine.test_cohort import count_schedules
from tests.engine.test_cohort_queue import OPTED_IN
from tests.engine.test_fast_forward import ROOFLINE, both_equal, run, same
from tests.engine.user_policies import USER_POLICIES, registered
from tests.factories import make_engine

MAX_LEN = 200


@pytest.fixture(autouse=True, scope="module")
def _user_policies() -> Iterator[None]:
    with registered(*USER_POLICIES):
        yield


@st.composite
def shared_loads(draw: st.DrawFn) -> list[RequestSpec]:
    """Requests with token ids: a shared prefix (one of three, or none) and their own tokens,
    arriving in bursts (a queue forms); some repeat an earlier request's prompt and outputs id
    for id (decode blocks with keys already cached), some continue an earlier request's
    prompt and outputs (a waiting prompt that a member's next blocks would complete), and a
    few plan no outputs (their blocks past the prompt get no key)."""
    n = draw(st.integers(2, 24))
    t = 0.0
    specs: list[RequestSpec] = []
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.0, 0.01, 0.05, 0.5, 2.0]))
        kind = draw(st.sampled_from(["shared", "shared", "private", "repeat", "continue"]))
        output = draw(st.integers(1, 90))
        planned = [s for s in specs if s.output_token_ids is not None]
        if kind in ("repeat", "continue") and planned:
            base = draw(st.sampled_from(planned))
            assert isinstance(base.token_ids, TokenRuns)
            assert isinstance(base.output_token_ids, TokenRuns)
            if kind == "repeat":
                ids = base.token_ids
                outs = base.output_token_ids
                output = base.output_len
            else:
                taken = draw(st.integers(0, base.output_len))
                ids = base.token_ids + base.output_token_ids[:taken]
                ids = ids + own_ids(i, 0, draw(st.integers(1, 20)))
                outs = own_ids(i, 1 << 20, output)
        else:
            own = draw(st.integers(1, 60))
            ids = own_ids(i, 0, own)
            if kind != "private":
                ids = prefix_ids(draw(st.integers(0, 2)), draw(st.integers(1, 70))) + ids
            outs = own_ids(i, own, output)
        if len(ids) + output > MAX_LEN:
            continue
        unplanned = draw(st.integers(0, 9)) == 0
        spec = RequestSpec(len(specs), len(ids), output, t, token_ids=ids)
        specs.append(spec if unplanned else replace(spec, output_token_ids=outs))
    return specs


@settings(max_examples=60, deadline=None)
@given(
    workload=shared_loads(),
    scheduler=st.sampled_from(OPTED_IN),
    block_size=st.sampled_from([1, 16, 7]),
    blocks_tokens=st.integers(MAX_LEN + 40, 900),
    mode=st.sampled_from(["recompute", "recompute", "swap"]),
    chunked=st.booleans(),
    budget=st.sampled_from([None, 16, 64]),
    watermark=st.sampled_from([0.0, 0.01, 0.2]),
    unit=st.booleans(),
    ids=st.sampled_from(["all", "all", "all", "none", "late"]),
)
def test_prefix_caching_cohorts_equal_the_reference(
    workload: list[RequestSpec],
    scheduler: str,
    block_size: int,
    blocks_tokens: int,
    mode: str,
    chunked: bool,
    budget: int | None,
    watermark: float,
    unit: bool,
    ids: str,
) -> None:
    """Shared prefixes, repeated and continued prompts, queues, memory tight enough that
    growth evicts cached blocks and preempts (recompute: a victim meets its own cached blocks
    again; swap), chunked prefill, block sizes 1, 16 and 7: the whole run equals the reference,
    and the books hold at every event (``make_engine`` checks integrity). Without ids no block
    is keyed: growth then takes its blocks when read, in any order; with ids from the middle
    on ("late") the first request with ids starts the cache amid growers that key nothing."""
    if ids != "all":
        late = len(workload) // 2 if ids == "late" else len(workload)
        workload = [
            replace(r, token_ids=None, output_token_ids=None) if i < late else r
            for i, r in enumerate(workload)
        ]
    extra: dict[str, Any] = {"prefix_caching": True, "max_model_len": MAX_LEN}
    if chunked and scheduler == "vllm":
        extra |= {"chunked": True, "max_num_batched_tokens": budget or MAX_LEN}
        extra["max_num_seqs"] = 16
    both_equal(
        workload,
        UnitCost() if unit else ROOFLINE,
        scheduler,
        block_size,
        blocks_tokens,
        mode,
        watermark=watermark,
        **extra,
    )


def _shared(n: int, gap: float, output: int) -> list[RequestSpec]:
    return [
        RequestSpec(
            i,
            40 + 9 + i % 5,
            output + 13 * (i % 4),
            gap * i,
            token_ids=prefix_ids(0, 40) + own_ids(i, 0, 9 + i % 5),
            output_token_ids=own_ids(i, 9 + i % 5, output + 13 * (i % 4)),
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_a_prefix_caching_queue_runs_in_one_cohort(mode: str) -> None:
    """Thirty requests sharing a prefix, at once, in memory for a few: the scheduler runs only
    the first admission round; every later admission (each hitting the cached prefix), every
    preemption (a swap-out, and its swap-in after a decode) and every finish happens inside
    the cohort, and the run equals the reference."""
    workload = _shared(30, 0.001, 60)
    kw: dict[str, Any] = {
        "num_gpu_blocks": 30,
        "num_cpu_blocks": 64,
        "preemption_mode": mode,
        "max_model_len": 512,
        "watermark": 0.0,
        "prefix_caching": True,
    }
    engine = make_engine("vllm", workload, cost=ROOFLINE, **kw)
    calls = count_schedules(engine)
    result = engine.run()
    assert calls[0] == 1
    assert sum(r.num_preemptions for r in result.requests) > 0
    assert (sum(r.num_swaps for r in result.requests) > 0) == (mode == "swap")
    kv = engine.scheduler.kv
    assert isinstance(kv, KVCacheManager)
    assert kv.stats.prefix_hit_tokens > 0
    ref = run(True, workload, ROOFLINE, scheduler="vllm", **kw)
    same(ref[:4], run(False, workload, ROOFLINE, scheduler="vllm", **kw)[:4])


def test_a_prompt_that_continues_a_member_ends_the_cohort() -> None:
    """A waiting prompt made of a running request's prompt and outputs: the member's next full
    block would give it a hit, so the cohort hands the rounds to the scheduler until then
    (``Cohort._growth_may_hit``), and the run equals the reference."""
    first = RequestSpec(
        0,
        49,
        40,
        0.0,
        token_ids=prefix_ids(0, 40) + own_ids(0, 0, 9),
        output_token_ids=own_ids(0, 9, 40),
    )
    assert isinstance(first.token_ids, TokenRuns)
    assert isinstance(first.output_token_ids, TokenRuns)
    # its fourth block (tokens 48..63) is the first's once that has decoded 15 tokens
    ids = first.token_ids + first.output_token_ids[:20] + own_ids(1, 0, 20)
    second = RequestSpec(1, len(ids), 5, 0.01, token_ids=ids, output_token_ids=own_ids(1, 20, 5))
    workload = [first, second]
    kw: dict[str, Any] = {
        "num_gpu_blocks": 6,  # the second fits only with the first's fourth block as a hit
        "block_size": 16,
        "max_model_len": 512,
        "watermark": 0.0,
        "prefix_caching": True,
    }
    engine = make_engine("vllm", workload, cost=ROOFLINE, **kw)
    seen: list[bool] = []
    may_hit = cohort.Cohort._growth_may_hit

    def spied(self: cohort.Cohort) -> bool:
        got = may_hit(self)
        seen.append(got)
        return got

    cohort.Cohort._growth_may_hit = spied  # type: ignore[method-assign]
    try:
        engine.run()
    finally:
        cohort.Cohort._growth_may_hit = may_hit  # type: ignore[method-assign]
    assert True in seen
    ref = run(True, workload, ROOFLINE, scheduler="vllm", **kw)
    same(ref[:4], run(False, workload, ROOFLINE, scheduler="vllm", **kw)[:4])


def test_an_arrival_with_the_first_ids_at_a_cohorts_start_ends_it() -> None:
    """Requests without ids decode; the first with ids arrives as a cohort starts (handed
    over in ``Cohort.run``): its allocation starts the cache and settles every grower, so no
    cohort may run until it is allocated (found by Hypothesis: the members stopped growing)."""
    ids = [TokenRuns([range(1), range(16 + i, 17 + i)]) for i in range(8)]
    workload = [RequestSpec(i, 2, 2 if i < 2 else 1, 0.0) for i in range(4)]
    workload += [RequestSpec(i, 2, 1, 0.01, token_ids=ids[i]) for i in range(4, 8)]
    both_equal(
        workload,
        ROOFLINE,
        "vllm",
        1,
        240,
        "recompute",
        watermark=0.0,
        prefix_caching=True,
        max_model_len=MAX_LEN,
        chunked=True,
        max_num_batched_tokens=MAX_LEN,
        max_num_seqs=16,
    )

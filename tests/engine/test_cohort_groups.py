"""The decode cohort with parallel samples: a forked group's samples are members' sequences."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from pagedkv.engine import cohort
from pagedkv.engine.request import Request
from pagedkv.memory.manager import KVCacheManager
from pagedkv.workloads.spec import RequestSpec
from tests.engine import test_cohort_queue
from tests.engine.test_cohort import count_schedules
from tests.engine.test_cohort_queue import PAGED, VLLM_ROUNDS
from tests.engine.test_fast_forward import ROOFLINE, both_equal, run, same
from tests.engine.user_policies import USER_POLICIES, registered
from tests.factories import make_engine


@pytest.fixture(autouse=True, scope="module")
def _user_policies() -> Iterator[None]:
    with registered(*USER_POLICIES):
        yield


@st.composite
def samples(draw: st.DrawFn) -> list[RequestSpec]:
    """Requests of 1, 2 or 4 parallel samples arriving together or apart, some done by their
    prefill, some chat follow-ups."""
    n = draw(st.integers(1, 16))
    t = 0.0
    out = []
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.01, 0.3, 2.0]))
        prompt = draw(st.integers(1, 80))
        output = draw(st.one_of(st.just(1), st.integers(1, 200 - prompt)))
        parent = draw(st.one_of(st.none(), st.none(), st.integers(0, i - 1))) if i else None
        think = 0.0 if parent is None else draw(st.sampled_from([0.0, 0.05]))
        k = draw(st.sampled_from([1, 2, 2, 4]))
        out.append(RequestSpec(i, prompt, output, t, parent_id=parent, think_time=think, n=k))
    return out


@settings(max_examples=80, deadline=None)
@given(
    workload=samples(),
    scheduler=st.sampled_from(PAGED),
    block_size=st.sampled_from([1, 16, 5]),
    blocks_tokens=st.integers(400, 2000),
    mode=st.sampled_from(["recompute", "swap"]),
    group_mode=st.sampled_from(["recompute", "swap"]),
    chunked=st.booleans(),
    token_times=st.booleans(),
)
def test_cohorts_with_parallel_samples_equal_the_reference(
    workload: list[RequestSpec],
    scheduler: str,
    block_size: int,
    blocks_tokens: int,
    mode: str,
    group_mode: str,
    chunked: bool,
    token_times: bool,
) -> None:
    """Groups forking, decoding n sequences, preempted whole (swapped, or restarted from the
    prompt), resumed, finishing (their shared prompt blocks freed once) inside cohorts, among
    single sequences: the whole run equals the reference; integrity at every event."""
    chunked = chunked and scheduler == "vllm"
    ref, fast = both_equal(
        workload,
        ROOFLINE,
        scheduler,
        block_size,
        blocks_tokens,
        mode,
        max_model_len=256,
        group_preemption_mode=group_mode,
        chunked=chunked,
        max_num_batched_tokens=32 if chunked else None,
        max_num_seqs=32 if chunked else None,
        token_times=token_times,
    )
    same(ref[4].token_times, fast[4].token_times)
    # every total, the time integral of the blocks that sharing saves among them
    same(dataclasses.asdict(ref[4].totals), dataclasses.asdict(fast[4].totals))
    assert fast[4].totals.preemptions == sum(r.num_preemptions for r in fast[4].requests)


def test_forked_groups_decode_in_a_cohort(monkeypatch: pytest.MonkeyPatch) -> None:
    """Groups of 3 among single sequences, a queue behind them and memory for a few: cohorts
    take the forked groups in as members (three sequences each), preempt and finish them,
    and the run equals the reference."""
    joined: list[int] = []
    join = cohort.Cohort._join

    def counted(self: cohort.Cohort, reqs: list[Request]) -> None:
        join(self, reqs)
        joined.append(self.extra)

    monkeypatch.setattr(cohort.Cohort, "_join", counted)
    workload = [
        RequestSpec(i, 20 + i % 5, 40 + 9 * i, 0.01 * i, n=3 if i % 2 else 1) for i in range(12)
    ]
    kw: dict[str, Any] = {"num_gpu_blocks": 60, "max_model_len": 512, "watermark": 0.0}
    engine = make_engine("vllm", workload, cost=ROOFLINE, **kw)
    result = engine.run()
    assert max(joined) >= 2  # a forked group of 3 in a cohort
    assert sum(r.num_preemptions for r in result.requests) > 0
    assert cohort.plain(engine)
    ref = run(True, workload, ROOFLINE, scheduler="vllm", **kw)
    same(ref[:4], run(False, workload, ROOFLINE, scheduler="vllm", **kw)[:4])


def test_groups_arriving_apart_fork_inside_one_cohort() -> None:
    """Groups of 2 and 3 samples arriving apart (prompts ending inside a block and on a block
    boundary), memory to spare: the scheduler runs only the first admission round and the
    first group's fork round (no cohort has started yet); every later admission, each
    group's fork round (copy-on-write of its shared last block) and every finish happen
    inside one cohort, and the run equals the reference."""
    workload = [
        RequestSpec(i, 16 + 5 * (i % 2), 40 + 13 * i, 0.3 * i, n=2 + i % 2) for i in range(8)
    ]
    kw: dict[str, Any] = {"num_gpu_blocks": 400, "max_model_len": 512}
    engine = make_engine("vllm", workload, cost=ROOFLINE, **kw)
    calls = count_schedules(engine)
    result = engine.run()
    assert calls[0] == 2
    assert all(len(r.seq_ids) == r.n for r in result.requests)
    kv = engine.scheduler.kv
    assert isinstance(kv, KVCacheManager)
    assert kv.stats.cow_copies > 0
    ref = run(True, workload, ROOFLINE, scheduler="vllm", **kw)
    same(ref[:4], run(False, workload, ROOFLINE, scheduler="vllm", **kw)[:4])


def test_a_group_resumed_before_its_fork_may_go_straight_back_out() -> None:
    """A group of two swapped out after its first token but before it forked: its room test
    at a resumption counts one sequence, its fork needs two, so inside a cohort it is swapped
    in and straight back out while the others decode (a Hypothesis draw: that round's swaps
    and preemption were once left out of the cohort's totals)."""
    same_time = [(0.0, 1, 1, 1), (0.0, 10, 104, 1), (0.0, 1, 1, 1), (0.3, 12, 91, 4)]
    same_time += [(0.3, 1, 1, 1), (2.3, 16, 6, 2), *[(2.3, 1, 1, 1)] * 3, (2.3, 64, 2, 2)]
    workload = [RequestSpec(i, p, o, t, n=n) for i, (t, p, o, n) in enumerate(same_time)]
    workload.append(RequestSpec(10, 1, 1, 2.3))
    workload.append(RequestSpec(11, 32, 88, 2.3, parent_id=4, think_time=0.05, n=4))
    workload += [RequestSpec(12, 1, 1, 2.3), RequestSpec(13, 1, 1, 2.3)]
    _, fast = both_equal(workload, ROOFLINE, "vllm", 16, 67 * 16, "recompute")
    engine = fast[4]
    assert engine.totals.preemptions == sum(r.num_preemptions for r in engine.requests)
    assert any(r.num_preemptions > 1 for r in engine.requests)  # out, in, and out again


def test_beams_stay_out_of_the_cohort() -> None:
    workload = [RequestSpec(0, 20, 30, 0.0, beam_width=2)]
    engine = make_engine("vllm", workload, num_gpu_blocks=100)
    engine.run()
    assert not cohort.plain(engine)


@settings(max_examples=60, deadline=None)
@given(
    workload=samples(),
    scheduler=st.sampled_from(VLLM_ROUNDS),
    block_size=st.sampled_from([1, 16, 5]),
    blocks_tokens=st.integers(400, 900),
    mode=st.sampled_from(["recompute", "swap"]),
    chunked=st.booleans(),
)
def test_plans_keep_their_promises_with_groups(
    workload: list[RequestSpec],
    scheduler: str,
    block_size: int,
    blocks_tokens: int,
    mode: str,
    chunked: bool,
) -> None:
    """``plan_round``, ``growth_victim``, ``resume`` and ``fill`` held to what ``schedule``
    does (test_cohort_queue's check) with parallel samples running, forking and preempted."""
    test_cohort_queue.test_plans_keep_their_promises.hypothesis.inner_test(  # type: ignore[attr-defined]
        workload, scheduler, block_size, blocks_tokens, mode, chunked
    )

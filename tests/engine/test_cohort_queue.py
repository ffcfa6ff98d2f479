"""The decode cohort while requests wait: admissions at events, preemptions inside it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from pagedkv.engine.cost_model import UnitCost
from pagedkv.engine.metrics import request_record
from pagedkv.engine.policies import SCHEDULERS
from pagedkv.engine.policies.vllm import VllmScheduler
from pagedkv.engine.request import Request
from pagedkv.engine.scheduler import SchedulerOutput
from pagedkv.workloads.spec import RequestSpec
from tests.engine.test_cohort import count_schedules, loads
from tests.engine.test_fast_forward import POLICIES, ROOFLINE, both_equal, run, same
from tests.engine.user_policies import USER_POLICIES, registered
from tests.factories import make_engine

# Every registered policy on paged memory that opts in, and users' policies (their
# differential test lives in test_fast_forward; here the queues are long).
PAGED = [p for p in POLICIES if not p.startswith(("orca", "f", "static"))]
_CLASSES = {**SCHEDULERS, **{p.name: p for p in USER_POLICIES}}
OPTED_IN = [p for p in PAGED if _CLASSES[p].decides_at_events]
# Rounds built as vllm's (decodes first, then ``fill``); vllm-v1's own oracle, for its running
# pass in admission order, is tests/engine/test_vllm_v1_fast.py.
VLLM_ROUNDS = [p for p in OPTED_IN if p != "vllm-v1"]


@pytest.fixture(autouse=True, scope="module")
def _user_policies() -> Iterator[None]:
    with registered(*USER_POLICIES):
        yield


def bursts() -> st.SearchStrategy[list[RequestSpec]]:
    """Requests that arrive faster than they finish: a queue forms and stays, and memory runs
    short while it does (preemptions), with one-token outputs among them."""
    return loads((4, 30), [0.0, 0.0, 0.0, 0.005, 0.05, 0.5], 90)


@settings(max_examples=120, deadline=None)
@given(
    workload=bursts(),
    scheduler=st.sampled_from(PAGED),
    block_size=st.sampled_from([1, 16, 5]),
    blocks_tokens=st.integers(260, 900),
    mode=st.sampled_from(["recompute", "recompute", "swap"]),
    max_num_seqs=st.sampled_from([None, None, 4]),
    watermark=st.sampled_from([0.0, 0.01, 0.2]),
    unit=st.booleans(),
)
def test_queued_cohorts_equal_the_reference(
    workload: list[RequestSpec],
    scheduler: str,
    block_size: int,
    blocks_tokens: int,
    mode: str,
    max_num_seqs: int | None,
    watermark: float,
    unit: bool,
) -> None:
    """Queues that last, tight memory (preemptions inside the cohort), a cap on running
    requests and watermarks (the head refused while blocks are free): the whole run equals the
    reference; integrity is checked at every event (``make_engine``)."""
    both_equal(
        workload,
        UnitCost() if unit else ROOFLINE,
        scheduler,
        block_size,
        blocks_tokens,
        mode,
        max_model_len=256,
        max_num_seqs=max_num_seqs,
        watermark=watermark,
    )


def test_a_queue_and_its_preemptions_run_in_one_cohort() -> None:
    """Forty requests at once in memory for a few: the scheduler runs only the first admission
    round; every later admission and every preemption happens inside the cohort, and the run
    equals the reference."""
    workload = [RequestSpec(i, 20 + i % 7, 60 + 11 * i, 0.001 * i) for i in range(40)]
    kw: dict[str, Any] = {"num_gpu_blocks": 40, "max_model_len": 512, "watermark": 0.0}
    engine = make_engine("vllm", workload, cost=ROOFLINE, **kw)
    calls = count_schedules(engine)
    result = engine.run()
    assert calls[0] == 1
    assert sum(r.num_preemptions for r in result.requests) > 0
    ref = run(True, workload, ROOFLINE, scheduler="vllm", **kw)
    same(ref[:4], run(False, workload, ROOFLINE, scheduler="vllm", **kw)[:4])


@settings(max_examples=80, deadline=None)
@given(
    workload=bursts(),
    scheduler=st.sampled_from(VLLM_ROUNDS),
    block_size=st.sampled_from([1, 16, 5]),
    blocks_tokens=st.integers(260, 900),
    mode=st.sampled_from(["recompute", "swap"]),
    chunked=st.booleans(),
)
def test_plans_keep_their_promises(
    workload: list[RequestSpec],
    scheduler: str,
    block_size: int,
    blocks_tokens: int,
    mode: str,
    chunked: bool,
) -> None:
    """Stepping every round, with ``plan_round``'s admissions run in place of ``schedule``'s
    whenever it plans some, gives the same run as ``schedule`` alone; where it plans a decode,
    ``schedule`` admits nobody and every running request decodes once (and, if the plan
    resumes, swapped requests oldest first), or (a policy that does not preempt) those short
    of blocks stall, or requests are preempted: ``growth_victim``
    first, then the next latest, off the end of the running requests. A refusal answered from
    the last one is the head's test's answer now. (Only a policy that opts in is held to
    them: the fast path reads them only then.)"""
    kw: dict[str, Any] = {
        "block_size": block_size,
        "num_gpu_blocks": blocks_tokens // block_size,
        "num_cpu_blocks": 64,
        "preemption_mode": mode,
        "chunked": chunked and scheduler == "vllm",
        "max_model_len": 256,
    }
    engine = make_engine(scheduler, workload, cost=ROOFLINE, reference=True, **kw)
    sched = engine.scheduler
    schedule = sched.schedule

    def planned() -> SchedulerOutput:
        before = list(sched.running)
        swapped = list(sched.swapped)
        victim = sched.growth_victim()
        again = (  # a refusal answered from the last one's (``_refuses_again``)
            isinstance(sched, VllmScheduler)
            and bool(sched.waiting)
            and sched._refuses_again(sched.waiting[0], sched.paged.num_free_blocks)
        )
        plan = sched.plan_round()
        if again:  # it is the answer the head's test gives now
            assert isinstance(sched, VllmScheduler)
            assert plan is None or plan.chunked or plan.resumes or not sched._admits_head()
        if plan is None:
            return schedule()
        if not plan.decodes:
            return plan.admitted
        if plan.chunked:  # decodes, then ``fill``'s part: ``fill`` in place of its half
            return filled()
        out = schedule()
        decoded = [c.request for c in out.chunks if c.request in before]
        resumed = [c.request for c in out.chunks if c.request not in before]
        assert all(c.num_new_tokens == 1 for c in out.chunks)
        back_out = [r for r in out.preempted if r not in before]
        if back_out:  # a group resumed before its fork, straight back out: its fork needs more
            assert plan.resumes
            assert all(r.n > 1 and r in swapped for r in back_out)
        if len(back_out) < len(out.preempted):  # victims off the end; nobody resumed then
            assert not resumed
            assert not out.swap_in
            if victim is not None:
                assert out.preempted == before[::-1][: len(out.preempted)]
                assert out.preempted[0] is victim
        else:
            if decoded != before:  # a policy that does not preempt: one short of blocks stalls
                assert not sched.preempts
                assert decoded == [r for r in before if r in decoded]
                stalled = [r for r in before if r not in decoded]
                free = getattr(sched.kv, "num_free_blocks", 0)
                assert free < max(r.n for r in stalled) + 1  # (a group all or none)
            assert resumed == swapped[: len(resumed)]  # the oldest swapped first
            assert plan.resumes or not resumed
        return out

    def filled() -> SchedulerOutput:
        # The decodes as ``schedule`` makes them (every request with one token left, in
        # running order), then ``fill`` for the others, unless the decodes preempted.
        assert isinstance(sched, VllmScheduler)
        decoding = [r for r in sched.running if r.num_pending_tokens == 1]
        if len(decoding) < len(sched.running) and any(
            r.num_computed_tokens < r.prompt_len for r in decoding
        ):
            return schedule()  # a prompt's last token alone: the cohort plans no round
        out = SchedulerOutput()
        sched._decode_running(out)
        prefilling = [r for r in sched.running if r not in decoding]
        decoded = [c.request for c in out.chunks]
        sched.fill(out, prefilling, decoded, bool(out.preempted))
        return out

    sched.schedule = planned  # type: ignore[method-assign]
    result = engine.run()
    ref = run(True, workload, ROOFLINE, scheduler=scheduler, **kw)
    same(ref[1], [request_record(r) for r in result.requests])
    same(ref[2:4], (result.deadlocked, result.stuck))


class OwnRounds(VllmScheduler):
    """Promises the fast path's contract, but builds its rounds its own way."""

    name = "test-own-rounds"
    decides_at_events = True

    def schedule(self) -> SchedulerOutput:
        return super().schedule()


class OwnAdmission(VllmScheduler):
    """Admits by a test of its own (README's example): the plan would restate the wrong one."""

    name = "test-own-admission"
    decides_at_events = True

    def _can_admit(self, req: Request, num_tokens: int) -> bool:
        return len(self.running) < 4 and super()._can_admit(req, num_tokens)


def test_a_subclass_with_rounds_of_its_own_gets_no_plan() -> None:
    """``plan_round`` and ``growth_victim`` restate vllm's rounds: a subclass that changes how
    a round is built gets neither, one with an admission test of its own gets no plan (its
    victims are still vllm's), while vllm itself, in the same state, gets both."""
    workload = [RequestSpec(i, 100, 100, 0.0) for i in range(12)]
    cases = (("vllm", True, True), (OwnRounds.name, False, False), (OwnAdmission.name, False, True))
    with registered(OwnRounds, OwnAdmission):
        for name, plans, victims in cases:
            engine = make_engine(name, workload, cost=ROOFLINE, num_gpu_blocks=30, watermark=0.0)
            engine.admit_arrivals()
            sched = engine.scheduler
            engine.step(sched.schedule())  # the first admissions; the rest wait
            assert sched.waiting
            assert sched.running
            assert (sched.growth_victim() is not None) == victims
            assert (sched.plan_round() is not None) == plans


@st.composite
def chunked_bursts(draw: st.DrawFn, budget: int) -> list[RequestSpec]:
    """``bursts`` for chunked prefill: prompts over the budget among them, some of budget + 1
    and k x budget + 1 tokens (a last chunk of one token, which samples the first)."""
    n = draw(st.integers(4, 30))
    t = 0.0
    out = []
    edges = [k * budget + 1 for k in (1, 2, 3) if k * budget + 1 < 200]
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.0, 0.005, 0.05, 0.5]))
        prompt = draw(st.one_of(st.integers(1, 120), st.sampled_from(edges)))
        output = draw(st.one_of(st.just(1), st.integers(1, 250 - prompt)))
        out.append(RequestSpec(i, prompt, output, t))
    return out


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    scheduler=st.sampled_from(OPTED_IN),
    budget=st.sampled_from([16, 17, 40, 64]),
    block_size=st.sampled_from([1, 16, 5]),
    blocks_tokens=st.integers(260, 900),
    mode=st.sampled_from(["recompute", "recompute", "swap"]),
    max_num_seqs=st.sampled_from([None, None, 4]),
    watermark=st.sampled_from([0.0, 0.01, 0.2]),
    unit=st.booleans(),
)
def test_chunked_queued_cohorts_equal_the_reference(
    data: st.DataObject,
    scheduler: str,
    budget: int,
    block_size: int,
    blocks_tokens: int,
    mode: str,
    max_num_seqs: int | None,
    watermark: float,
    unit: bool,
) -> None:
    """Chunked prefill while requests wait and prompts go in chunks (rounds of decodes and
    chunks inside the cohort), budgets smaller than the running count, tight memory: the run
    equals the reference, integrity checked at every event (``make_engine``)."""
    both_equal(
        data.draw(chunked_bursts(budget)),
        UnitCost() if unit else ROOFLINE,
        scheduler,
        block_size,
        blocks_tokens,
        mode,
        max_model_len=256,
        chunked=True,
        max_num_batched_tokens=budget,
        max_num_seqs=min(budget, max_num_seqs or 256),
        watermark=watermark,
    )


def test_a_chunked_queue_and_its_preemptions_run_in_one_cohort() -> None:
    """Chunked prefill, sixty requests arriving faster than they finish in memory for a few:
    the scheduler runs only the first round; every later chunk, admission and preemption
    happens inside the cohort, and the run equals the reference."""
    workload = [RequestSpec(i, 20 + i * 37 % 150, 30 + 11 * (i % 13), 0.01 * i) for i in range(60)]
    kw: dict[str, Any] = {
        "num_gpu_blocks": 60,
        "max_model_len": 512,
        "watermark": 0.0,
        "chunked": True,
        "max_num_batched_tokens": 64,
        "max_num_seqs": 64,
    }
    engine = make_engine("vllm", workload, cost=ROOFLINE, **kw)
    calls = count_schedules(engine)
    result = engine.run()
    assert calls[0] == 1
    assert sum(r.num_preemptions for r in result.requests) > 0
    ref = run(True, workload, ROOFLINE, scheduler="vllm", **kw)
    same(ref[:4], run(False, workload, ROOFLINE, scheduler="vllm", **kw)[:4])

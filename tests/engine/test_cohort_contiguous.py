"""The decode cohort on contiguous memory: sequences grow inside their regions, admissions at
events, equal to stepping every round."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from pagedkv.engine import cohort
from pagedkv.engine.cost_model import UnitCost
from pagedkv.engine.metrics import request_record
from pagedkv.engine.policies import SCHEDULERS
from pagedkv.engine.policies.contiguous import ContiguousScheduler
from pagedkv.engine.scheduler import SchedulerOutput
from pagedkv.memory.contiguous import ContiguousAllocator
from pagedkv.workloads.spec import RequestSpec
from tests.engine.test_cohort import count_schedules, loads
from tests.engine.test_fast_forward import ROOFLINE, both_equal, run, same
from tests.factories import make_engine

CONTIGUOUS = sorted(n for n, c in SCHEDULERS.items() if issubclass(c, ContiguousScheduler))
# Those whose rounds are the vllm-like ones (``static``'s are its batches').
PLANNING = [n for n in CONTIGUOUS if n != "static"]


def queues() -> st.SearchStrategy[list[RequestSpec]]:
    """Bursts that queue in a small address space, and arrivals far apart (idle gaps)."""
    return loads((2, 30), [0.0, 0.0, 0.0, 0.005, 0.05, 0.5, 3.0], 100)


@settings(max_examples=120, deadline=None)
@given(
    workload=queues(),
    scheduler=st.sampled_from(CONTIGUOUS),
    slots=st.integers(256, 1400),
    max_num_seqs=st.sampled_from([None, None, 3]),
    unit=st.booleans(),
    token_times=st.booleans(),
    budget=st.sampled_from([None, 16, 17, 40, 64]),
    ids=st.sampled_from(["none", "none", "token ids", "a group"]),
)
def test_contiguous_cohorts_equal_the_reference(
    workload: list[RequestSpec],
    scheduler: str,
    slots: int,
    max_num_seqs: int | None,
    unit: bool,
    token_times: bool,
    budget: int | None,
    ids: str,
) -> None:
    """Every contiguous policy, queues that last (the address space holds a few regions), a
    cap on running requests, chunked prefill (``budget``; prompts over it among them), token
    ids (which contiguous memory ignores) and a group (refused): the whole run (summary with
    the allocator's rounding, every request) equals the reference; integrity is checked at
    every event (``make_engine``)."""
    if ids == "token ids":
        workload = [replace(w, token_ids=tuple(range(w.prompt_len))) for w in workload]
    elif ids == "a group":
        workload = [*workload[:-1], replace(workload[-1], n=2)]
    chunked = budget is not None and scheduler != "static"  # (static's rounds are unchunked)
    both_equal(
        workload,
        UnitCost() if unit else ROOFLINE,
        scheduler,
        1,
        slots,
        "recompute",
        max_model_len=256,
        max_num_seqs=max_num_seqs if max_num_seqs or not chunked else budget,
        token_times=token_times,
        chunked=chunked,
        max_num_batched_tokens=budget if chunked else None,
    )


@settings(max_examples=80, deadline=None)
@given(
    workload=queues(),
    scheduler=st.sampled_from(PLANNING),
    slots=st.integers(256, 1400),
    budget=st.sampled_from([None, 16, 17, 40]),
)
def test_contiguous_plans_keep_their_promises(
    workload: list[RequestSpec], scheduler: str, slots: int, budget: int | None
) -> None:
    """Stepping every round with ``plan_round``'s admissions in place of ``schedule``'s when it
    plans some gives the same run; where it plans a decode, ``schedule`` admits nobody and
    every running request decodes once; a chunked plan's round, the decodes then ``fill``,
    is ``schedule``'s."""
    kw: dict[str, Any] = {"block_size": 1, "num_gpu_blocks": slots, "max_model_len": 256}
    if budget is not None:
        kw |= {"chunked": True, "max_num_batched_tokens": budget, "max_num_seqs": budget}
    engine = make_engine(scheduler, workload, cost=ROOFLINE, reference=True, **kw)
    sched = engine.scheduler
    schedule = sched.schedule

    def planned() -> SchedulerOutput:
        before = list(sched.running)
        plan = sched.plan_round()
        assert plan is not None
        if not plan.decodes:
            return plan.admitted
        if plan.chunked:  # the decodes as ``schedule`` makes them, then ``fill``
            out = SchedulerOutput()
            sched._decode_running(out)
            decoded = [c.request for c in out.chunks]
            sched.fill(out, [r for r in sched.running if r not in decoded], decoded)
            return out
        out = schedule()
        assert [c.request for c in out.chunks] == before
        assert all(c.num_new_tokens == 1 for c in out.chunks)
        return out

    sched.schedule = planned  # type: ignore[method-assign]
    result = engine.run()
    ref = run(True, workload, ROOFLINE, scheduler=scheduler, **kw)
    same(ref[1], [request_record(r) for r in result.requests])
    same(ref[2:4], (result.deadlocked, result.stuck))


@pytest.mark.parametrize("token_ids", [False, True])
@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("scheduler", ["orca-oracle", "orca-max", "firstfit-pow2"])
def test_a_contiguous_queue_runs_in_one_cohort(
    scheduler: str, chunked: bool, token_ids: bool
) -> None:
    """Forty requests at once into space for a few regions: the scheduler runs only the first
    admission round and the first decode round (after which the cohort starts: these policies
    promise no ``decodes_next``; with chunked prefill the cohort starts after the first, a
    round that is not a decode, whose policy fills chunked rounds); every later admission
    happens inside the cohort, and the run equals the reference. Token ids play no part in
    contiguous memory: they change none of it."""

    workload = [RequestSpec(i, 20 + i % 7, 30 + 11 * i, 0.0) for i in range(40)]
    if token_ids:
        workload = [replace(w, token_ids=tuple(range(w.prompt_len))) for w in workload]
    kw: dict[str, Any] = {"block_size": 1, "num_gpu_blocks": 2048, "max_model_len": 512}
    if chunked:
        kw |= {"chunked": True, "max_num_batched_tokens": 64, "max_num_seqs": 64}
    ref = run(True, workload, ROOFLINE, scheduler=scheduler, **kw)
    engine = make_engine(scheduler, workload, cost=ROOFLINE, **kw)
    assert isinstance(engine.scheduler.kv, ContiguousAllocator)
    calls = count_schedules(engine)
    result = engine.run()
    assert calls[0] == (1 if chunked else 2)
    assert max(r.admitted_time or 0.0 for r in result.requests) > 0  # (a queue formed)
    fast = run(False, workload, ROOFLINE, scheduler=scheduler, **kw)
    same(ref[:4], fast[:4])


def test_every_contiguous_policy_takes_the_cohort() -> None:
    """``plain`` admits contiguous memory for every built-in contiguous policy: each plans its
    rounds (``static`` while its batch forms, then decodes; it holds finished requests' regions
    to the batch's end, where they stop growing)."""
    workload = [RequestSpec(i, 10, 5 + 7 * i, 0.0) for i in range(6)]
    for scheduler in CONTIGUOUS:
        engine = make_engine(scheduler, workload, cost=ROOFLINE, block_size=1, num_gpu_blocks=1024)
        engine.admit_arrivals()
        assert cohort.plain(engine)
        assert engine.scheduler.plan_round() is not None


def test_static_batches_run_in_one_cohort() -> None:
    """Batches one after another: the scheduler runs the first batch's admission and first
    decode round; each later batch forms, decodes and ends inside the cohort (finished
    requests' regions held to their batch's end), equal to the reference."""

    # The first batch's four (the space's fixed slots) at once, the others while it runs.
    workload = [RequestSpec(i, 10 + i % 5, 5 + 7 * i, 0.01 * max(0, i - 3)) for i in range(20)]
    kw: dict[str, Any] = {"block_size": 1, "num_gpu_blocks": 1024, "max_model_len": 256}
    ref = run(True, workload, ROOFLINE, scheduler="static", **kw)
    engine = make_engine("static", workload, cost=ROOFLINE, **kw)
    calls = count_schedules(engine)
    result = engine.run()
    assert calls[0] == 2
    assert len({r.finish_time for r in result.requests}) > 1  # (more than one batch)
    same(ref[:4], run(False, workload, ROOFLINE, scheduler="static", **kw)[:4])

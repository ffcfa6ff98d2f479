"""The vllm-v1 policy on the event fast path: fast against reference, and its promises held to
``schedule()`` round by round (vllm_v1_plan.py)."""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from pagedkv.engine.config import SchedulerConfig
from pagedkv.engine.cost_model import CostModel, RooflineCost, UnitCost
from pagedkv.engine.engine import Engine
from pagedkv.engine.executor import SimExecutor
from pagedkv.engine.metrics import request_record, summarize
from pagedkv.engine.policies.vllm_v1 import VllmV1Scheduler
from pagedkv.engine.policies.vllm_v1_plan import _decoding
from pagedkv.engine.request import RequestStatus
from pagedkv.engine.scheduler import SchedulerOutput
from pagedkv.memory.config import CacheConfig
from pagedkv.memory.manager import KVCacheManager
from pagedkv.models.gpus import get_gpu
from pagedkv.models.models import get_model
from pagedkv.workloads.spec import RequestSpec

ROOFLINE = RooflineCost(get_gpu("A100-40GB"), get_model("OPT-13B"))
MAX_LEN = 256
BUDGETS = [16, 24, 64, 2048]


@st.composite
def workloads(draw: st.DrawFn, budget: int) -> list[RequestSpec]:
    """Bursts and gaps (queues that form and drain), one-token outputs, priorities, prompts of
    budget + 1 and k x budget + 1 tokens (a last chunk of one token), and, drawn, token ids
    with a shared prefix (prefix caching)."""
    n = draw(st.integers(1, 24))
    ids = draw(st.sampled_from([False, False, True]))
    prefix = list(range(draw(st.sampled_from([0, 8, 40]))))
    t = 0.0
    out = []
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.0, 0.005, 0.05, 0.5, 3.0]))
        long = [k * budget + 1 for k in (1, 2, 3) if k * budget + 1 < MAX_LEN - 1]
        prompt = draw(st.integers(1, 120) | st.sampled_from(long or [MAX_LEN // 2 + 1]))
        output = draw(st.just(1) | st.integers(1, MAX_LEN - prompt))
        priority = draw(st.integers(-2, 2))
        token_ids = None
        if ids:
            own = [10_000 * (i + 1) + k for k in range(prompt)]
            token_ids = tuple((prefix + own)[:prompt])
        out.append(RequestSpec(i, prompt, output, t, token_ids=token_ids, priority=priority))
    return out


@st.composite
def keyed_setups(draw: st.DrawFn) -> dict[str, Any]:
    """``setups`` under prefix caching, every prompt and planned output with ids: a request
    either follows one common sequence (its prompt and outputs a prefix of it, so a later
    prompt may hit the blocks an earlier request's decodes filled, and keys are made twice)
    or has its own ids after a shared prefix."""
    setup = draw(setups())
    prefix = list(range(draw(st.sampled_from([0, 8, 40, 64]))))
    common = [*prefix, *range(50_000, 50_000 + MAX_LEN)]
    follows = draw(st.sampled_from([0.0, 0.5, 1.0]))
    workload = []
    for i, r in enumerate(setup["workload"]):
        if draw(st.floats(0, 1)) < follows:
            whole = common
        else:
            whole = [*prefix, *range(100_000 * (i + 1), 100_000 * (i + 1) + MAX_LEN)]
        ids, outs = whole[: r.prompt_len], whole[r.prompt_len : r.prompt_len + r.output_len]
        workload.append(dataclasses.replace(r, token_ids=tuple(ids), output_token_ids=tuple(outs)))
    return setup | {"workload": workload, "prefix_caching": True}


@st.composite
def setups(draw: st.DrawFn) -> dict[str, Any]:
    budget = draw(st.sampled_from(BUDGETS))
    block_size = draw(st.sampled_from([1, 16, 5]))
    return {
        "workload": draw(workloads(budget)),
        "block_size": block_size,
        # from one longest request (preemptions, victims awaiting their async free) to ample
        "blocks": draw(
            st.integers(MAX_LEN // block_size + 2, 400 // block_size)
            | st.integers(MAX_LEN // block_size + 2, 2000 // block_size)
            | st.integers(MAX_LEN // block_size + 2, (MAX_LEN + 48) // block_size)
        ),
        "watermark": draw(st.sampled_from([0.0, 0.0, 0.05])),
        "prefix_caching": draw(st.sampled_from([False, False, True])),
        "options": {
            "max_num_batched_tokens": budget,
            "max_num_seqs": draw(st.sampled_from([min(budget, 256), 3, 1])),
            "async_scheduling": draw(st.booleans()),
            "scheduling_policy": draw(st.sampled_from(["fcfs", "fcfs", "priority"])),
            "long_prefill_token_threshold": draw(st.sampled_from([0, 0, 8])),
            "max_num_active_seqs": draw(st.sampled_from([None, None, 2])),
            "max_num_scheduled_tokens": draw(st.sampled_from([None, None, max(3, budget // 2)])),
            "scheduler_reserve_full_isl": draw(st.booleans()),
        },
        "roofline": draw(st.booleans()),
    }


def build(setup: dict[str, Any], reference: bool) -> Engine:
    options = dict(setup["options"])
    options["max_num_seqs"] = min(options["max_num_seqs"], options["max_num_batched_tokens"])
    if options["max_num_active_seqs"] is not None:
        options["max_num_active_seqs"] = min(
            options["max_num_active_seqs"], options["max_num_seqs"]
        )
    config = SchedulerConfig(scheduler="vllm-v1", max_model_len=MAX_LEN, **options)
    cache = CacheConfig(
        num_gpu_blocks=setup["blocks"],
        block_size=setup["block_size"],
        watermark=setup["watermark"],
        enable_prefix_caching=setup["prefix_caching"],
    )
    kv = VllmV1Scheduler.make_allocator(cache, config)
    cost: CostModel = ROOFLINE if setup["roofline"] else UnitCost()
    return Engine(
        VllmV1Scheduler(config, kv),
        SimExecutor(cost),
        setup["workload"],
        check_integrity=True,
        reference=reference,
    )


def outcome(engine: Engine) -> str:
    """The run's summary, requests, deadlock and cache counters (prefix hits among them), as
    JSON (byte-identical or not); under prefix caching with token ids the block pool at the
    end too (its free queue, each block's key and each key's block), which decides later hits
    without showing in a short run's records. (Without ids nothing is keyed, and growth takes
    its blocks in any order.)"""
    result = engine.run()
    summary = summarize(
        result.requests, result.totals, result.sim_time, engine.scheduler.kv.capacity
    )
    records = [request_record(r) for r in result.requests]
    both = [summary, records, result.deadlocked, result.stuck]
    kv = engine.scheduler.kv
    assert isinstance(kv, KVCacheManager)
    both.append(dataclasses.asdict(kv.stats))  # (prefix hits and evictions among them)
    if kv.config.enable_prefix_caching and engine.scheduler.has_token_ids:
        keys = [k for k in kv.gpu.block_hash if k is not None]
        primary = {k.hex(): kv.gpu.lookup(k) for k in keys}
        both += [kv.gpu.free_blocks(), [k and k.hex() for k in kv.gpu.block_hash], primary]
    return json.dumps(both, sort_keys=True)


@settings(max_examples=150, deadline=None)
@given(setup=setups())
def test_vllm_v1_fast_equals_reference(setup: dict[str, Any]) -> None:
    """Queues, preemptions by recompute, priorities, async and sync scheduling, thresholds,
    caps, watermarks and prefix caching with token ids: the fast run is the reference's, byte
    for byte, with the books checked at every event."""
    assert outcome(build(setup, True)) == outcome(build(setup, False))


@settings(max_examples=120, deadline=None)
@given(setup=keyed_setups())
def test_vllm_v1_fast_equals_reference_prefix_caching(setup: dict[str, Any]) -> None:
    """Prefix caching, every prompt with ids (the cohort runs the rounds in which nothing
    waits or prefills, async keys taken back at its end): the fast run is the reference's,
    the block pool's free queue and cache map at the end included."""
    assert outcome(build(setup, True)) == outcome(build(setup, False))


@st.composite
def pressed(draw: st.DrawFn) -> dict[str, Any]:
    """Memory short while requests finish: bursts of short prompts with long outputs in a
    pool of one to two longest requests, async scheduling, so a round short of blocks often
    meets a finished request awaiting its free (a victim itself, or ahead of the oldest).
    Drawn through a ``Random`` of a drawn seed (uniform lengths: Hypothesis's own integers
    favour the small ones, with which memory is seldom short)."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    budget = rng.choice(BUDGETS)
    bs = rng.choice([1, 5, 16])
    t = 0.0
    workload = []
    for i in range(rng.randint(2, 24)):
        t += rng.choice([0.0, 0.0, 0.005, 0.05])
        prompt = rng.choice([rng.randint(1, 60), rng.randint(1, 60), budget + 1, 2 * budget + 1])
        prompt = min(prompt, MAX_LEN - 2)
        output = rng.randint(1, MAX_LEN - prompt)
        workload.append(RequestSpec(i, prompt, output, t, priority=rng.randint(-2, 2)))
    return {
        "workload": workload,
        "block_size": bs,
        "blocks": rng.randint(MAX_LEN // bs + 2, 2 * MAX_LEN // bs),
        "watermark": 0.0,
        "prefix_caching": False,
        "roofline": rng.random() < 0.5,
        "options": {
            "max_num_batched_tokens": budget,
            "max_num_seqs": rng.choice([256, 256, 3]),
            "async_scheduling": True,
            "scheduling_policy": rng.choice(["fcfs", "priority"]),
            "long_prefill_token_threshold": rng.choice([0, 0, 8]),
            "max_num_active_seqs": None,
            "max_num_scheduled_tokens": rng.choice([None, None, max(3, budget // 2)]),
            "scheduler_reserve_full_isl": rng.random() < 0.5,
        },
    }


@settings(max_examples=100, deadline=None)
@given(setup=pressed())
def test_vllm_v1_fast_equals_reference_memory_short(setup: dict[str, Any]) -> None:
    """Rounds short of blocks beside finished requests awaiting their async free: the fast
    run is the reference's, byte for byte, the books checked at every event."""
    assert outcome(build(setup, True)) == outcome(build(setup, False))


@pytest.mark.parametrize(("ids", "caching"), [(False, False), (True, False), (True, True)])
def test_the_fast_path_runs_the_rounds_in_a_cohort(ids: bool, caching: bool) -> None:
    """Staggered arrivals at vLLM's defaults (async, FCFS, budget 2048), with or without token
    ids (a shared prefix; without prefix caching nothing reads them): the scheduler runs a
    fraction of the rounds, and the run equals the reference."""
    workload = [
        RequestSpec(
            i,
            30 + i % 5,
            80 + 37 * i,
            0.3 * i,
            token_ids=tuple(range(20)) + tuple(range(100 * i, 100 * i + 10 + i % 5))
            if ids
            else None,
        )
        for i in range(12)
    ]
    setup: dict[str, Any] = {
        "workload": workload,
        "block_size": 16,
        "blocks": 400,
        "watermark": 0.0,
        "prefix_caching": caching,
        "options": {},
        "roofline": True,
    }
    setup["options"] = {
        "max_num_batched_tokens": 2048,
        "max_num_seqs": 256,
        "async_scheduling": True,
        "scheduling_policy": "fcfs",
        "long_prefill_token_threshold": 0,
        "max_num_active_seqs": None,
        "max_num_scheduled_tokens": None,
        "scheduler_reserve_full_isl": True,
    }
    fast = build(setup, False)
    calls = [0]
    schedule = fast.scheduler.schedule

    def counted() -> SchedulerOutput:
        calls[0] += 1
        return schedule()

    fast.scheduler.schedule = counted  # type: ignore[method-assign]
    got = outcome(fast)
    assert outcome(build(setup, True)) == got
    rounds = fast.totals.iterations
    assert fast.fast_forward is not None
    assert fast.fast_forward.rounds > 0
    assert calls[0] * 10 < rounds


@settings(max_examples=150, deadline=None)
@given(setup=setups())
def test_the_promises_build_schedules_rounds(setup: dict[str, Any]) -> None:
    """Stepping every round, each round the policy plans is built the cohort's way in place
    of ``schedule()``: every decoding request's token first (victims named by
    ``growth_victim`` until the others' new blocks fit), then ``fill``; the run equals the
    reference (where no plan is made ``schedule()`` builds the round)."""
    engine = build(setup, True)
    sched = engine.scheduler
    assert isinstance(sched, VllmV1Scheduler)
    kv = sched.paged
    schedule = sched.schedule

    def planned() -> SchedulerOutput:
        plan = sched.plan_round()
        if plan is None or kv.config.enable_prefix_caching:
            # Under prefix caching a plan holds for a cohort's whole window (the last round's
            # keys are taken back at its end: ``cohort_ends``), not for a round stepped on
            # its own; the keys it made of the last step's outputs, ahead of this round's
            # appends, change nothing that schedule() reads.
            return schedule()
        assert plan.decodes
        assert not plan.resumes
        assert not plan.admitted.chunks
        out = SchedulerOutput()
        computing = [r for r in sched.running if r.status is RequestStatus.RUNNING]
        decoders = [r for r in computing if _decoding(r)]
        prefilling = [r for r in computing if r not in decoders]
        assert plan.chunked or not (prefilling or sched.waiting or sched._draining)

        def short() -> bool:
            rooms = kv.rooms([r.seq_id for r in decoders])
            return rooms.count(0) > kv.num_free_blocks

        while decoders and short():
            victim = sched.growth_victim()
            if victim is None:  # (the cohort ends: the engine steps this round)
                assert not out.preempted
                return schedule()
            if victim in decoders:
                decoders.remove(victim)
            elif victim in prefilling:
                prefilling.remove(victim)
            else:  # finished, awaiting its free (async): it frees its blocks
                assert victim in sched._draining
            sched.preempt(victim, out)
        if not decoders and not out.preempted:
            return schedule()  # (the cohort ends where nobody decodes: the engine steps it)
        for r in decoders:
            assert kv.append_slots(r.seq_id, 1) is not None
            out.chunks.append(sched._chunk(r, 1))
        if plan.chunked:
            sched.fill(out, prefilling, set(decoders), bool(out.preempted))
        return out

    sched.schedule = planned  # type: ignore[method-assign]
    got = outcome(engine)
    assert outcome(build(setup, True)) == got


class OwnWaitingPass(VllmV1Scheduler):
    """States the promise, but admits its own way."""

    name = "test-own-waiting-pass"
    decides_at_events = True

    def _schedule_waiting(self, out: SchedulerOutput, budget: int, threshold: int) -> None:
        super()._schedule_waiting(out, budget, threshold)


def test_a_subclass_with_rounds_of_its_own_gets_no_plan() -> None:
    config = SchedulerConfig(scheduler="vllm-v1", max_model_len=MAX_LEN)
    cache = CacheConfig(num_gpu_blocks=64, block_size=16)
    for cls, planned in [(VllmV1Scheduler, True), (OwnWaitingPass, False)]:
        sched = cls(config, cls.make_allocator(cache, config))
        engine = Engine(sched, SimExecutor(UnitCost()), [RequestSpec(0, 20, 30)])
        engine.admit_arrivals()
        engine.step(sched.schedule())  # its prefill: it decodes from now on
        assert (sched.plan_round() is not None) is planned
        assert (sched.growth_victim() is not None) is planned
        assert sched.decodes_next() is planned


COMMON = tuple(range(50_000, 50_000 + MAX_LEN))


def _following(i: int, prompt: int, output: int, at: float, priority: int = 0) -> RequestSpec:
    """A request whose prompt and planned outputs are a prefix of one common sequence."""
    ids, outs = COMMON[:prompt], COMMON[prompt : prompt + output]
    return RequestSpec(
        i, prompt, output, at, token_ids=ids, output_token_ids=outs, priority=priority
    )


def _own(i: int, prompt: int, output: int, at: float) -> RequestSpec:
    """A request with ids of its own (no block in common with any other)."""
    ids = tuple(range(1_000_000 * (i + 1), 1_000_000 * (i + 1) + prompt + output))
    return RequestSpec(i, prompt, output, at, token_ids=ids[:prompt], output_token_ids=ids[prompt:])


def _keyed(workload: list[RequestSpec], block_size: int, policy: str = "fcfs") -> dict[str, Any]:
    return {
        "workload": workload,
        "block_size": block_size,
        "blocks": 600 // block_size,
        "watermark": 0.0,
        "prefix_caching": True,
        "roofline": False,
        "options": {
            "max_num_batched_tokens": 2048,
            "max_num_seqs": 256,
            "async_scheduling": True,
            "scheduling_policy": policy,
            "long_prefill_token_threshold": 0,
            "max_num_active_seqs": None,
            "max_num_scheduled_tokens": None,
            "scheduler_reserve_full_isl": True,
        },
    }


@pytest.mark.parametrize("other", ["follows", "own"])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_a_finish_in_the_cohorts_last_round_keys_its_block_a_step_late(
    block_size: int, other: str
) -> None:
    """A request that finishes in a round of the cohort, a prompt arriving then that runs
    through the block its last token filled: async keys that block only after the next
    round's waiting pass (the cohort keyed it as the round ran: it admits no such prompt, and
    takes the key back where it ends: ``cohort_ends``). Beside it a request decoding the same
    sequence (its next block in the prompt's chain too) or its own. Every arrival in a span of
    rounds (one of them lines up), fast against reference."""
    for k in range(40, 70):
        beside = _following(1, 8, 80, 0.0) if other == "follows" else _own(1, 8, 80, 0.0)
        workload = [_following(0, 10, 48, 0.0), beside, _following(2, 150, 5, k + 0.5)]
        setup = _keyed(workload, block_size)
        fast = build(setup, False)
        assert outcome(fast) == outcome(build(setup, True)), k
        assert fast.fast_forward is not None
        assert fast.fast_forward.rounds > 0


@pytest.mark.parametrize("block_size", [1, 4])
def test_no_waiting_request_is_admitted_through_a_block_the_round_fills(block_size: int) -> None:
    """Two arrivals at once while a request decodes a common sequence: the head has ids of
    its own, the next one's prompt runs through the decoding request's blocks, one of which
    the round fills (keyed by vLLM's async scheduler after the waiting pass): the cohort
    admits neither then. Every arrival in a span of rounds, fast against reference."""
    for k in range(20, 40):
        workload = [
            _following(0, 10, 100, 0.0),
            _own(1, 30, 5, k + 0.5),
            _following(2, 150, 5, k + 0.5),
        ]
        fast = build(_keyed(workload, block_size), False)
        assert outcome(fast) == outcome(build(_keyed(workload, block_size), True)), k


def test_requests_that_finish_in_one_round_free_in_running_order() -> None:
    """Priority admits the later arrival first; both finish in one cohort round and free their
    blocks in the running order (the round's chunks' order, not arrival's): the free queue,
    hence which cached block an allocation evicts, is the reference's."""
    workload = [_following(0, 20, 30, 0.0, priority=2), _following(1, 24, 30, 0.0, priority=0)]
    workload += [_following(2 + i, 40 + i, 10, 40.0 + i) for i in range(3)]
    for policy in ("priority", "fcfs"):
        setup = _keyed(workload, 4, policy)
        assert outcome(build(setup, False)) == outcome(build(setup, True))

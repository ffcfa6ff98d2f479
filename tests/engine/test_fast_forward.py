"""Differential test: the closed-form fast-forward gives the same run as stepping every round."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import example, given, settings

from pagedkv.engine.cost_model import CostModel, RooflineCost, UnitCost
from pagedkv.engine.metrics import request_record, summarize
from pagedkv.engine.policies import SCHEDULERS
from pagedkv.engine.scheduler import Scheduler
from pagedkv.models.gpus import get_gpu
from pagedkv.models.models import get_model
from pagedkv.simulation import SimulationConfig, build_engine, simulate
from pagedkv.workloads.spec import RequestSpec
from tests.engine.user_policies import USER_POLICIES, WronglyOptedIn, registered
from tests.factories import make_engine

ROOFLINE = RooflineCost(get_gpu("A100-40GB"), get_model("OPT-13B"))
MAX_LEN = 256
# Every registered policy, and users' policies written by the documented recipe.
POLICIES = sorted({*SCHEDULERS, *(p.name for p in USER_POLICIES)})
# Policies whose schedule ignores chunked prefill (a budget below a prompt never admits it).
UNCHUNKED = {"static", *(p.name for p in USER_POLICIES if p.name != "test-only-its-memory")}
# Token budgets with chunked prefill: prompts of budget + 1 and k x budget + 1 tokens leave one
# prompt token for a last chunk, which samples the first token (not a decode).
BUDGETS = [16, 32, 64, 512]


@pytest.fixture(autouse=True, scope="module")
def _user_policies() -> Iterator[None]:
    with registered(*USER_POLICIES):
        yield


@st.composite
def workloads(draw: st.DrawFn) -> list[RequestSpec]:
    n = draw(st.integers(1, 24))
    t = 0.0
    out = []
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.01, 0.05, 0.3, 1.0, 2.5]))
        prompt = draw(st.integers(1, 120) | st.sampled_from([17, 33, 49, 65, 97, 129, 193]))
        output = draw(st.integers(1, MAX_LEN - prompt))
        out.append(RequestSpec(i, prompt, output, t))
    return out


def same(a: Any, b: Any) -> None:
    """Byte-identical: the same JSON (the clock counts integer ticks, so the closed forms and
    the round-by-round sums are the same integers, and every float derived from them is the
    same float)."""
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def run(reference: bool, workload: list[RequestSpec], cost: CostModel, **kw: Any) -> Any:
    engine = make_engine(kw.pop("scheduler"), workload, cost=cost, reference=reference, **kw)
    result = engine.run()
    summary = summarize(
        result.requests, result.totals, result.sim_time, engine.scheduler.kv.capacity
    )
    records = [request_record(r) for r in result.requests]
    return summary, records, result.deadlocked, result.stuck, engine


def both_equal(
    workload: list[RequestSpec],
    cost: CostModel,
    scheduler: str,
    block_size: int,
    blocks_tokens: int,
    mode: str,
    **extra: Any,
) -> tuple[Any, Any]:
    """Run ``workload`` stepping every round and fast-forwarded, on ``blocks_tokens`` slots of
    GPU memory in blocks of ``block_size`` (and 64 CPU blocks); assert both runs are the same
    (summary, requests, deadlock); returns both."""
    kw: dict[str, Any] = {
        "scheduler": scheduler,
        "block_size": block_size,
        "num_gpu_blocks": blocks_tokens // block_size,
        "num_cpu_blocks": 64,
        "preemption_mode": mode,
        **extra,
    }
    ref = run(True, workload, cost, **kw)
    fast = run(False, workload, cost, **kw)
    same(ref[:4], fast[:4])
    return ref, fast


@settings(max_examples=100, deadline=None)
@given(
    workload=workloads(),
    scheduler=st.sampled_from(POLICIES),
    block_size=st.sampled_from([1, 16, 7]),
    blocks_tokens=st.integers(MAX_LEN + 32, 2000),
    mode=st.sampled_from(["recompute", "swap"]),
    chunked=st.booleans(),
    budget=st.sampled_from(BUDGETS),
    roofline=st.booleans(),
)
def test_fast_forward_equals_reference(
    workload: list[RequestSpec],
    scheduler: str,
    block_size: int,
    blocks_tokens: int,
    mode: str,
    chunked: bool,
    budget: int,
    roofline: bool,
) -> None:
    chunked = chunked and scheduler not in UNCHUNKED
    both_equal(
        workload,
        ROOFLINE if roofline else UnitCost(),
        scheduler,
        block_size,
        blocks_tokens,
        mode,
        chunked=chunked,
        max_num_batched_tokens=budget if chunked else None,
        max_num_seqs=min(budget, 256) if chunked else None,
        max_model_len=MAX_LEN,
    )


@pytest.mark.parametrize("budget", [16, 32])
@pytest.mark.parametrize("k", [1, 2, 5])
@pytest.mark.parametrize("roofline", [False, True])
def test_a_last_prompt_token_alone_is_not_a_decode(budget: int, k: int, roofline: bool) -> None:
    """Chunked prefill of k x budget + 1 tokens, requests arriving apart: the last chunk is one
    token, computed like a decode while it samples the first token (once a crash)."""
    workload = [RequestSpec(i, k * budget + 1, 5 + i, 0.4 * i) for i in range(4)]
    _, fast = both_equal(
        workload,
        ROOFLINE if roofline else UnitCost(),
        "vllm",
        16,
        2048,
        "recompute",
        chunked=True,
        max_num_batched_tokens=budget,
        max_num_seqs=budget,
        max_model_len=MAX_LEN,
    )
    assert all(r["first_token_time"] is not None for r in fast[1])


def test_the_promise_passes_only_to_subclasses_that_change_no_behaviour() -> None:
    builtin = [
        "vllm",
        "vllm-v1",
        "reserve",
        "static",
        "greedy-nopreempt",
        "orca-max",
        "firstfit-max",
    ]
    assert all(SCHEDULERS[name].decides_at_events for name in builtin)  # each tested above
    by_name = {p.name: p for p in USER_POLICIES}
    assert not by_name["test-every-8th-round"].decides_at_events  # the default: no promise
    assert not by_name["test-capped-admissions"].decides_at_events  # overrides schedule()
    assert by_name["test-only-its-memory"].decides_at_events  # only its memory differs
    assert by_name["test-plans-no-round"].decides_at_events  # stated, and kept
    assert WronglyOptedIn.decides_at_events  # stated: believed, and tested below


@pytest.mark.parametrize("policy", [p for p in USER_POLICIES if not p.decides_at_events])
def test_a_policy_without_the_promise_steps_every_round(policy: type[Scheduler]) -> None:
    workload = [RequestSpec(i, 20, 60, 0.0) for i in range(6)]
    engine = make_engine(policy.name, workload, num_gpu_blocks=200)
    result = engine.run()
    assert engine.fast_forward is None
    assert all(r.finish_time is not None for r in result.requests)


def test_a_wrong_promise_is_caught_by_the_differential_test() -> None:
    """The round counter decides admissions, so skipping rounds admits at other times."""
    workload = [RequestSpec(i, 20, 100, 0.0) for i in range(2)]
    workload += [RequestSpec(2 + i, 20, 100, 3.0 + 7.3 * i) for i in range(6)]
    with registered(WronglyOptedIn), pytest.raises(AssertionError):
        both_equal(workload, UnitCost(), WronglyOptedIn.name, 16, 4096, "recompute")


def test_fast_forward_skips_rounds() -> None:
    """On a steady decode load the fast path runs far fewer scheduler iterations."""
    workload = [RequestSpec(i, 20, 200, 0.0) for i in range(8)]
    engine = make_engine("vllm", workload, num_gpu_blocks=200)
    engine.run()
    assert engine.fast_forward is not None
    assert engine.fast_forward.rounds > 10 * engine.fast_forward.windows


@settings(max_examples=40, deadline=None)
@given(
    workload=workloads(),
    scheduler=st.sampled_from(POLICIES),
    block_size=st.sampled_from([1, 16, 7]),
    blocks_tokens=st.integers(MAX_LEN + 32, 2000),
    mode=st.sampled_from(["recompute", "swap"]),
    chunked=st.booleans(),
)
def test_decodes_next_keeps_its_promise(
    workload: list[RequestSpec],
    scheduler: str,
    block_size: int,
    blocks_tokens: int,
    mode: str,
    chunked: bool,
) -> None:
    """Whenever a policy says the next round is a plain decode (the fast-forward then starts a
    window without running that round), the round it schedules is one: every running request
    computes exactly its next token, nobody is admitted or resumed; only blocks running short
    (a round the cohort stops before) may change the set: a preemption, or for a policy that
    does not preempt, a request that stalls."""
    chunked = chunked and scheduler not in UNCHUNKED
    engine = make_engine(
        scheduler,
        workload,
        block_size=block_size,
        num_gpu_blocks=blocks_tokens // block_size,
        num_cpu_blocks=64,
        preemption_mode=mode,
        chunked=chunked,
        max_num_batched_tokens=512 if chunked else None,
        max_model_len=MAX_LEN,
        reference=True,
    )
    sched = engine.scheduler
    schedule = sched.schedule

    def checked() -> Any:
        promise = sched.decodes_next()
        before = list(sched.running)
        out = schedule()
        if promise:
            assert not out.swap_in
            if not out.preempted:
                got = [c.request for c in out.chunks]
                if sched.preempts:
                    assert got == before
                else:  # one short of a block stalls
                    assert got == [r for r in before if r in got]
                for c in out.chunks:
                    assert c.num_new_tokens == 1
                    assert c.num_cached_tokens == c.request.num_tokens - 1
        return out

    sched.schedule = checked  # type: ignore[method-assign]
    engine.run()


def test_an_admission_round_starts_a_window() -> None:
    """With staggered arrivals, vllm promises the decode round after each admission, so the
    fast path pays one scheduler round per arrival and none to confirm a decode."""
    workload = [RequestSpec(i, 30, 300, 0.7 * i) for i in range(10)]
    engine = make_engine("vllm", workload, num_gpu_blocks=400, max_model_len=512, cost=ROOFLINE)
    result = engine.run()
    assert all(r.finish_time is not None for r in result.requests)
    ff = engine.fast_forward
    assert ff is not None
    assert engine.totals.iterations - ff.rounds == len(workload)


@pytest.mark.parametrize("token_times", [False, True])
def test_an_arrival_at_a_rounds_end_falls_on_the_same_side_in_both_loops(token_times: bool) -> None:
    """Under a unit clock, arrivals on a 0.1 s grid tie round ends exactly. The reference loop
    adds rounds one by one and the fast path sums them, so their clocks differ in the last bits
    (here 7.3 + 1.0 against 8.3 - 7.3); ``Ledger.arrived`` puts such a tie on the same side for
    both (a Hypothesis draw found this workload: the fast path decoded once before admitting)."""
    arrivals = [0.3, 0.3, 1.3, 3.8, 4.8, 5.8, *[8.3] * 18]
    workload = [RequestSpec(i, 1, 109 if i == 0 else 1, t) for i, t in enumerate(arrivals)]
    for scheduler in POLICIES:
        both_equal(
            workload,
            UnitCost(),
            scheduler,
            1,
            288,
            "recompute",
            max_model_len=MAX_LEN,
            token_times=token_times,
        )


# The cases a second fast path (per-event windows over every running request) once served;
# the cohort runs them now, or the engine steps (prefix caching with groups; a policy that
# plans no round while requests wait).
FORMER_WINDOWS = ("ids", "pinned", "caching-groups", "greedy", "reserve-groups", "plans-no-round")


@st.composite
def former_windows(draw: st.DrawFn) -> dict[str, Any]:
    """A flat config of one of ``FORMER_WINDOWS``: token ids without prefix caching (chat
    turns, shared prefixes), blocks shared with pinned prefixes, parallel samples under prefix
    caching, greedy-nopreempt with a queue, reserve with groups, a policy that opts in but
    plans no round; small pools, so queues form and (where the policy may) preemptions."""
    case = draw(st.sampled_from(FORMER_WINDOWS))
    bs = draw(st.sampled_from([1, 7, 16]))
    flat: dict[str, Any] = {
        "workload": draw(st.sampled_from(["chat", "shared-prefix"])),
        "seed": draw(st.integers(0, 9)),
        "prefix_len": draw(st.integers(1, 40)),
        "lengths": draw(st.sampled_from(["fixed", "alpaca-like"])),
        "block_size": bs,
        "num_gpu_blocks": draw(st.integers(260, 1200)) // bs,
        "max_model_len": 256,
        "swap_space": draw(st.sampled_from([0.0, 4.0])),
        "preemption_mode": draw(st.sampled_from(["recompute", "swap"])),
        "cost_model": draw(st.sampled_from(["unit", "roofline"])),
        "scheduler": draw(st.sampled_from(["vllm", "reserve", "greedy-nopreempt"])),
    }
    if flat["lengths"] == "fixed":
        flat |= {"prompt_len": draw(st.integers(1, 40)), "output_len": draw(st.integers(1, 60))}
    if flat["workload"] == "chat":
        flat |= {"num_sessions": draw(st.integers(1, 8)), "chat_turns": draw(st.integers(1, 4))}
        flat["think_time_mean"] = draw(st.sampled_from([0.0, 1.0]))
    else:
        flat |= {"num_requests": draw(st.integers(1, 24)), "num_prefixes": draw(st.integers(1, 3))}
        flat["request_rate"] = draw(st.sampled_from([1.0, 20.0]))
    samples = draw(st.integers(2, 3))
    if case == "pinned":
        flat["enable_pinned_prefixes"] = True
    elif case == "caching-groups":
        flat |= {"enable_prefix_caching": True, "num_samples": samples}
    elif case == "greedy":
        flat["scheduler"] = "greedy-nopreempt"
    elif case == "reserve-groups":
        flat |= {"scheduler": "reserve", "num_samples": samples}
    elif case == "plans-no-round":
        flat["scheduler"] = "test-plans-no-round"
    if case in ("ids", "pinned", "greedy") and draw(st.booleans()):
        flat["num_samples"] = samples
    return flat


@settings(max_examples=150, deadline=None)
@given(flat=former_windows())
@example(  # a group that fits the pool but not beside the pins it does not share: rejected
    flat={
        "workload": "chat",
        "seed": 0,
        "prefix_len": 2,
        "lengths": "alpaca-like",
        "block_size": 7,
        "num_gpu_blocks": 38,
        "max_model_len": 256,
        "swap_space": 0.0,
        "preemption_mode": "recompute",
        "cost_model": "unit",
        "scheduler": "vllm",
        "num_sessions": 3,
        "chat_turns": 2,
        "think_time_mean": 0.0,
        "enable_pinned_prefixes": True,
        "num_samples": 2,
    }
)
def test_the_former_windows_cases_equal_the_reference(flat: dict[str, Any]) -> None:
    """Each case fast and stepped, with ``check_integrity()`` at every event (the cohort's,
    its members' memory growing in the books included): the same summary and records."""
    config = SimulationConfig.from_flat(flat)
    fast = simulate(config, check_integrity=True)
    ref = simulate(dataclasses.replace(config, reference=True), check_integrity=True)
    same(fast.summary, ref.summary)
    same(fast.requests, ref.requests)


@pytest.mark.parametrize(
    "extra",
    [
        {"workload": "chat"},  # token ids nothing reads
        {"workload": "chat", "prefix_len": 32, "enable_pinned_prefixes": True},
        {"workload": "sharegpt-like", "scheduler": "greedy-nopreempt"},
        {"workload": "sharegpt-like", "scheduler": "reserve", "num_samples": 2},
    ],
)
def test_the_former_windows_cases_run_in_the_cohort(extra: dict[str, Any]) -> None:
    """The cohort takes them: most rounds are skipped (stepping would skip none)."""
    size = {"num_sessions": 60} if extra["workload"] == "chat" else {"num_requests": 200}
    flat = {"seed": 0, "request_rate": 1.0} | size | extra
    engine = build_engine(SimulationConfig.from_flat(flat))
    result = engine.run()
    ff = engine.fast_forward
    assert ff is not None
    assert all(r.finish_time is not None for r in result.requests)
    assert ff.rounds > 2 * (result.totals.iterations - ff.rounds)

"""Explicit (pinned) prefix sharing through the engine: registration at build, copy-on-write
copies in the iteration's output, the fast-forward against stepping every round, what it
saves against no sharing, and the configurations it refuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import event, given, settings

from pagedkv.cli import main
from pagedkv.engine.clock import TICKS_PER_SECOND
from pagedkv.engine.config import PreemptionMode, SchedulerConfig
from pagedkv.engine.cost_model import CostModel, UnitCost
from pagedkv.engine.engine import Engine
from pagedkv.engine.executor import SimExecutor
from pagedkv.engine.metrics import request_record, summarize
from pagedkv.engine.pinned_prefixes import (
    account_prefill,
    pinned_setup,
    register_workload_prefixes,
    workload_prefixes,
)
from pagedkv.engine.policies import SCHEDULERS
from pagedkv.engine.request import RequestStatus
from pagedkv.errors import ConfigError
from pagedkv.experiments import shared_prefix
from pagedkv.memory.config import CacheConfig
from pagedkv.memory.manager import KVCacheManager
from pagedkv.memory.token_runs import TokenIds
from pagedkv.simulation import SimulationConfig, build_engine, simulate
from pagedkv.workloads.spec import RequestSpec
from pagedkv.workloads.token_ids import own_ids, prefix_ids, with_prefix_ids
from tests.engine.test_fast_forward import ROOFLINE, same

SHARED: dict[str, Any] = {
    "workload": "shared-prefix",
    "prefix_len": 100,
    "num_prefixes": 2,
    "share_ratio": 1.0,
    "num_requests": 40,
    "lengths": "alpaca-like",
    "request_rate": 20.0,
    "num_gpu_blocks": 160,
    "block_size": 16,
    "seed": 3,
}


def run_flat(**kw: Any) -> dict[str, Any]:
    config = SimulationConfig.from_flat({**SHARED, **kw})
    return simulate(config, check_integrity=True).to_dict()


# ----- through simulate -------------------------------------------------------------------
@pytest.mark.parametrize("block_size", [1, 16, 7])
def test_explicit_mode_finishes_everything_and_saves_blocks(block_size: int) -> None:
    blocks = 160 * 16 // block_size
    off = run_flat(block_size=block_size, num_gpu_blocks=blocks)["summary"]
    on = run_flat(block_size=block_size, num_gpu_blocks=blocks, enable_pinned_prefixes=True)
    summary = on["summary"]
    assert summary["finished"] == summary["num_requests"] == 40
    assert not summary["deadlocked"]
    pinned = summary["pinned"]
    assert pinned["prefixes"] == 2
    assert pinned["tokens"] == 200
    assert pinned["blocks"] == 2 * -(-100 // block_size)
    # every request starts with a registered prefix: each admission is served 100 tokens
    assert pinned["hit_tokens"] >= 40 * 100
    assert summary["prefix_cache"]["hit_tokens"] == pinned["hit_tokens"]
    assert summary["sharing"]["saved_fraction"] > 0.0 == off["sharing"]["saved_fraction"]
    # what the pins save runs more requests at once in the same memory
    assert summary["mean_running"] > off["mean_running"]


def test_prefixes_are_computed_once_before_any_request() -> None:
    result = run_flat(enable_pinned_prefixes=True)
    prefill = result["summary"]["pinned"]["prefill_time"]
    assert prefill > 0.0
    for r in result["requests"]:
        assert r["first_token_time"] > prefill  # t = 0 arrivals wait for the prefixes


def test_without_shared_prefixes_explicit_mode_changes_nothing() -> None:
    off = run_flat(share_ratio=0.0)
    on = run_flat(share_ratio=0.0, enable_pinned_prefixes=True)
    assert on["summary"]["pinned"]["prefixes"] == 0
    assert on["requests"] == off["requests"]
    assert on["summary"]["sharing"] == off["summary"]["sharing"]


@pytest.mark.parametrize(
    "kw",
    [
        {"scheduler": "vllm", "block_size": 7},
        {"scheduler": "vllm", "block_size": 1, "num_gpu_blocks": 2560, "num_requests": 12},
        {"scheduler": "vllm", "preemption_mode": "swap", "num_gpu_blocks": 80},
        {
            "scheduler": "vllm",
            "enable_chunked_prefill": True,
            "max_num_batched_tokens": 64,
            "max_num_seqs": 16,
        },
        {"scheduler": "reserve", "num_samples": 2},
        {"scheduler": "greedy-nopreempt"},
    ],
)
def test_fast_forward_equals_reference(kw: dict[str, Any]) -> None:
    base = {**kw, "enable_pinned_prefixes": True}
    ref, fast = run_flat(**base, reference=True), run_flat(**base)
    assert ref["summary"]["finished"] == ref["summary"]["num_requests"]
    same(ref["summary"], fast["summary"])
    same(ref["requests"], fast["requests"])


def test_admission_hands_the_copy_of_the_partial_block_to_the_executor() -> None:
    # prefix_len 100 = 6 full blocks of 16 and 4 tokens in a partial seventh
    engine = build_engine(SimulationConfig.from_flat({**SHARED, "enable_pinned_prefixes": True}))
    kv = engine.scheduler.kv
    assert isinstance(kv, KVCacheManager)
    partial = {p.blocks[-1] for p in kv.pinned_prefixes()}
    engine.ledger.wait_until(TICKS_PER_SECOND)  # a few arrivals (1 s)
    engine.admit_arrivals()
    out = engine.scheduler.schedule()
    assert out.chunks
    assert len(out.copies) == len(out.chunks)  # one copy per admitted request
    for chunk, copy in zip(out.chunks, out.copies, strict=True):
        assert copy.src in partial
        assert kv.block_ids(chunk.request.seq_id)[6] == copy.dst
        assert chunk.num_cached_tokens == 100


# ----- bad configurations ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "what"),
    [
        ({"enable_prefix_caching": True}, "excludes enable_prefix_caching"),
        ({"scheduler": "orca-oracle"}, "contiguous region"),
        ({"scheduler": "contiguous-slots"}, "contiguous region"),
        ({"scheduler": "static"}, "contiguous region"),
        ({"enable_pinned_prefixes": "yes"}, "enable_pinned_prefixes"),
    ],
)
def test_bad_combinations_are_named(kw: dict[str, Any], what: str) -> None:
    with pytest.raises(ConfigError, match=what) as err:
        SimulationConfig.from_flat({**SHARED, "enable_pinned_prefixes": True, **kw})
    assert err.value.field == "enable_pinned_prefixes"


def test_prefixes_that_do_not_fit_fail_before_the_run() -> None:
    config = SimulationConfig.from_flat(
        {**SHARED, "num_gpu_blocks": 12, "enable_pinned_prefixes": True}
    )
    with pytest.raises(ConfigError, match="free blocks above the watermark"):
        build_engine(config)


def test_cli_flag(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    flags = ["--workload", "translation", "--num-requests", "20", "--shots", "5"]
    assert main(["simulate", *flags, "--enable-pinned-prefixes", "--json", str(path)]) == 0
    assert json.loads(path.read_text())["summary"]["pinned"]["tokens"] == 341
    bad = [*flags, "--enable-pinned-prefixes", "--enable-prefix-caching"]
    assert main(["simulate", *bad]) == 2


def test_yaml_key_and_the_shared_prefix_experiment_variant(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("workload: translation\nenable_pinned_prefixes: true\n")
    assert SimulationConfig.from_yaml(path).hardware.enable_pinned_prefixes
    points = shared_prefix.plan(True, [0]).points
    pinned = [p for p in points if p.config["setting"] == shared_prefix.PINNED]
    assert len(pinned) == len(shared_prefix.SHOTS)
    for p in pinned:
        assert SimulationConfig.from_flat(p.flat).hardware.enable_pinned_prefixes


def test_workload_prefixes_take_the_longest_and_refuse_two_prefixes_under_one_id() -> None:
    def spec(i: int, ids: TokenIds, label: str) -> RequestSpec:
        extra = (("prefix_id", label), ("prefix_len", "10"))
        return RequestSpec(i, len(ids), 4, 0.0, token_ids=ids, extra=extra)

    a = spec(0, prefix_ids(0, 6) + own_ids(0, 0, 1), "0")  # a prompt shorter than its prefix
    b = spec(1, prefix_ids(0, 10) + own_ids(1, 0, 3), "0")
    c = spec(2, own_ids(2, 0, 8), "private")
    assert workload_prefixes([a, b, c]) == {"0": prefix_ids(0, 10)}
    with pytest.raises(ConfigError, match="must name one prefix"):
        workload_prefixes([b, spec(3, prefix_ids(1, 12), "0")])


# ----- randomized differential: fast-forward against stepping every round ---------------------
def pinned_engine(
    workload: list[RequestSpec], scheduler: str, block_size: int, blocks: int, **kw: Any
) -> Engine:
    """An engine with the workload's prefixes pinned, integrity checked every iteration."""
    sched = SchedulerConfig(
        scheduler=scheduler,
        max_model_len=256,
        preemption_mode=PreemptionMode(kw.pop("mode")),
        enable_chunked_prefill=kw.pop("chunked"),
    )
    cache = CacheConfig(
        num_gpu_blocks=blocks,
        block_size=block_size,
        num_cpu_blocks=64,
        enable_pinned_prefixes=True,
    )
    cls = SCHEDULERS[scheduler]
    kv = cls.make_allocator(cache, sched)
    assert isinstance(kv, KVCacheManager)
    cost: CostModel = ROOFLINE if kw.pop("roofline") else UnitCost()
    engine = Engine(cls(sched, kv), SimExecutor(cost), workload, check_integrity=True, **kw)
    register_workload_prefixes(kv, workload)
    account_prefill(engine, pinned_setup(kv, cost))
    return engine


@st.composite
def prefixed_workloads(draw: st.DrawFn) -> list[RequestSpec]:
    """Requests over two prefixes (23 and 40 tokens) and private ones, some prompts shorter
    than their prefix; ids as a trace with prefix columns gets them."""
    lens = {0: 23, 1: 40}
    out = []
    t = 0.0
    for i in range(draw(st.integers(1, 14))):
        t += draw(st.sampled_from([0.0, 0.01, 0.3, 1.0]))
        k = draw(st.sampled_from([0, 1, None]))
        extra = (("prefix_id", str(k)), ("prefix_len", str(lens[k]))) if k is not None else ()
        prompt = draw(st.integers(1, 100))
        output = draw(st.integers(1, 80))
        n = draw(st.sampled_from([1, 1, 1, 2]))
        out.append(RequestSpec(i, prompt, output, t, extra=extra, n=n))
    return with_prefix_ids(out)


@settings(max_examples=40, deadline=None)
@given(
    workload=prefixed_workloads(),
    scheduler=st.sampled_from(["vllm", "reserve", "greedy-nopreempt"]),
    block_size=st.sampled_from([1, 16, 7]),
    blocks_tokens=st.integers(400, 1500),
    mode=st.sampled_from(["recompute", "swap"]),
    chunked=st.booleans(),
    roofline=st.booleans(),
)
def test_fast_forward_equals_reference_with_pins(
    workload: list[RequestSpec],
    scheduler: str,
    block_size: int,
    blocks_tokens: int,
    mode: str,
    chunked: bool,
    roofline: bool,
) -> None:
    runs = []
    for reference in (True, False):
        engine = pinned_engine(
            workload,
            scheduler,
            block_size,
            blocks_tokens // block_size,
            mode=mode,
            chunked=chunked,
            roofline=roofline,
            reference=reference,
        )
        result = engine.run()
        kv = engine.scheduler.kv
        summary = summarize(result.requests, result.totals, result.sim_time, kv.capacity)
        records = [request_record(r) for r in result.requests]
        assert isinstance(kv, KVCacheManager)
        runs.append((summary, records, result.deadlocked, kv.stats.prefix_hit_tokens))
    same(runs[0], runs[1])
    if scheduler != "greedy-nopreempt":  # the lesson's policy can stall with or without pins
        assert not runs[0][2]
    event("pinned hits" if runs[0][3] else "no hits")


def test_a_group_that_cannot_fit_beside_the_pins_is_rejected_not_deadlocked() -> None:
    """The pins hold their blocks for good: a group whose worst case fits the pool but not
    what the pins it does not share leave is rejected at arrival (with the pins named), so
    the run ends without a deadlock, and every group it admits finishes."""
    config = SimulationConfig.from_flat(
        {
            "workload": "chat",
            "prefix_len": 2,
            "lengths": "alpaca-like",
            "block_size": 7,
            "num_gpu_blocks": 38,
            "num_sessions": 3,
            "chat_turns": 2,
            "think_time_mean": 0.0,
            "enable_pinned_prefixes": True,
            "num_samples": 2,
            "cost_model": "unit",
        }
    )
    engine = build_engine(config)
    kv = engine.scheduler.kv
    assert isinstance(kv, KVCacheManager)
    pinned = kv.num_pinned_blocks
    result = engine.run()
    assert not result.deadlocked
    rejected = [r for r in result.requests if r.reject_reason is not None]
    assert rejected, "the pool is sized so that some group cannot fit beside the pins"
    rejected = [r for r in rejected if "parent" not in str(r.reject_reason)]
    for r in rejected:  # (a follow-up of a rejected turn is rejected with it)
        assert "held by pinned prefixes" in str(r.reject_reason)
    bs = config.hardware.block_size
    fits_pool = []
    for r in rejected:
        shared = r.prompt_len // bs
        fits_pool.append(shared + r.n * (-(-r.max_kv_tokens // bs) - shared) <= 38)
    assert any(fits_pool), "some group fits the whole pool: the pins are why it is rejected"
    assert pinned > 0
    for r in result.requests:
        assert r.reject_reason is not None or r.status is RequestStatus.FINISHED

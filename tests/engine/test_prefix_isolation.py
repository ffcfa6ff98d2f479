"""Sharing at the engine level, checked slot by slot by a shadow executor (``shadow_executor``).

* Two different prefixes never share a block: a shared-prefix workload of K prefixes runs with
  caching on, and at every step no block a sequence holds has tokens of two prefixes in it.
* Any workload of shared prefixes, duplicate prompts, parallel samples and beam searches, under
  any pool size, preemption mode, eviction policy and chunked prefill: every slot a sequence
  reads holds its own K/V label, every cached block holds what its key stands for, every table
  holds exactly the computed tokens (Hypothesis).
* Regressions: a request preempted after its chunk was scheduled in the same step (chunked
  prefill schedules decodes before older requests' prefill chunks).
* The checker has teeth: an executor that drops copies, or copies before swapping out, fails.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import hypothesis.strategies as st
import pytest
from hypothesis import event, given, settings

from pagedkv.engine.config import PreemptionMode, SchedulerConfig
from pagedkv.engine.engine import Engine, EngineRun
from pagedkv.engine.policies import SCHEDULERS
from pagedkv.engine.scheduler import SchedulerOutput
from pagedkv.memory.config import CacheConfig, EvictionPolicy
from pagedkv.memory.manager import KVCacheManager
from pagedkv.workloads import WorkloadConfig, make_workload
from pagedkv.workloads.arrivals import Arrival
from pagedkv.workloads.config import SuffixLengths, WorkloadKind
from pagedkv.workloads.spec import RequestSpec
from pagedkv.workloads.token_ids import own_ids, prefix_ids
from tests.engine.shadow_executor import ShadowExecutor
from tests.factories import BLOCK_SIZES


def run_shadow(
    specs: list[RequestSpec],
    cache: CacheConfig,
    sched: SchedulerConfig,
    executor: type[ShadowExecutor] = ShadowExecutor,
) -> tuple[EngineRun, ShadowExecutor, KVCacheManager]:
    policy = SCHEDULERS[sched.scheduler]
    kv = policy.make_allocator(cache, sched)
    assert isinstance(kv, KVCacheManager)
    shadow = executor(kv)
    run = Engine(policy(sched, kv), shadow, specs, check_integrity=True).run()
    assert not run.deadlocked
    return run, shadow, kv


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("prefix_len", [24, 33])
def test_two_different_prefixes_never_share_a_block(block_size: int, prefix_len: int) -> None:
    """K = 3 prefixes, Zipf popularity, 70 % sharers, a pool small enough to evict: at every
    step each block holds tokens of at most one prefix (read from the slots), and sharing
    did happen (hit tokens > 0)."""
    specs = make_workload(
        WorkloadConfig(
            kind=WorkloadKind.SHARED_PREFIX,
            prefix_len=prefix_len,
            num_prefixes=3,
            share_ratio=0.7,
            num_requests=24,
            lengths=SuffixLengths.UNIFORM,
            min_prompt_len=1,
            max_prompt_len=12,
            min_output_len=1,
            max_output_len=8,
            arrival=Arrival.POISSON,
            request_rate=0.5,
            seed=3,
        )
    )
    assert len({dict(r.extra)["prefix_id"] for r in specs}) == 4  # 3 prefixes and private
    blocks = 3 * (prefix_len + 20) // block_size + 4
    cache = CacheConfig(blocks, block_size, 0, watermark=0.0, enable_prefix_caching=True)
    run, shadow, kv = run_shadow(specs, cache, SchedulerConfig(max_model_len=128))
    assert all(r.num_output_tokens == r.output_len for r in run.requests)
    assert kv.stats.prefix_hit_tokens > 0
    assert shadow.checked_slots > 0
    assert shadow.steps == run.totals.iterations


# ----- any workload, any pool -------------------------------------------------------------
@st.composite
def sharing_runs(draw: st.DrawFn) -> tuple[list[RequestSpec], CacheConfig, SchedulerConfig]:
    prefixes = [prefix_ids(k, draw(st.integers(1, 20))) for k in range(3)]
    specs: list[RequestSpec] = []
    for r in range(draw(st.integers(2, 9))):
        kind = draw(st.sampled_from(["prefix", "prefix", "private", "duplicate"]))
        if kind == "duplicate" and specs:
            ids = draw(st.sampled_from(specs)).token_ids
        elif kind == "private":
            ids = own_ids(r, 0, draw(st.integers(1, 20)))
        else:
            ids = draw(st.sampled_from(prefixes)) + own_ids(r, 0, draw(st.integers(0, 10)))
        assert ids is not None
        # one sequence, parallel samples, or a beam search (simulated forks and deaths)
        n, beams = draw(st.sampled_from([(1, 1), (1, 1), (2, 1), (3, 1), (1, 2), (1, 4)]))
        specs.append(
            RequestSpec(
                r,
                len(ids),
                draw(st.integers(1, 12)),
                draw(st.floats(0, 6)),
                token_ids=ids,
                n=n,
                beam_width=beams,
            )
        )
    specs.sort(key=lambda s: s.arrival_time)
    specs = [replace(s, request_id=i) for i, s in enumerate(specs)]
    bs = draw(st.sampled_from([1, 2, 3, 4, 16]))
    need = [-(-s.final_len // bs) for s in specs]
    width = [max(s.n, s.beam_width) for s in specs]
    largest = max(b * w for b, w in zip(need, width, strict=True)) + 1  # a group fits alone
    blocks = max(largest, sum(need) // draw(st.sampled_from([1, 2, 3, 5])))
    chunked = draw(st.booleans())
    sched = SchedulerConfig(
        max_model_len=128,
        preemption_mode=draw(st.sampled_from(list(PreemptionMode))),
        enable_chunked_prefill=chunked,
        max_num_batched_tokens=draw(st.sampled_from([4, 8, 16])) if chunked else None,
        max_num_seqs=4 if chunked else 256,
    )
    cache = CacheConfig(
        blocks,
        bs,
        draw(st.sampled_from([0, 4, 64])),
        watermark=0.0,
        enable_prefix_caching=draw(st.booleans()),
        eviction_policy=draw(st.sampled_from(list(EvictionPolicy))),
    )
    return specs, cache, sched


@settings(max_examples=150, deadline=None)
@given(sharing_runs())
def test_every_read_sees_its_own_kv(
    case: tuple[list[RequestSpec], CacheConfig, SchedulerConfig],
) -> None:
    specs, cache, sched = case
    run, shadow, kv = run_shadow(specs, cache, sched)
    assert all(r.num_output_tokens == r.output_len for r in run.requests)
    for name, happened in (
        ("prefix hit", kv.stats.prefix_hit_tokens > 0),
        ("copy-on-write", shadow.copies > 0),
        ("swap out", run.totals.swap_outs > 0),
        ("preemption", run.totals.preemptions > 0),
        ("eviction", kv.stats.evictions > 0),
    ):
        if happened:
            event(name)


# ----- regressions ---------------------------------------------------------------------------
def _decode_victim_workload() -> list[RequestSpec]:
    """Found by the Hypothesis test above: request 2 (19 tokens) is recomputed in chunks while
    request 3, newer, decodes; request 2's next chunk then needs a block. The old victim rule
    (the newest running request) preempted request 3 after its decode was scheduled: its
    chunk was dropped but its slot kept (swap), or its block stayed cached uncomputed
    (recompute)."""
    rows = [
        (prefix_ids(0, 3) + own_ids(0, 0, 9), 11, 0.41, 2),
        (prefix_ids(2, 3) + own_ids(1, 0, 2), 11, 0.53, 1),
        (prefix_ids(1, 16) + own_ids(2, 0, 3), 8, 0.80, 1),
        (prefix_ids(2, 3) + own_ids(3, 0, 2), 1, 1.83, 1),
        (prefix_ids(1, 3), 1, 2.06, 3),
        (prefix_ids(1, 16), 4, 2.74, 2),
        (prefix_ids(0, 3) + own_ids(6, 0, 5), 9, 2.87, 1),
        (prefix_ids(0, 3), 11, 4.33, 2),
    ]
    return [RequestSpec(i, len(p), o, t, token_ids=p, n=n) for i, (p, o, t, n) in enumerate(rows)]


def _duplicates_workload() -> list[RequestSpec]:
    """Found by the Hypothesis test too: three equal 24-token prompts; with the old rule a
    request preempted (recompute) after its decode was scheduled left its last block cached
    with one slot never computed, and a duplicate prompt hit it."""
    long = prefix_ids(0, 18) + own_ids(1, 0, 6)
    rows = [
        (own_ids(0, 0, 17), 5, 0.43, 2),
        (long, 5, 0.81, 1),
        (prefix_ids(2, 5) + own_ids(2, 0, 3), 12, 1.60, 1),
        (prefix_ids(1, 10), 6, 1.70, 1),
        (prefix_ids(2, 5) + own_ids(4, 0, 1), 5, 2.47, 1),
        (prefix_ids(2, 5) + own_ids(5, 0, 6), 8, 2.76, 2),
        (long, 6, 3.71, 1),
        (prefix_ids(2, 5) + own_ids(7, 0, 1), 8, 4.23, 1),
        (long, 9, 4.97, 1),
    ]
    return [RequestSpec(i, len(p), o, t, token_ids=p, n=n) for i, (p, o, t, n) in enumerate(rows)]


@pytest.mark.parametrize(
    ("mode", "case"),
    [
        (PreemptionMode.SWAP, (_decode_victim_workload, CacheConfig(25, 2, 4, 0.0, True), 8)),
        (PreemptionMode.RECOMPUTE, (_duplicates_workload, CacheConfig(45, 1, 4, 0.0, True), 16)),
    ],
)
def test_a_request_scheduled_this_step_is_not_the_victim(
    mode: PreemptionMode, case: tuple[Callable[[], list[RequestSpec]], CacheConfig, int]
) -> None:
    workload, cache, budget = case
    sched = SchedulerConfig(
        max_model_len=128,
        preemption_mode=mode,
        enable_chunked_prefill=True,
        max_num_batched_tokens=budget,
        max_num_seqs=4,
    )
    run, _, _ = run_shadow(workload(), cache, sched)
    assert run.totals.preemptions > 0
    assert all(r.num_output_tokens == r.output_len for r in run.requests)


# ----- the checker has teeth ---------------------------------------------------------------
class DropsCopies(ShadowExecutor):
    def move_memory(self, batch: SchedulerOutput) -> None:
        self.swap_in(batch)
        self.swap_out(batch)


class CopiesBeforeSwapOut(ShadowExecutor):
    """Copy-on-write copies before the swap-outs: a block swapped out and reused as a copy's
    destination in the same step would be overwritten before it is read."""

    def move_memory(self, batch: SchedulerOutput) -> None:
        self.swap_in(batch)
        self.copy_blocks(batch)
        self.swap_out(batch)


def _swap_and_copy_case() -> tuple[list[RequestSpec], CacheConfig, SchedulerConfig]:
    """Found by the Hypothesis test: groups of 3 samples, a duplicate prompt, 7 blocks of 16;
    a block swapped out is reused as a copy-on-write destination in the same step."""
    p = prefix_ids(0, 12)
    rows = [
        (p + own_ids(0, 0, 1), 9, 1.05, 1),
        (p, 9, 2.04, 3),
        (p + own_ids(2, 0, 5), 2, 2.49, 1),
        (p + own_ids(0, 0, 1), 7, 3.10, 3),  # request 0's prompt again
        (prefix_ids(1, 13) + own_ids(4, 0, 6), 4, 4.49, 3),
    ]
    specs = [RequestSpec(i, len(t), o, a, token_ids=t, n=n) for i, (t, o, a, n) in enumerate(rows)]
    cache = CacheConfig(7, 16, 4, watermark=0.0, enable_prefix_caching=True)
    return specs, cache, SchedulerConfig(max_model_len=128, preemption_mode=PreemptionMode.SWAP)


@pytest.mark.parametrize("wrong", [DropsCopies, CopiesBeforeSwapOut])
def test_the_shadow_catches_a_wrong_executor(wrong: type[ShadowExecutor]) -> None:
    specs, cache, sched = _swap_and_copy_case()
    run, shadow, _ = run_shadow(specs, cache, sched)  # the real executor's order passes
    assert shadow.copies > 0
    assert run.totals.swap_outs > 0
    with pytest.raises(AssertionError, match=r"not its own K/V|does not hold"):
        run_shadow(specs, cache, sched, wrong)

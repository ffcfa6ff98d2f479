"""Beam search in the simulator: after every token the k beams of a group pick their parents
by the seeded survival model; beams without a child are freed, beams with several are forked,
the books stay exact (integrity checked after every iteration), preemption stays whole-group,
and the fast-forward never skips a beam group's rounds (differential test)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.engine.beam import BeamModel, BeamState, reorganise, survival_stats
from pagedkv.engine.policies import SCHEDULERS
from pagedkv.engine.request import Request, RequestStatus
from pagedkv.errors import ConfigError
from pagedkv.memory.config import CacheConfig
from pagedkv.memory.manager import KVCacheManager
from pagedkv.simulation import SimulationConfig, simulate
from pagedkv.workloads import WorkloadConfig, make_workload
from pagedkv.workloads.spec import RequestSpec
from tests.engine.test_fast_forward import ROOFLINE, run, same
from tests.factories import make_engine


def beams(i: int, prompt: int, output: int, k: int, t: float = 0.0) -> RequestSpec:
    return RequestSpec(i, prompt, output, t, beam_width=k, beam_seed=7)


# ----- the survival model ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value"), [("stay", 1.5), ("stay", -0.1), ("decay", 0.0), ("decay", "x")]
)
def test_bad_model_parameters_name_the_field(field: str, value: Any) -> None:
    with pytest.raises(ConfigError) as err:
        BeamModel(**{field: value})
    assert err.value.field == field


@given(
    stay=st.floats(0, 1),
    decay=st.floats(0.01, 1),
    current=st.integers(1, 8),
    width=st.integers(2, 8),
    seed=st.integers(0, 2**32),
)
def test_parents_are_sorted_ranks_of_current_beams(
    stay: float, decay: float, current: int, width: int, seed: int
) -> None:
    ranks = BeamModel(stay, decay).parents(np.random.default_rng(seed), current, width)
    assert len(ranks) == width
    assert ranks == sorted(ranks)
    assert all(0 <= r < current for r in ranks)


def test_stay_one_keeps_every_lineage_and_decay_favours_the_best() -> None:
    rng = np.random.default_rng(0)
    assert BeamModel(stay=1.0).parents(rng, 4, 4) == [0, 1, 2, 3]
    assert BeamModel(stay=1.0).parents(rng, 1, 4) == [0, 0, 0, 0]  # the prompt forks k ways
    stats = survival_stats(BeamModel(stay=1.0), 4, steps=8, groups=2)
    assert (stats.distinct_parents, stats.forks) == (4.0, 0.0)
    # never staying and a steep decay: (nearly) every beam descends from the best one
    steep = survival_stats(BeamModel(stay=0.0, decay=0.01), 4, steps=8, groups=5)
    assert steep.distinct_parents < 1.1
    assert steep.split_age < 0.2


def test_survival_stats_are_deterministic_and_bounded() -> None:
    a = survival_stats(BeamModel(), 4, steps=20, groups=10, seed=3)
    assert a == survival_stats(BeamModel(), 4, steps=20, groups=10, seed=3)
    assert 1.0 <= a.distinct_parents <= 4.0
    assert a.forks == pytest.approx(4.0 - a.distinct_parents)
    assert a.split_age >= 0.0


def test_reorganise_forks_several_children_and_frees_the_childless() -> None:
    kv = KVCacheManager(CacheConfig(num_gpu_blocks=20, block_size=4))
    req = Request.from_spec(beams(0, 10, 20, 3))
    state = req.beam
    assert state is not None
    kv.allocate(req.seq_id, 10)
    req.num_computed_tokens, req.num_output_tokens = 10, 1
    reorganise(req, kv)  # the first step: the prompt forks into 3 beams
    assert len(req.seq_ids) == 3
    assert state.applied == 1
    assert kv.blocks_saved_by_sharing == 2 * 3  # two extra references to 3 prompt blocks
    first = list(req.seq_ids)
    from pagedkv.engine.beam import Candidate

    state.pending = [Candidate(0, None, 0.0), Candidate(0, None, 0.0), Candidate(2, None, 0.0)]
    reorganise(req, kv)
    assert req.seq_ids[0] == first[0]
    assert req.seq_ids[2] == first[2]
    assert req.seq_ids[1] not in first  # a fresh fork of beam 0; beam 1 was freed
    assert not kv.has_seq(first[1])
    kv.check_integrity()


# ----- requests, workloads, policies ------------------------------------------------------------
def test_samples_and_beams_are_exclusive() -> None:
    with pytest.raises(ConfigError) as err:
        RequestSpec(0, 5, 5, n=2, beam_width=2)
    assert err.value.field == "beam_width"
    with pytest.raises(ConfigError) as err:
        WorkloadConfig(num_samples=2, beam_width=3)
    assert err.value.field == "beam_width"
    with pytest.raises(ConfigError):
        BeamState(1)


def test_the_workload_flag_makes_seeded_beam_requests() -> None:
    specs = make_workload(WorkloadConfig(num_requests=5, beam_width=4, seed=9))
    assert all(s.beam_width == 4 and s.beam_seed == 9 and s.n == 1 for s in specs)
    req = Request.from_spec(specs[0])
    assert req.n == 4
    assert req.beam is not None
    assert req.beam.width == 4


@pytest.mark.parametrize("policy", ["orca-oracle", "orca-max", "static", "firstfit-pow2"])
def test_contiguous_policies_refuse_beam_groups(policy: str) -> None:
    engine = make_engine(policy, [beams(0, 10, 10, 2), RequestSpec(1, 10, 10)])
    result = engine.run()
    refused, plain = result.requests
    assert refused.status is RequestStatus.REJECTED
    assert refused.reject_reason is not None
    assert "2 beams" in refused.reject_reason
    assert plain.status is RequestStatus.FINISHED


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_a_beam_group_shares_history_and_frees_everything(block_size: int) -> None:
    engine = make_engine("vllm", [beams(0, 37, 60, 4)], block_size=block_size, num_gpu_blocks=400)
    sched, req = engine.scheduler, engine.requests[0]
    kv = sched.kv
    assert isinstance(kv, KVCacheManager)
    saved = []
    while sched.has_unfinished() or engine.pending:
        engine.admit_arrivals()
        batch = sched.schedule()
        if req.num_output_tokens:
            assert len(req.seq_ids) == 4
            assert len(set(req.seq_ids)) == 4
            saved.append(kv.blocks_saved_by_sharing)
        engine.step(batch)  # make_engine checks integrity after every iteration
    assert req.status is RequestStatus.FINISHED
    assert min(saved) >= 3 * (37 // block_size)  # the prompt's full blocks, always shared
    assert max(saved) > 3 * (37 // block_size)  # and some generated history too
    assert kv.num_free_blocks == kv.gpu.num_blocks


def flat(**kw: Any) -> dict[str, Any]:
    return {"workload": "alpaca-like", "num_requests": 60, "request_rate": 20.0, **kw}


def test_runs_are_byte_identical_and_the_seed_matters() -> None:
    a = simulate(SimulationConfig.from_flat(flat(beam_width=4)))
    b = simulate(SimulationConfig.from_flat(flat(beam_width=4)))
    c = simulate(SimulationConfig.from_flat(flat(beam_width=4, seed=1)))
    assert a.summary == b.summary
    assert a.summary["sharing"] != c.summary["sharing"]
    assert a.summary["finished"] == 60


def test_wider_beams_save_more_and_beams_save_more_than_samples() -> None:
    def saving(**kw: Any) -> float:
        s = simulate(SimulationConfig.from_flat(flat(**kw))).summary
        assert s["finished"] == 60
        return float(s["sharing"]["saved_fraction"])

    assert 0 < saving(beam_width=2) < saving(beam_width=4) < saving(beam_width=6)
    assert saving(num_samples=4) < saving(beam_width=4)  # beams share generated history too


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(
        st.tuples(st.integers(1, 60), st.integers(1, 60), st.integers(1, 4)),
        min_size=1,
        max_size=8,
    ),
    block_size=st.sampled_from([1, 4, 16]),
    num_blocks_tokens=st.integers(0, 400),
    mode=st.sampled_from(["recompute", "swap"]),
    cpu=st.booleans(),
    chunked=st.booleans(),
)
def test_fast_forward_equals_reference_on_beam_workloads(
    sizes: list[tuple[int, int, int]],
    block_size: int,
    num_blocks_tokens: int,
    mode: str,
    cpu: bool,
    chunked: bool,
) -> None:
    """Mixed beam groups and plain requests under memory pressure: both engines (the fast one
    must not skip a beam group's rounds) end with the same summary and records, and every
    request finishes; integrity is checked after every iteration."""
    workload = [
        beams(i, p, o, k, 0.02 * i) if k > 1 else RequestSpec(i, p, o, 0.02 * i)
        for i, (p, o, k) in enumerate(sizes)
    ]
    # The most blocks a group may hold: its prompt's full blocks shared, every beam's others
    # its own (the scheduler rejects a group that may need more than the pool).
    need = max(
        p // block_size + k * (-(-(p + o) // block_size) - p // block_size) for p, o, k in sizes
    )
    kw = {
        "scheduler": "vllm",
        "block_size": block_size,
        "num_gpu_blocks": need + num_blocks_tokens // block_size + 2,
        "num_cpu_blocks": 400 if cpu else 0,
        "preemption_mode": mode,
        "chunked": chunked,
        "max_num_batched_tokens": 256 if chunked else None,
    }
    ref = run(True, workload, ROOFLINE, **kw)
    fast = run(False, workload, ROOFLINE, **kw)
    same(ref[:4], fast[:4])
    assert not ref[2]
    assert ref[0]["finished"] == len(workload)


def test_beam_groups_under_pressure_swap_whole_and_restart_without_cpu_room() -> None:
    workload = [beams(i, 30 + 7 * i, 60, 2 + i % 3, 0.05 * i) for i in range(8)]
    kw = {"scheduler": "vllm", "block_size": 16, "num_gpu_blocks": 40}
    swapped = run(True, workload, ROOFLINE, num_cpu_blocks=80, preemption_mode="swap", **kw)
    assert swapped[0]["finished"] == 8
    assert swapped[0]["preemptions"] > 0
    assert swapped[0]["recomputed_tokens"] == 0  # swapped, never recomputed
    restarted = run(True, workload, ROOFLINE, num_cpu_blocks=0, **kw)
    assert restarted[0]["finished"] == 8
    assert restarted[0]["recomputed_tokens"] > 0


def test_reserve_never_preempts_beam_groups() -> None:
    workload = [beams(i, 20 + 5 * i, 40, 2 + i % 4, 0.01 * i) for i in range(10)]
    engine = make_engine("reserve", workload, block_size=4, num_gpu_blocks=120)
    result = engine.run()
    assert not result.deadlocked
    assert all(r.status is RequestStatus.FINISHED for r in result.requests)
    assert result.totals.preemptions == 0


def test_every_paged_policy_finishes_beam_groups() -> None:
    workload = [beams(i, 10 + i, 20, 3, 0.01 * i) for i in range(6)]
    for policy in sorted(SCHEDULERS):
        if not SCHEDULERS[policy].supports_groups:
            continue
        result = make_engine(policy, workload, block_size=4, num_gpu_blocks=200).run()
        assert not result.deadlocked, policy
        assert all(r.status is RequestStatus.FINISHED for r in result.requests), policy


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_a_group_that_can_never_fit_is_rejected_not_deadlocked(mode: str) -> None:
    """4 x 7 blocks past the prompt's (none full) > 12: rejected at arrival, with the reason;
    a group whose worst case fits runs."""
    workload = [
        beams(0, 10, 100, 4),
        RequestSpec(1, 10, 100, n=4),
        beams(2, 10, 30, 4),
    ]
    engine = make_engine(
        "vllm",
        workload,
        num_gpu_blocks=12,
        num_cpu_blocks=40 if mode == "swap" else 0,
        preemption_mode=mode,
    )
    result = engine.run()
    assert not result.deadlocked
    big_beams, big_samples, small = result.requests
    for r in (big_beams, big_samples):
        assert r.status is RequestStatus.REJECTED
        assert r.reject_reason is not None
        assert "may need 28 blocks" in r.reject_reason
    assert small.status is RequestStatus.FINISHED

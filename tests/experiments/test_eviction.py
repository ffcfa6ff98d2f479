"""The ``eviction`` experiment in --quick mode: the results directory's shape, facts that hold
whatever the policies' merits, and the paired LFU - LRU difference its findings report."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pagedkv.experiments import eviction, framework
from pagedkv.experiments.registry import EXPERIMENTS
from pagedkv.report import stats
from pagedkv.simulation import SimulationConfig
from tests.experiments.test_experiments import check_shape


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("eviction")
    framework.run_experiment(eviction, quick=True, out=out, workers=1)
    loaded: dict[str, Any] = json.loads((out / "results.json").read_text())
    check_shape(loaded, out, eviction.NAME)
    return loaded


def test_registered_for_reproduce() -> None:
    assert EXPERIMENTS[eviction.NAME] is eviction


def test_the_default_plan_compares_both_policies_with_caching_on() -> None:
    plan = eviction.plan(False, framework.seed_list(framework.DEFAULT_SEEDS))
    sizes = sum(len(v) for v in eviction.BLOCKS.values())
    assert len(plan.points) == sizes * len(eviction.POLICIES) * framework.DEFAULT_SEEDS
    for p in plan.points:
        config = SimulationConfig.from_flat({**p.flat, "seed": p.seed})  # valid, no run
        assert config.hardware.enable_prefix_caching
        assert config.hardware.eviction_policy.value == p.config["policy"]
        assert config.hardware.num_gpu_blocks == p.config["num_gpu_blocks"]
        assert config.workload.kind.value == p.config["workload"]


def test_every_quick_point_evicts_and_serves_every_request(data: dict[str, Any]) -> None:
    rows = data["rows"]
    assert {r["policy"] for r in rows} == set(eviction.POLICIES)
    for r in rows:
        assert r["prefix_evictions"] > 0  # the sizes are where eviction happens
        assert 0 < r["prefix_hit_rate"] < 1
        want = (
            eviction.QUICK_SESSIONS * eviction.TURNS
            if r["workload"] == eviction.CHAT
            else eviction.QUICK_REQUESTS
        )
        assert r["finished"] == want  # the policy changes what hits, never what is served


def test_more_cache_evicts_less(data: dict[str, Any]) -> None:
    for wl in eviction.WORKLOADS:
        for policy in eviction.POLICIES:
            rows = [s for s in data["summary"] if s["workload"] == wl and s["policy"] == policy]
            rows.sort(key=lambda s: s["num_gpu_blocks"])
            evictions = [s["prefix_evictions_mean"] for s in rows]
            assert evictions == sorted(evictions, reverse=True)


def test_findings_name_each_workload_and_size(data: dict[str, Any]) -> None:
    sizes = sum(len(v) for v in eviction.QUICK_BLOCKS.values())
    assert len(data["findings"]) == sizes
    for wl in eviction.WORKLOADS:
        for nb in eviction.QUICK_BLOCKS[wl]:
            assert any(f.startswith(f"{wl}, {nb} blocks:") for f in data["findings"])


def _result(rows: list[dict[str, Any]]) -> framework.ExperimentResult:
    keys = ("workload", "num_gpu_blocks", "policy")
    return framework.ExperimentResult(
        "eviction", "t", "q", {}, keys, ("prefix_hit_rate",), rows, stats.summarize(rows, keys, ())
    )


def test_the_paired_difference_pairs_by_seed() -> None:
    key = {"workload": "chat", "num_gpu_blocks": 8}
    hits = {("lru", 0): 0.5, ("lru", 1): 0.9, ("lru", 2): 0.2}
    hits |= {("lfu", 0): 0.6, ("lfu", 1): 1.0, ("lfu", 2): 0.3, ("lfu", 3): 0.0}
    rows = [{**key, "policy": p, "seed": s, "prefix_hit_rate": v} for (p, s), v in hits.items()]
    diff = eviction.paired_difference(
        _result(rows), "prefix_hit_rate", {**key, "policy": "lfu"}, {**key, "policy": "lru"}
    )
    assert diff.n == 3  # seed 3 has no LRU twin
    assert diff.mean == pytest.approx(0.1)  # the seeds' differences, not the means' (0.4 - 0.3)
    assert diff.low is not None
    assert diff.low > 0
    assert eviction._verdict(diff, higher_is_better=True) == "LFU better"
    assert eviction._verdict(diff, higher_is_better=False) == "LRU better"
    same = stats.MeanCI(0.0, -0.1, 0.1, 2)
    assert eviction._verdict(same, higher_is_better=True) == "no significant difference"

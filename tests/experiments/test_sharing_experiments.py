"""The sharing experiments in --quick mode: the results directory's shape, and facts that hold."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pagedkv.experiments import chat, framework, prefix_sharing, shared_prefix
from pagedkv.experiments.metrics import METRICS
from tests.experiments.test_experiments import check_shape


def _run(module: ModuleType, out: Path) -> dict[str, Any]:
    framework.run_experiment(module, quick=True, out=out, workers=1)
    data: dict[str, Any] = json.loads((out / "results.json").read_text())
    check_shape(data, out, module.NAME)
    return data


@pytest.fixture(scope="module")
def sharing(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run(prefix_sharing, tmp_path_factory.mktemp("prefix-sharing"))


@pytest.fixture(scope="module")
def chats(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run(chat, tmp_path_factory.mktemp("chat"))


def test_sharing_metrics_are_registered() -> None:
    assert {"prefix_hit_rate", "saved_fraction", "blocks_per_running", "ttft_mean"} <= set(METRICS)


def _rows(data: dict[str, Any], **key: Any) -> list[dict[str, Any]]:
    return [r for r in data["rows"] if all(r[k] == v for k, v in key.items())]


def test_prefix_sharing_hits_only_with_caching_and_sharing(sharing: dict[str, Any]) -> None:
    for r in sharing["rows"]:
        if r["setting"] != prefix_sharing.CACHING:
            assert r["prefix_hit_rate"] == 0
            assert r["prefix_evictions"] == 0
            assert r["saved_fraction"] == 0  # nothing shared, nothing saved
        elif r["share_ratio"] == 0 and r["preemptions"] == 0:
            assert r["prefix_hit_rate"] == 0  # private prefixes never hit one another


def test_prefix_sharing_hit_rate_grows_with_the_share_ratio(sharing: dict[str, Any]) -> None:
    for wl in ("sharegpt-like", "alpaca-like"):
        for seed in sharing["setup"]["seeds"]:
            rows = _rows(sharing, workload=wl, seed=seed, setting=prefix_sharing.CACHING)
            rows.sort(key=lambda r: r["share_ratio"])
            rates = [r["prefix_hit_rate"] for r in rows]
            assert rates == sorted(rates)
            assert rates[-1] > rates[0] + 0.3
            assert rows[-1]["saved_fraction"] > rows[0]["saved_fraction"]


def test_caching_never_costs_blocks_and_paging_beats_contiguous(sharing: dict[str, Any]) -> None:
    """Per workload, ratio and seed, at equal load: a running request holds no more blocks
    with caching than without (1% for the time weighting), and fewer than contiguous."""
    for r in _rows(sharing, setting=prefix_sharing.CACHING):
        key = {k: r[k] for k in ("workload", "share_ratio", "seed")}
        (plain,) = _rows(sharing, setting=prefix_sharing.PLAIN, **key)
        (orca,) = _rows(sharing, setting=prefix_sharing.CONTIGUOUS, **key)
        assert r["blocks_per_running"] <= plain["blocks_per_running"] * 1.01
        assert plain["blocks_per_running"] < orca["blocks_per_running"]
        if r["share_ratio"] == 1.0:
            assert r["blocks_per_running"] < 0.8 * plain["blocks_per_running"]


def test_prefix_sharing_findings_name_the_figures(sharing: dict[str, Any]) -> None:
    assert len(sharing["findings"]) == 4
    assert all("share ratio 1" in f for f in sharing["findings"])


def test_chat_hits_only_with_caching_and_more_with_a_larger_cache(chats: dict[str, Any]) -> None:
    for r in chats["rows"]:
        if r["caching"] == "off":
            assert r["prefix_hit_rate"] == 0
            assert r["prefix_evictions"] == 0
        else:
            assert r["prefix_hit_rate"] > 0
    on = sorted(
        (s for s in chats["summary"] if s["caching"] == "on"), key=lambda s: s["num_gpu_blocks"]
    )
    means = [s["prefix_hit_rate_mean"] for s in on]
    assert means == sorted(means)
    evictions = [s["prefix_evictions_mean"] for s in on]
    assert evictions == sorted(evictions, reverse=True)


def test_chat_serves_every_turn_either_way(chats: dict[str, Any]) -> None:
    for r in _rows(chats, caching="on"):
        (off,) = _rows(chats, caching="off", num_gpu_blocks=r["num_gpu_blocks"], seed=r["seed"])
        assert r["finished"] == off["finished"] > 0


def test_translation_sharing_beats_copies(tmp_path: Path) -> None:
    data = _run(shared_prefix, tmp_path)
    for r in _rows(data, setting=prefix_sharing.CACHING):
        key = {"shots": r["shots"], "seed": r["seed"]}
        (plain,) = _rows(data, setting=prefix_sharing.PLAIN, **key)
        (orca,) = _rows(data, setting=prefix_sharing.CONTIGUOUS, **key)
        assert r["request_throughput"] > plain["request_throughput"] >= orca["request_throughput"]
        assert r["prefix_hit_rate"] > 0.5
    by = {(s["shots"], s["setting"]): s for s in data["summary"]}
    assert (
        by[5, prefix_sharing.CACHING]["prefix_hit_rate_mean"]
        > by[1, prefix_sharing.CACHING]["prefix_hit_rate_mean"]
    )

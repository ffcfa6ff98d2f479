"""Every experiment in --quick mode: the results directory's shape, and facts that must hold."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pagedkv.errors import ConfigError
from pagedkv.experiments import framework
from pagedkv.experiments.registry import EXPERIMENTS
from pagedkv.experiments.variants import CONTIGUOUS_VARIANTS

PNG = b"\x89PNG\r\n\x1a\n"


def run(module: ModuleType, out: Path) -> dict[str, Any]:
    framework.run_experiment(module, quick=True, out=out, workers=1)
    data: dict[str, Any] = json.loads((out / "results.json").read_text())
    return data


def check_shape(data: dict[str, Any], out: Path, name: str) -> None:
    assert data["experiment"] == name
    assert data["title"]
    assert data["question"]
    seeds = data["setup"]["seeds"]
    assert seeds == list(range(framework.QUICK_SEEDS))
    assert data["setup"]["quick"] is True
    cols = data["columns"]
    assert all(set(r) == set(cols) for r in data["rows"])
    keys = cols[: cols.index("seed")]
    configs = {tuple(r[k] for k in keys) for r in data["rows"]}
    assert len(data["rows"]) == len(configs) * len(seeds)
    assert len(data["summary"]) == len(configs)
    metrics = cols[cols.index("seed") + 1 :]
    for s in data["summary"]:
        assert set(s) == set(data["summary_columns"])
        assert s["n"] == len(seeds)
        for m in metrics:
            mean, lo, hi = s[f"{m}_mean"], s[f"{m}_ci_low"], s[f"{m}_ci_high"]
            if mean is not None and lo is not None:
                assert lo <= mean <= hi, (m, s)
    csv_lines = (out / "results.csv").read_text().splitlines()
    assert csv_lines[0].split(",") == cols
    assert len(csv_lines) == len(data["rows"]) + 1
    assert data["plots"]
    for p in data["plots"]:
        assert p["caption"]
        assert (out / p["file"]).read_bytes().startswith(PNG)


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_quick_experiment_shape(name: str, tmp_path: Path) -> None:
    data = run(EXPERIMENTS[name], tmp_path)
    check_shape(data, tmp_path, name)
    FACTS.get(name, lambda _: None)(data)


def _lesson_facts(data: dict[str, Any]) -> None:
    by = {s["setting"]: s for s in data["summary"]}
    assert by["lesson: paged, its loop"]["deadlocked_mean"] == 1  # the lesson's loop stalls
    for s in by.values():
        if s["scheduler"] != "greedy-nopreempt":
            assert s["finished_mean"] == 20
            assert s["deadlocked_mean"] == 0
    paged = by["equal: paged vllm"]
    contiguous = by["equal: contiguous 6 slots"]
    assert paged["max_running_mean"] > contiguous["max_running_mean"]
    assert paged["token_utilization_mean"] > contiguous["token_utilization_mean"]


def _fragmentation_facts(data: dict[str, Any]) -> None:
    """At equal memory, paged token utilization >= every contiguous variant's, seed by seed;
    and the five categories partition the capacity."""
    rows = data["rows"]
    for r in rows:
        total = sum(
            r[c]
            for c in (
                "token_states",
                "reservation",
                "internal_fragmentation",
                "external_fragmentation",
                "free",
            )
        )
        assert total == pytest.approx(1.0)
        # the two conventions for buddy rounding split the same slots
        slot = r["internal_fragmentation"] + r["external_fragmentation"]
        alloc = (
            r["internal_fragmentation_allocator_convention"]
            + r["external_fragmentation_allocator_convention"]
        )
        assert alloc == pytest.approx(slot)
        assert 0.0 <= r["allocator_rounding"] <= r["internal_fragmentation"] + 1e-12
        if r["scheduler"] in ("vllm", "contiguous-slots") or r["scheduler"].startswith("firstfit"):
            assert r["allocator_rounding"] == 0.0  # nothing rounds a reservation up
        if r["scheduler"].endswith("oracle"):  # exact reservations: the paper's 0% internal
            assert r["internal_fragmentation_allocator_convention"] == pytest.approx(0.0, abs=1e-12)
    for paged in (r for r in rows if r["scheduler"] == "vllm"):
        others = [
            r
            for r in rows
            if r["workload"] == paged["workload"]
            and r["seed"] == paged["seed"]
            and r["scheduler"] in CONTIGUOUS_VARIANTS
        ]
        assert len(others) == len(CONTIGUOUS_VARIANTS)
        for r in others:
            assert paged["token_utilization"] >= r["token_utilization"], r["scheduler"]


def _memory_facts(data: dict[str, Any]) -> None:
    """More memory never lowers paged max concurrency (per seed; every request at t = 0)."""
    for seed in data["setup"]["seeds"]:
        paged = sorted(
            (r for r in data["rows"] if r["scheduler"] == "vllm" and r["seed"] == seed),
            key=lambda r: r["num_gpu_blocks"],
        )
        concurrency = [r["max_running"] for r in paged]
        assert concurrency == sorted(concurrency)
        for r in data["rows"]:  # at equal budget, paging holds at least what a reservation does
            if r["seed"] == seed and r["scheduler"] != "vllm":
                same = next(p for p in paged if p["num_gpu_blocks"] == r["num_gpu_blocks"])
                assert same["max_running"] >= r["max_running"]


def _preemption_facts(data: dict[str, Any]) -> None:
    for r in data["rows"]:
        if r["preemption_mode"] == "recompute":
            assert r["swap_outs"] == 0
        else:
            assert r["recomputed_tokens"] == 0


FACTS = {
    "lesson": _lesson_facts,
    "fragmentation": _fragmentation_facts,
    "memory-pressure": _memory_facts,
    "preemption": _preemption_facts,
}


def test_same_seeds_give_identical_results_json(tmp_path: Path) -> None:
    """Determinism, also across the process pool: in-process and 2 workers write equal bytes."""
    module = EXPERIMENTS["memory-pressure"]
    framework.run_experiment(module, quick=True, out=tmp_path / "a", workers=1)
    framework.run_experiment(module, quick=True, out=tmp_path / "b", workers=2)
    a = (tmp_path / "a" / "results.json").read_bytes()
    assert a == (tmp_path / "b" / "results.json").read_bytes()


def test_seeds_are_the_workload_seeds(tmp_path: Path) -> None:
    result = framework.run_experiment(
        EXPERIMENTS["memory-pressure"], quick=True, seeds=3, workers=1
    )
    assert result.setup["seeds"] == [0, 1, 2]
    assert {r["seed"] for r in result.rows} == {0, 1, 2}
    assert not list(tmp_path.iterdir())  # no out: nothing written


def test_bad_seeds_is_a_config_error() -> None:
    from pagedkv.errors import ConfigError

    with pytest.raises(ConfigError, match="seeds"):
        framework.run_experiment(EXPERIMENTS["lesson"], seeds=1)


def test_an_experiment_can_run_on_a_profile() -> None:
    """--cost-model profiled reprices every point (here with the built-in of the setup's GPU x
    model) and the setup says so; a bad profile is refused before any run."""
    from pagedkv.experiments import block_size, setups
    from pagedkv.simulation import SimulationConfig

    plan = block_size.plan(True, [0, 1])
    priced = setups.with_clock(plan, "profiled")
    assert setups.with_clock(plan, None) is plan
    assert priced.setup["cost_model"] == "profiled"
    assert priced.setup["profile"] == "a100-40gb/opt-13b"
    assert all(p.flat["cost_model"] == "profiled" for p in priced.points)
    assert [p.config for p in priced.points] == [p.config for p in plan.points]
    config = SimulationConfig.from_flat(dict(priced.points[0].flat))
    assert config.hardware.profile == "a100-40gb/opt-13b"
    named = setups.with_clock(plan, None, "a100-80gb/opt-13b")
    assert named.setup["cost_model"] == "profiled"
    with pytest.raises(ConfigError) as info:
        setups.with_clock(plan, "profiled", "h100-sxm/llama-2-7b")
    assert info.value.field.startswith("profile")


def test_runs_added_after_the_grid_take_its_clock() -> None:
    from types import SimpleNamespace

    from pagedkv.experiments import block_size, setups
    from pagedkv.simulation import SimulationConfig

    plan = block_size.plan(True, [0, 1])
    priced = setups.with_clock(plan, "profiled")
    grid = SimpleNamespace(setup=priced.setup)
    later = setups.clock_of(grid, plan)  # type: ignore[arg-type]

    def hardware(flat: Any) -> Any:
        return SimulationConfig.from_flat(dict(flat)).hardware

    assert [hardware(p.flat) for p in later.points] == [hardware(p.flat) for p in priced.points]
    roofline = setups.clock_of(SimpleNamespace(setup=plan.setup), plan)  # type: ignore[arg-type]
    assert [p.flat for p in roofline.points] == [p.flat for p in plan.points]

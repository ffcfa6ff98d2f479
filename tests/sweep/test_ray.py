"""The Ray backend: the same outcomes and the same sweep table as the local one.

One local Ray instance (2 CPUs) serves the whole module: starting Ray takes seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pagedkv.sweep.plan import run_plan
from pagedkv.sweep.plan_spec import PlanSpec
from pagedkv.sweep.pool import run_points
from pagedkv.sweep.spec import SweepSpec
from pagedkv.sweep.sweep import run_sweep
from tests.sweep.helpers import SMALL_SPEC, fail_large_blocks

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'pagedkv[ray]')")


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_outcomes_match_local_errors_included() -> None:
    points = [{**SweepSpec.from_dict(SMALL_SPEC).points()[i].options} for i in (0, 1, 6, 7)]
    on_ray = sorted(
        (o.index, o.error, None if o.value is None else o.value["ttft_p99"])
        for o in run_points(fail_large_blocks, points, backend="ray")
    )
    local = sorted(
        (o.index, o.error, None if o.value is None else o.value["ttft_p99"])
        for o in run_points(fail_large_blocks, points, workers=1)
    )
    assert on_ray == local
    assert sum(e is not None for _, e, _ in on_ray) == 2  # block size 16 raises


def test_sweep_table_is_identical_on_ray_and_local(tmp_path: Path) -> None:
    spec = SweepSpec.from_dict(SMALL_SPEC)
    run_sweep(spec, tmp_path / "local", workers=2)
    done = run_sweep(spec, tmp_path / "ray", backend="ray", workers=2)
    assert done.ran == len(spec.points())
    assert done.failed == 0
    for name in ("results.csv", "results.parquet"):
        assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "local" / name).read_bytes()


def test_plan_gives_the_same_answer_on_ray_and_local() -> None:
    spec = PlanSpec.from_dict(
        {
            "workload": "alpaca-like",
            "num_requests": 20,
            "gpus": {"A100-40GB": 1.0, "A100-80GB": 1.5},
            "slo": {"normalized_latency_p99": 0.05},
            "seeds": 2,
            "tolerance": 0.5,
        }
    )
    local = [r.row() for r in run_plan(spec, workers=2)]
    assert [r.row() for r in run_plan(spec, backend="ray", workers=2)] == local

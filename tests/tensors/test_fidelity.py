"""``pagedkv fidelity``'s two runs schedule alike where the clock cannot reorder anything (all
arrivals at t = 0): a differential test of the real run against the simulated one, batch for
batch, under chunked prefill, prefix caching and preemption (no timing assertions)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedkv.tensors.fidelity import as_sampled, fidelity
from pagedkv.tensors.profile_config import FidelityConfig, ProfileConfig
from pagedkv.tensors.profile_runs import workload
from pagedkv.tensors.profiler import profile


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("profile") / "tiny.json"
    cfg = ProfileConfig(
        model="tiny-llama", block_sizes=(1, 16), budget_s=0.3, max_tokens=64, max_seqs=8
    )
    profile(cfg).write(path)
    return path


@pytest.mark.parametrize(
    ("block_size", "slots", "preemption"),
    [(1, 160, "recompute"), (1, 160, "swap"), (16, 160, "recompute"), (1, 4096, "recompute")],
)
def test_real_and_simulated_runs_schedule_alike(
    tiny_profile: Path, block_size: int, slots: int, preemption: str
) -> None:
    """With prefix caching a request preempted after its first tokens recomputes prompt and
    outputs: the simulator must know the outputs' ids (the real run's) to find the cached
    prefix the real run hits, and to key the freed output blocks the real run keeps cached."""
    run = fidelity(
        FidelityConfig(
            model="tiny-llama",
            profile=str(tiny_profile),
            num_requests=8,
            max_prompt_len=48,
            max_output_len=24,
            shared_prefix_len=16,
            enable_prefix_caching=True,
            enable_chunked_prefill=True,
            max_num_batched_tokens=256,
            block_size=block_size,
            num_gpu_blocks=slots // block_size,
            preemption_mode=preemption,
            repeats=1,
        )
    )
    if slots < 1000:  # the memory binds: preemption happens
        assert run["real"]["preemptions"] > 0
    for part in ("summary", "roofline", "replay"):
        assert run[part]["iterations_agree"], part
        assert run[part]["iterations_sim"] == run[part]["iterations_real"]
    assert run["profiled_sim"]["preemptions"] == run["real"]["preemptions"]
    # the same schedule: every step of the replay is one the real run measured
    assert run["replay"]["replayed_steps"] == run["real"]["iterations"]


def test_as_sampled_plans_the_real_outputs() -> None:
    specs = workload(5, 100, (4, 9), (2, 6), 0.0, seed=2, shared_prefix=3)
    sampled = {s.request_id: tuple(range(s.request_id, s.request_id + s.output_len)) for s in specs}
    sampled[0] = sampled[0][:1]  # a request that stopped early (a stop token)
    planned = as_sampled(specs, sampled)
    for before, after in zip(specs, planned, strict=True):
        assert after.output_token_ids == sampled[before.request_id]
        assert after.output_len == len(sampled[before.request_id])
        assert (after.token_ids, after.arrival_time) == (before.token_ids, before.arrival_time)

"""A user's policy, written in one file against the Scheduler interface, runs like a built-in."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pagedkv.engine.config import SchedulerConfig
from pagedkv.engine.policies import SCHEDULERS, register_scheduler
from pagedkv.engine.policies.vllm import VllmScheduler
from pagedkv.engine.request import RequestStatus
from pagedkv.engine.scheduler import Scheduler, SchedulerOutput
from pagedkv.errors import ConfigError
from pagedkv.memory.config import CacheConfig
from pagedkv.memory.interface import KVAllocator
from pagedkv.memory.manager import KVCacheManager
from pagedkv.simulation import SimulationConfig, simulate


class OneAtATime(Scheduler):
    """No batching at all: one request runs to its end before the next is admitted."""

    name = "test-one-at-a-time"

    @classmethod
    def make_allocator(cls, cache: CacheConfig, config: SchedulerConfig) -> KVAllocator:
        return KVCacheManager(cache)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        if self.running:
            self._decode_running(out)
        elif self.waiting:
            req = self.waiting[0]
            n = req.num_pending_tokens
            if self.kv.allocate(req.seq_id, n, final_len=req.max_kv_tokens) is not None:
                self.waiting.popleft()
                self._start_running(req)
                out.chunks.append(self._chunk(req, n))
        return out


@pytest.fixture
def registered() -> Iterator[type[Scheduler]]:
    """Register the policy for one test only (other tests iterate over SCHEDULERS)."""
    register_scheduler(OneAtATime)
    yield OneAtATime
    del SCHEDULERS[OneAtATime.name]


@pytest.mark.usefixtures("registered")
def test_a_registered_policy_runs_through_simulate() -> None:
    flat = {"workload": "lesson", "cost_model": "unit", "num_gpu_blocks": 100, "max_model_len": 256}
    mine = simulate(SimulationConfig.from_flat({**flat, "scheduler": OneAtATime.name}))
    vllm = simulate(SimulationConfig.from_flat({**flat, "scheduler": "vllm"}))
    assert mine.summary["finished"] == 20
    assert mine.summary["max_running"] == 1
    # One request at a time: every request runs its output_len iterations, one after another.
    assert mine.summary["iterations"] == sum(r["output_len"] for r in mine.requests)
    assert mine.summary["iterations"] > vllm.summary["iterations"]
    assert all(r["status"] == RequestStatus.FINISHED.value for r in mine.requests)


def test_a_name_is_taken_once() -> None:
    class Impostor(VllmScheduler):
        name = "vllm"

    with pytest.raises(ConfigError, match="taken"):
        register_scheduler(Impostor)
    assert SCHEDULERS["vllm"] is VllmScheduler

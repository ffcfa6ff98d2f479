"""Drive vLLM's own v1 ``Scheduler`` and pagedkv's ``vllm-v1`` policy on one case, one
record per executed step (a step that schedules no token is not one).

vLLM runs on CPU with no model: its config objects come from a small local ``config.json``
(tokenizer skipped), and a fake model runner samples, for every request that finished its
prefill in the step, the next token of the case's planned output (``ignore_eos``,
``max_tokens`` = the output length). The unit clock: each executed step takes one tick, and a
request is added once the clock reaches its arrival. With ``async_scheduling`` the outputs of
a step reach vLLM's scheduler after the next step is scheduled (its engine's batch queue of 2).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from pagedkv.engine.config import SchedulerConfig as PagedSchedulerConfig
from pagedkv.engine.config import SchedulingPolicy
from pagedkv.engine.cost_model import UnitCost
from pagedkv.engine.engine import Engine
from pagedkv.engine.executor import SimExecutor
from pagedkv.engine.policies.vllm_v1 import VllmV1Scheduler
from pagedkv.engine.scheduler import SchedulerOutput
from pagedkv.memory.config import CacheConfig as PagedCacheConfig
from pagedkv.workloads.spec import RequestSpec
from tests.vllm_diff.cases import Case


@dataclass(frozen=True)
class Step:
    """What one executed step did: tokens per request, who was preempted, the prefix-hit
    tokens of each request admitted in it, and the blocks in use after scheduling."""

    tokens: tuple[tuple[int, int], ...]
    preempted: tuple[int, ...]
    hits: tuple[tuple[int, int], ...]
    used_blocks: int


# ----- vLLM ---------------------------------------------------------------------------------
_MODEL_DIR = tempfile.TemporaryDirectory(prefix="vllm-diff-model-")


@cache
def _model_dir() -> str:
    """A tiny Llama config.json (no weights, no tokenizer: the scheduler needs neither), in a
    directory removed when the process ends."""
    path = Path(_MODEL_DIR.name)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": 1,
        "vocab_size": 4096,
        "max_position_embeddings": 4096,
        "torch_dtype": "float32",
    }
    (path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return str(path)


@cache
def _model_config(max_model_len: int) -> Any:
    from vllm.config import ModelConfig

    return ModelConfig(
        model=_model_dir(), skip_tokenizer_init=True, max_model_len=max_model_len, dtype="float32"
    )


@cache
def _hasher(block_size: int) -> Any:
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    fn = get_hash_fn_by_name("sha256")
    init_none_hash(fn)
    return get_request_block_hasher(block_size, fn)


def _vllm_scheduler(case: Case) -> Any:
    import torch
    from vllm.config import CacheConfig, DeviceConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    cache_config = CacheConfig(
        block_size=case.block_size, enable_prefix_caching=case.enable_prefix_caching
    )
    cache_config.num_gpu_blocks = case.num_gpu_blocks
    sched_config = SchedulerConfig(
        max_num_seqs=case.max_num_seqs,
        max_num_batched_tokens=case.max_num_batched_tokens,
        max_model_len=case.max_model_len,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
        scheduler_reserve_full_isl=case.scheduler_reserve_full_isl,
        long_prefill_token_threshold=case.long_prefill_token_threshold,
        max_num_scheduled_tokens=case.max_num_scheduled_tokens,
        max_num_active_seqs=case.max_num_active_seqs,
        async_scheduling=case.async_scheduling,
        policy=case.scheduling_policy,
        watermark=case.watermark,
    )
    config = VllmConfig(
        model_config=_model_config(case.max_model_len),
        cache_config=cache_config,
        scheduler_config=sched_config,
        device_config=DeviceConfig(device="cpu"),
    )
    spec = FullAttentionSpec(
        block_size=case.block_size, num_kv_heads=1, head_size=16, dtype=torch.float32
    )
    kv_config = KVCacheConfig(
        num_blocks=case.num_gpu_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layers.0"], spec)],
    )
    cls = AsyncScheduler if case.async_scheduling else Scheduler
    return cls(
        vllm_config=config,
        kv_cache_config=kv_config,
        structured_output_manager=StructuredOutputManager(config),
        block_size=case.block_size,
    )


def run_vllm(case: Case) -> list[Step]:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    sched = _vllm_scheduler(case)
    pool = sched.kv_cache_manager.block_pool
    hasher = _hasher(case.block_size) if case.enable_prefix_caching else None
    pending = sorted(case.requests, key=lambda r: (r.arrival, r.rid))
    by_id = {f"{r.rid:06d}": r for r in case.requests}
    emitted = dict.fromkeys(by_id, 0)  # tokens sampled so far (in flight included)
    steps: list[Step] = []
    now = 0
    inflight: tuple[Any, Any] | None = None
    carried: set[str] = set()  # preempted in a step that then ran nothing (async)
    while pending or sched.has_requests() or inflight is not None:
        while pending and pending[0].arrival <= now:
            r = pending.pop(0)
            params = SamplingParams(max_tokens=len(r.output), ignore_eos=True)
            sched.add_request(
                Request(
                    request_id=f"{r.rid:06d}",
                    prompt_token_ids=list(r.prompt),
                    sampling_params=params,
                    pooling_params=None,
                    # vLLM stamps arrivals with its wall clock: they never tie. The case's
                    # whole seconds do; a microsecond per id orders them as that clock
                    # would (pagedkv breaks a tie by the request id).
                    arrival_time=float(r.arrival) + r.rid * 1e-6,
                    priority=r.priority,
                    block_hasher=hasher,
                )
            )
        if not sched.has_requests() and inflight is None:
            now = max(now, pending[0].arrival)
            continue
        waiting = {rid for rid, q in sched.requests.items() if q.status.name != "RUNNING"}
        out = sched.schedule()
        if inflight is not None:  # async: the previous step's outputs arrive now
            sched.update_from_output(*inflight)
            inflight = None
        if out.total_num_scheduled_tokens == 0:
            carried = carried or out.preempted_req_ids
            if case.async_scheduling and sched.has_requests():
                continue  # scheduled again at once, now that the outputs are in
            if pending:
                now = max(now, pending[0].arrival)
                continue
            break
        counts = out.num_scheduled_tokens
        sampled: list[list[int]] = []
        for rid in counts:
            req = sched.requests[rid]
            if req.is_prefill_chunk:
                sampled.append([])
            else:
                sampled.append([by_id[rid].output[emitted[rid]]])
                emitted[rid] += 1
        steps.append(
            Step(
                tokens=tuple(sorted((int(rid), n) for rid, n in counts.items())),
                preempted=tuple(sorted(int(rid) for rid in carried | out.preempted_req_ids)),
                hits=tuple(
                    sorted(
                        (int(rid), sched.requests[rid].num_computed_tokens - n)
                        for rid, n in counts.items()
                        if rid in waiting
                    )
                ),
                used_blocks=pool.num_gpu_blocks - 1 - pool.get_num_free_blocks(),
            )
        )
        output = ModelRunnerOutput(
            req_ids=list(counts),
            req_id_to_index={rid: i for i, rid in enumerate(counts)},
            sampled_token_ids=sampled,
        )
        carried = set()
        if case.async_scheduling:
            inflight = (out, output)
        else:
            sched.update_from_output(out, output)
        now += 1
    return steps


# ----- pagedkv ------------------------------------------------------------------------------
def paged_engine(case: Case) -> Engine:
    config = PagedSchedulerConfig(
        scheduler="vllm-v1",
        max_num_seqs=case.max_num_seqs,
        max_num_batched_tokens=case.max_num_batched_tokens,
        max_model_len=case.max_model_len,
        scheduler_reserve_full_isl=case.scheduler_reserve_full_isl,
        long_prefill_token_threshold=case.long_prefill_token_threshold,
        max_num_scheduled_tokens=case.max_num_scheduled_tokens,
        max_num_active_seqs=case.max_num_active_seqs,
        async_scheduling=case.async_scheduling,
        scheduling_policy=SchedulingPolicy(case.scheduling_policy),
    )
    cache_config = PagedCacheConfig(
        num_gpu_blocks=case.num_gpu_blocks,
        block_size=case.block_size,
        watermark=case.watermark,
        enable_prefix_caching=case.enable_prefix_caching,
    )
    kv = VllmV1Scheduler.make_allocator(cache_config, config)
    specs = [
        RequestSpec(
            request_id=r.rid,
            prompt_len=len(r.prompt),
            output_len=len(r.output),
            arrival_time=float(r.arrival),
            token_ids=r.prompt,
            output_token_ids=r.output,
            priority=r.priority,
        )
        for r in case.requests
    ]
    # Every round through ``schedule()``, which is what this compares (the fast path's rounds
    # equal the reference's: tests/engine/test_vllm_v1_fast.py).
    sched = VllmV1Scheduler(config, kv)
    return Engine(sched, SimExecutor(UnitCost()), specs, check_integrity=True, reference=True)


def run_paged(case: Case) -> list[Step]:
    engine = paged_engine(case)
    sched = engine.scheduler
    assert isinstance(sched, VllmV1Scheduler)
    schedule = sched.schedule
    steps: list[Step] = []

    def recorded() -> SchedulerOutput:
        waiting = set(sched.waiting)
        out = schedule()
        if out.chunks:
            steps.append(
                Step(
                    tokens=tuple(
                        sorted((c.request.request_id, c.num_new_tokens) for c in out.chunks)
                    ),
                    preempted=tuple(sorted(r.request_id for r in out.preempted)),
                    hits=tuple(
                        sorted(
                            (c.request.request_id, c.num_cached_tokens)
                            for c in out.chunks
                            if c.request in waiting or c.request in out.preempted
                        )
                    ),
                    used_blocks=sched.paged.gpu.num_used,
                )
            )
        return out

    setattr(sched, "schedule", recorded)  # noqa: B010 (an instance's method, wrapped)
    run = engine.run()
    assert not run.deadlocked, f"pagedkv deadlocked: {run.stuck}"
    return steps

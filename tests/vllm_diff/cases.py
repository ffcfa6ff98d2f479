"""Seeded random workloads for the differential test against vLLM's own scheduler.

A case is one configuration (pool, budgets, options) and its requests; both sides, vLLM's
``Scheduler`` and pagedkv's ``vllm-v1`` policy, are driven with exactly this.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Req:
    rid: int
    arrival: int
    prompt: tuple[int, ...]
    output: tuple[int, ...]  # what the fake model samples, one token a step
    priority: int = 0


@dataclass(frozen=True)
class Case:
    seed: int
    block_size: int
    max_model_len: int
    num_gpu_blocks: int  # vLLM's num_gpu_blocks (the null block included)
    max_num_batched_tokens: int
    max_num_seqs: int
    watermark: float
    enable_prefix_caching: bool
    scheduler_reserve_full_isl: bool
    long_prefill_token_threshold: int
    max_num_scheduled_tokens: int | None
    max_num_active_seqs: int | None
    async_scheduling: bool
    scheduling_policy: str
    requests: tuple[Req, ...]

    def label(self) -> str:
        return (
            f"seed={self.seed} bs={self.block_size} len={self.max_model_len} "
            f"blocks={self.num_gpu_blocks} budget={self.max_num_batched_tokens} "
            f"seqs={self.max_num_seqs} wm={self.watermark} pc={self.enable_prefix_caching} "
            f"isl={self.scheduler_reserve_full_isl} thr={self.long_prefill_token_threshold} "
            f"sched={self.max_num_scheduled_tokens} active={self.max_num_active_seqs} "
            f"async={self.async_scheduling} policy={self.scheduling_policy} "
            f"n={len(self.requests)}"
        )


def random_case(seed: int) -> Case:
    """vLLM's defaults for the scheduler options; a random pool, budget, lengths and
    arrivals (lengths from a few tokens to the model length, budgets from below one prompt to
    large, pools from one longest request to roomy)."""
    rng = random.Random(seed)
    bs = rng.choice([4, 8, 16])
    max_len = rng.choice([64, 128, 256])
    n = rng.randint(2, 24)
    prefixes = [
        tuple(rng.randrange(1, 500) for _ in range(rng.randint(1, max_len // 2)))
        for _ in range(rng.randint(1, 3))
    ]
    shared = rng.random() < 0.6
    spread = rng.random() < 0.5
    reqs = []
    for rid in range(n):
        total = rng.randint(2, max_len)
        out_len = rng.randint(1, max(1, min(total - 1, rng.choice([4, 16, max_len]))))
        p_len = total - out_len
        prompt: tuple[int, ...] = ()
        if shared and rng.random() < 0.7:
            prompt = rng.choice(prefixes)[:p_len]
        prompt += tuple(rng.randrange(500, 1000) for _ in range(p_len - len(prompt)))
        output = tuple(rng.randrange(1000, 2000) for _ in range(out_len))
        arrival = rng.randint(0, 3 * n) if spread else 0
        reqs.append(Req(rid, arrival, prompt, output))
    longest = -(-max(len(r.prompt) + len(r.output) for r in reqs) // bs)
    blocks = 1 + longest + rng.choice([0, 1, longest // 2, longest, 4 * longest, 64 * longest])
    seqs = rng.choice([1, 2, 4, 256]) if rng.random() < 0.3 else 256
    budget = rng.choice([4, 16, 48, 128, 512, 2048])
    budget = max(budget, min(seqs, 256))
    return Case(
        seed=seed,
        block_size=bs,
        max_model_len=max_len,
        num_gpu_blocks=blocks,
        max_num_batched_tokens=budget,
        max_num_seqs=min(seqs, budget),
        watermark=0.0,
        enable_prefix_caching=rng.random() < 0.7,
        scheduler_reserve_full_isl=True,
        long_prefill_token_threshold=0,
        max_num_scheduled_tokens=None,
        max_num_active_seqs=None,
        async_scheduling=True,
        scheduling_policy="fcfs",
        requests=tuple(reqs),
    )


def with_option(case: Case, option: str, async_scheduling: bool = True) -> Case:
    """``case`` with one option changed from vLLM's default, async scheduling on or off."""
    rng = random.Random(case.seed * 7919 + len(option))
    case = replace(case, async_scheduling=async_scheduling)
    if option == "defaults":
        return case
    if option == "no_full_isl":
        return replace(case, scheduler_reserve_full_isl=False)
    if option == "threshold":
        return replace(case, long_prefill_token_threshold=rng.choice([1, 3, 8, 32]))
    if option == "scheduled_tokens":
        return replace(case, max_num_scheduled_tokens=rng.randint(1, case.max_num_batched_tokens))
    if option == "active_seqs":
        return replace(case, max_num_active_seqs=rng.randint(1, min(8, case.max_num_seqs)))
    if option == "watermark":
        return replace(case, watermark=rng.choice([0.01, 0.05, 0.2]))
    if option == "priority":
        reqs = tuple(replace(r, priority=rng.randint(-2, 2)) for r in case.requests)
        return replace(case, scheduling_policy="priority", requests=reqs)
    raise ValueError(option)


OPTIONS = (
    "defaults",
    "no_full_isl",
    "threshold",
    "scheduled_tokens",
    "active_seqs",
    "watermark",
    "priority",
)

"""Seeded sampling that does not depend on the schedule, and stop tokens.

* Temperature 1: the same prompts give the same tokens in a roomy run and under swap,
  recompute and chunked prefill (Hypothesis over pools and block sizes), and a request's
  tokens depend on its seed and prompt only (not on its id, its neighbours, its arrival).
* The draws follow softmax(logits / T) (frequencies over many seeds, a fixed seed list).
* Stop tokens: a request that samples one stops there, equal to transformers' ``generate``
  with that token as EOS, under preemption and prefix caching.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.engine.config import PreemptionMode, SchedulerConfig
from pagedkv.errors import ConfigError
from pagedkv.memory.block_table import cdiv
from pagedkv.tensors.executor import build_real_engine
from pagedkv.tensors.model import Decoder
from pagedkv.tensors.model_config import tiny_config
from pagedkv.tensors.sampling import SamplingConfig, draw_seed, request_seed, sample_rows
from pagedkv.workloads.spec import RequestSpec

PROMPT_LENS = (2, 9, 4, 13, 6, 17)
NUM_NEW = 6
HOT = SamplingConfig(temperature=1.0, seed=11)


@functools.cache
def tiny() -> Decoder:
    return Decoder.random(tiny_config("llama"), seed=3, dtype=torch.float64)


def _prompts() -> list[tuple[int, ...]]:
    g = torch.Generator().manual_seed(5)
    return [tuple(int(t) for t in torch.randint(0, 256, (n,), generator=g)) for n in PROMPT_LENS]


def _outputs(
    specs: list[RequestSpec],
    block_size: int = 16,
    num_blocks: int = 64,
    *,
    sampling: SamplingConfig = HOT,
    seeds: dict[int, int] | None = None,
    **options: Any,
) -> dict[int, list[int]]:
    engine = build_real_engine(
        tiny(),
        specs,
        num_gpu_blocks=num_blocks,
        block_size=block_size,
        num_cpu_blocks=64,
        scheduler=SchedulerConfig(max_model_len=64, **options),
        sampling=sampling,
        seeds=seeds,
        check_integrity=True,
    )
    run = engine.run()
    assert not run.deadlocked
    return {r.request_id: list(r.output_token_ids) for r in run.requests}


def _specs() -> list[RequestSpec]:
    return [RequestSpec(i, len(p), NUM_NEW, token_ids=p) for i, p in enumerate(_prompts())]


@functools.cache
def _roomy() -> dict[int, list[int]]:
    return _outputs(_specs())


@settings(max_examples=20, deadline=None)
@given(
    block_size=st.sampled_from([1, 3, 4]),
    extra=st.integers(0, 20),
    mode=st.sampled_from(["recompute", "swap"]),
    chunked=st.booleans(),
)
def test_sampled_tokens_do_not_depend_on_the_schedule(
    block_size: int, extra: int, mode: str, chunked: bool
) -> None:
    num_blocks = cdiv(max(PROMPT_LENS) + NUM_NEW, block_size) + extra
    options: dict[str, Any] = {"preemption_mode": mode}
    if chunked:
        options.update(enable_chunked_prefill=True, max_num_batched_tokens=8, max_num_seqs=8)
    assert _outputs(_specs(), block_size, num_blocks, **options) == _roomy()


def test_the_schedules_tested_do_preempt_and_sampling_is_not_greedy() -> None:
    engine = build_real_engine(
        tiny(),
        _specs(),
        num_gpu_blocks=cdiv(max(PROMPT_LENS) + NUM_NEW, 4),
        block_size=4,
        num_cpu_blocks=64,
        scheduler=SchedulerConfig(max_model_len=64, preemption_mode=PreemptionMode.SWAP),
        sampling=HOT,
    )
    run = engine.run()
    assert run.totals.swap_outs > 0
    assert {r.request_id: list(r.output_token_ids) for r in run.requests} == _roomy()
    assert _outputs(_specs(), sampling=SamplingConfig()) != _roomy()


def test_a_requests_tokens_depend_on_its_seed_and_prompt_only() -> None:
    p = _prompts()
    alone = _outputs([RequestSpec(0, len(p[3]), NUM_NEW, token_ids=p[3])], seeds={0: 99})
    crowd = [RequestSpec(i, len(q), NUM_NEW, token_ids=q) for i, q in enumerate(p)]
    crowd[3] = RequestSpec(7, len(p[3]), NUM_NEW, token_ids=p[3], arrival_time=0.0)
    mixed = _outputs(crowd, seeds={7: 99})
    assert mixed[7] == alone[0]  # another id, other neighbours, the same seed: the same tokens
    other = _outputs([RequestSpec(0, len(p[3]), NUM_NEW, token_ids=p[3])], seeds={0: 100})
    assert other[0] != alone[0]
    # without explicit seeds, a request's seed comes from the run's seed and its id
    assert _outputs(_specs(), sampling=SamplingConfig(temperature=1.0, seed=12)) != _roomy()


def test_draws_follow_the_softmax() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]], dtype=torch.float64)
    n = 4000
    seeds = [draw_seed(request_seed(0, 0), 0, i) for i in range(n)]
    draws = torch.cat([sample_rows(logits, 1.5, [s]) for s in seeds])
    freq = torch.bincount(draws, minlength=4).double() / n
    expected = torch.softmax(logits[0] / 1.5, dim=-1)
    assert torch.allclose(freq, expected, atol=0.03)  # 4000 draws: sd <= 0.008


@settings(max_examples=200, deadline=None)
@given(a=st.tuples(st.integers(0, 2**40), st.integers(0, 8), st.integers(0, 4096)))
def test_draw_seeds_are_valid_and_distinct_for_neighbours(a: tuple[int, int, int]) -> None:
    seed, sample, token = a
    s = draw_seed(seed, sample, token)
    assert 0 <= s < 2**63
    assert s != draw_seed(seed, sample, token + 1)
    assert s != draw_seed(seed, sample + 1, token)
    assert s != draw_seed(seed + 1, sample, token)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": -1}, "temperature"),
        ({"seed": -1}, "seed"),
        ({"stop_token_ids": [2]}, "stop_token_ids"),
        ({"stop_token_ids": (-2,)}, "stop_token_ids"),
    ],
)
def test_sampling_config_names_the_bad_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        SamplingConfig(**kwargs)
    assert err.value.field == field


@pytest.mark.parametrize(
    ("family", "blocks", "mode", "caching"),
    [("llama", 12, "swap", False), ("gpt2", 12, "recompute", True), ("mistral", 64, "swap", True)],
)
def test_stop_tokens_equal_hf_eos(
    family: str, blocks: int, mode: str, caching: bool, checkpoint_dir: Callable[..., Path]
) -> None:
    """A stop token from the middle of the greedy outputs: the requests that sample it end
    there (it is their last token), as transformers' generate with it as EOS."""
    pytest.importorskip("transformers")
    from pagedkv.tensors.checkpoint import load_checkpoint
    from tests.tensors.checkpoints import MAX_POSITION, hf_generate
    from tests.tensors.hf_reference import prompts

    path = checkpoint_dir(family)
    decoder = load_checkpoint(path).decoder
    ps = prompts()
    specs = [RequestSpec(i, len(p), 8, token_ids=p) for i, p in enumerate(ps)]

    def run(sampling: SamplingConfig) -> dict[int, list[int]]:
        engine = build_real_engine(
            decoder,
            specs,
            num_gpu_blocks=blocks,
            block_size=4,
            num_cpu_blocks=64,
            scheduler=SchedulerConfig(
                max_model_len=MAX_POSITION, preemption_mode=PreemptionMode(mode)
            ),
            sampling=sampling,
            enable_prefix_caching=caching,
            check_integrity=True,
        )
        out = engine.run()
        assert not out.deadlocked
        assert all(r.num_output_tokens == r.output_len for r in out.requests)
        return {r.request_id: list(r.output_token_ids) for r in out.requests}

    free = run(SamplingConfig())
    middle = [t for out in free.values() for t in out[1:-1]]
    stop = max(set(middle), key=middle.count)  # the commonest: several requests stop on it
    stopped = run(SamplingConfig(stop_token_ids=(stop,)))
    shorter = 0
    for i, out in stopped.items():
        assert tuple(out) == hf_generate(path, ps[i], 8, eos=(stop,)), f"request {i}"
        shorter += len(out) < 8
    assert shorter > 0

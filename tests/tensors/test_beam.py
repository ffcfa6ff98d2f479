"""Real beam search through the engine: the executor picks the k best (beam, token) candidates
by cumulative log-prob, the scheduler forks and frees the beams' sequences, and the best beam
equals Hugging Face ``generate(num_beams=k)`` token for token (float64, tiny random models).

HF settings that make the comparison exact: no EOS (the tiny models have none, and
``min_new_tokens = max_new_tokens`` masks it anyway), so every beam runs the same length, and
``length_penalty = 0``: the best finished beam is then the one with the highest sum of
log-probs, which is our first candidate of the last step.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")


from pagedkv.engine.config import PreemptionMode, SchedulerConfig
from pagedkv.memory.manager import KVCacheManager
from pagedkv.tensors.executor import build_real_engine
from tests.tensors.checked_cache import CheckedCache, run_checked
from tests.tensors.hf_reference import MAX_POSITION, decoder, hf_generate, prompts, specs

NUM_NEW = 5
PROMPT_LENS = (3, 7, 12, 19)  # 12 and 19 leave a partial last block of 4 and of 16


def hf_beam(arch: str, prompt: tuple[int, ...], k: int) -> tuple[int, ...]:
    return hf_generate(arch, prompt, NUM_NEW, num_beams=k)


# (arch, k, block_size, num_gpu_blocks): 10 blocks of 4 cannot hold every group at once, so
# groups are swapped out and back in whole
CASES = [
    ("gpt2", 2, 16, 40),
    ("gpt2", 3, 1, 400),
    ("gpt2", 3, 4, 10),
    ("llama", 2, 4, 10),
    ("llama", 3, 16, 40),
]


@pytest.mark.parametrize(("arch", "k", "block_size", "num_blocks"), CASES)
def test_best_beam_equals_hf_beam_search(
    arch: str, k: int, block_size: int, num_blocks: int
) -> None:
    ps = prompts(PROMPT_LENS)
    workload = [replace(s, beam_width=k) for s in specs(ps, NUM_NEW)]
    engine = build_real_engine(
        decoder(arch),
        workload,
        num_gpu_blocks=num_blocks,
        block_size=block_size,
        num_cpu_blocks=64,
        scheduler=SchedulerConfig(max_model_len=MAX_POSITION, preemption_mode=PreemptionMode.SWAP),
        check_integrity=True,  # the books after every iteration
        cache_factory=CheckedCache,
    )
    run, copies = run_checked(engine)  # never a write into a block beams still share
    for req in run.requests:
        assert tuple(req.output_token_ids) == hf_beam(arch, ps[req.request_id], k)
        assert len(req.seq_ids) == k
        scores = req.beam.scores if req.beam is not None else []
        assert scores == sorted(scores, reverse=True)  # seq_ids[0] is the best beam
    if block_size > 1:
        assert copies > 0  # beams sharing a partial last block copied it on write
    if num_blocks == 10:
        assert run.totals.swap_outs > 0
    kv = engine.scheduler.kv
    assert isinstance(kv, KVCacheManager)
    assert kv.num_free_blocks == kv.gpu.num_blocks  # every beam freed


def test_beams_recomputed_from_the_prompt_give_the_same_best_beam() -> None:
    """Without CPU room a preempted beam group restarts from its prompt; the search is
    deterministic, so the result is unchanged."""
    ps = prompts(PROMPT_LENS)
    workload = [replace(s, beam_width=2) for s in specs(ps, NUM_NEW)]
    engine = build_real_engine(
        decoder("gpt2"),
        workload,
        num_gpu_blocks=8,
        block_size=4,
        num_cpu_blocks=0,
        scheduler=SchedulerConfig(max_model_len=MAX_POSITION),
        check_integrity=True,
    )
    run = engine.run()
    assert not run.deadlocked
    assert sum(r.num_recomputed_tokens for r in run.requests) > 0
    for req in run.requests:
        assert tuple(req.output_token_ids) == hf_beam("gpt2", ps[req.request_id], 2)


def test_generate_runs_beam_search_deterministically() -> None:
    from pagedkv.errors import ConfigError
    from pagedkv.tensors.generate import generate
    from pagedkv.tensors.generate_config import GenerateConfig

    config = GenerateConfig(
        model="gpt2", num_prompts=3, prompt_len=6, max_new_tokens=4, block_size=4, num_beams=3
    )
    first, again = generate(config), generate(config)
    assert first["outputs"] == again["outputs"]
    assert all(len(o["output_token_ids"]) == 4 for o in first["outputs"])
    assert first["summary"]["num_gpu_blocks"] == 3 * 3 * 3  # room for every beam at once
    with pytest.raises(ConfigError) as err:
        GenerateConfig(num_beams=0)
    assert err.value.field == "num_beams"

"""Forked sequences on real tensors: a child shares its parent's prompt blocks (``fork``), both
decode, the shared partial last block is copied on the first write (copy-on-write), and each
output equals Hugging Face ``generate`` for its own token sequence.

The child is given a different first token than the parent (as parallel sampling would draw),
so the two really write different K/V after the fork: a write into the shared block, or a
missing copy, would change the other sequence's output."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from pagedkv.engine.request import Request
from pagedkv.engine.scheduler import ScheduledChunk, SchedulerOutput
from pagedkv.memory.config import CacheConfig
from pagedkv.memory.interface import BlockCopy
from pagedkv.memory.manager import KVCacheManager
from pagedkv.tensors.executor import TorchExecutor
from tests.tensors.checked_cache import CheckedCache
from tests.tensors.hf_reference import VOCAB, decoder, hf_greedy, prompts

NUM_NEW = 6


def _sample_into(req: Request, token: int) -> None:
    """What the engine does when a request samples (the chunk already counted as computed)."""
    req.output_token_ids.append(token)
    req.num_output_tokens += 1


@pytest.mark.parametrize(("arch", "block_size"), [("gpt2", 4), ("llama", 4), ("llama", 16)])
def test_fork_decodes_both_with_copy_on_write(arch: str, block_size: int) -> None:
    prompt = prompts((19,), seed=7)[0]  # 19 % 4, 19 % 16 != 0: a full block, then a partial
    model = decoder(arch)
    kv = KVCacheManager(CacheConfig(num_gpu_blocks=32, block_size=block_size))
    cache = CheckedCache(
        model.config.num_layers, 32, block_size, model.config.num_kv_heads,
        model.config.head_dim, dtype=model.dtype,
    )  # fmt: skip
    cache.kv = kv
    executor = TorchExecutor(model, cache, kv)

    parent = Request(0, 0.0, len(prompt), NUM_NEW, token_ids=prompt)
    assert kv.allocate(parent.seq_id, len(prompt), token_ids=prompt) == 0
    result = executor.execute(SchedulerOutput(chunks=[ScheduledChunk(parent, len(prompt), 0)]))
    assert result.sampled is not None
    parent.num_computed_tokens = len(prompt)
    first = result.sampled[parent.seq_id]
    _sample_into(parent, first)

    child = Request(1, 0.0, len(prompt), NUM_NEW, token_ids=prompt, seq_ids=["child"])
    assert kv.fork(parent.seq_id, child.seq_id) == []
    shared_last = kv.block_ids(parent.seq_id)[-1]
    child.num_computed_tokens = len(prompt)
    _sample_into(child, (first + 1) % VOCAB)  # a different draw than the parent's
    kv.check_integrity()

    all_copies: list[BlockCopy] = []
    for _ in range(NUM_NEW - 1):
        out = SchedulerOutput()
        for req in (parent, child):
            copies = kv.append_slots(req.seq_id, 1)
            assert copies is not None
            out.copies.extend(copies)
            out.chunks.append(ScheduledChunk(req, 1, req.num_computed_tokens))
        all_copies.extend(c for c in out.copies if isinstance(c, BlockCopy))
        result = executor.execute(out)
        assert result.sampled is not None
        for req in (parent, child):
            req.num_computed_tokens += 1
            _sample_into(req, result.sampled[req.seq_id])
        kv.check_integrity()

    # exactly one copy-on-write, of the shared partial block, on the first decode
    assert len(all_copies) == 1
    assert all_copies[0].src == shared_last
    assert kv.block_ids(parent.seq_id)[0] == kv.block_ids(child.seq_id)[0]  # full: still shared
    assert parent.output_token_ids == list(hf_greedy(arch, prompt, NUM_NEW))
    branch = (*prompt, child.output_token_ids[0])
    assert child.output_token_ids[1:] == list(hf_greedy(arch, branch, NUM_NEW - 1))

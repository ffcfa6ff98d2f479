"""Tiny random-initialised Hugging Face models (built in code, nothing downloaded) and their
greedy ``generate`` outputs: the reference the real executor must equal token for token.

float64: the tests check the paging (which K/V each token reads), not rounding; in float64 a
near-tie between two logits cannot flip the argmax between two correct implementations.
References are computed once per (arch, prompts, length) and shared by the tests of a worker.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from pagedkv.tensors.model import Decoder
from pagedkv.workloads.spec import RequestSpec

VOCAB = 128
MAX_POSITION = 128
DTYPE = torch.float64
PROMPT_LENS = (3, 5, 7, 11, 12, 16, 19, 23)
"""Eight prompts of different lengths; 16 is one block of 16, 12 one of 3 x 4 (and of 6 x 2)."""
NUM_NEW_TOKENS = 6


def prompts(lens: tuple[int, ...] = PROMPT_LENS, seed: int = 1) -> list[tuple[int, ...]]:
    g = torch.Generator().manual_seed(seed)
    return [tuple(int(t) for t in torch.randint(0, VOCAB, (n,), generator=g)) for n in lens]


@functools.cache
def hf_model(arch: str) -> Any:
    """GPT-2 (4 heads) or Llama (GQA: 4 heads, 2 kv heads): 2 layers, hidden 64, seeded."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)  # HF initialises from the global generator
    # no bos/eos: generation runs exactly max_new_tokens, as the engine does (EOS ignored)
    model: Any
    if arch == "gpt2":
        model = GPT2LMHeadModel(
            GPT2Config(
                n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=MAX_POSITION,
                bos_token_id=None, eos_token_id=None,
            )
        )  # fmt: skip
    else:
        model = LlamaForCausalLM(
            LlamaConfig(
                num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=MAX_POSITION,
                bos_token_id=None, eos_token_id=None,
            )
        )  # fmt: skip
    return model.to(DTYPE).eval()


@functools.cache
def decoder(arch: str) -> Decoder:
    return Decoder.from_hf(hf_model(arch))


@functools.cache
def hf_generate(
    arch: str, prompt: tuple[int, ...], num_new: int, num_beams: int = 1
) -> tuple[int, ...]:
    """HF ``generate`` (dynamic cache), one prompt at a time (no padding involved): greedy, or
    the best of ``num_beams`` beams with no length penalty (scores are plain sums of log-probs,
    as the real executor ranks them), exactly ``num_new`` tokens either way."""
    model = hf_model(arch)
    ids = torch.tensor([prompt])
    beams: dict[str, Any] = (
        {"num_beams": num_beams, "length_penalty": 0.0, "early_stopping": True}
        if num_beams > 1
        else {}
    )
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=num_new,
            min_new_tokens=num_new,
            pad_token_id=0,
            **beams,
        )
    return tuple(int(t) for t in out[0, len(prompt) :])


def hf_greedy(arch: str, prompt: tuple[int, ...], num_new: int) -> tuple[int, ...]:
    """HF greedy ``generate`` of ``num_new`` tokens."""
    return hf_generate(arch, prompt, num_new)


def specs(ps: list[tuple[int, ...]], num_new: int = NUM_NEW_TOKENS) -> list[RequestSpec]:
    return [RequestSpec(i, len(p), num_new, token_ids=p) for i, p in enumerate(ps)]

"""Tiny real checkpoints, built here: nothing downloaded, nothing binary committed.

Each family is a random-initialised ``transformers`` model (2 layers, hidden 64, vocab 128,
float64) saved with ``save_pretrained`` (safetensors, config.json, generation_config.json) next
to a BPE ``tokenizer.json`` trained with the ``tokenizers`` library on ``CORPUS``. HF
initialises biases to 0 and norms to 1; every 1-D parameter is perturbed here so that a bias or
norm read wrongly (or not at all) changes the logits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

VOCAB = 128
MAX_POSITION = 128
EOS, BOS, UNK = 2, 1, 0

CORPUS = """\
A block table maps the logical blocks of a sequence to physical blocks in the pool.
When the pool runs out of free blocks, the scheduler preempts the request that arrived last.
Preemption by swap moves the blocks of the victim to the CPU pool and back again later.
Preemption by recompute frees the blocks and prefills the prompt and its outputs once more.
Prefix caching hashes every full block together with the hash of the block before it.
A freed block keeps its hash, so a later request with the same prefix finds it in the cache.
The least recently used free block is evicted first when a new block is needed.
Copy on write protects a shared block: the writer gets a private copy of the last block.
Parallel sampling forks a sequence after its prompt, and the samples share the prompt blocks.
Beam search keeps the best few candidates and frees the beams that fall behind.
Chunked prefill splits a long prompt into pieces that fit the token budget of one step.
Decodes go first in every step, then the chunks of prompts that still wait for their turn.
The attention of a new token reads the keys and values of every token before it.
A sliding window limits each query to the latest keys, so older blocks are never read again.
Rotary embeddings turn each pair of dimensions by an angle that grows with the position.
Long context models stretch the angles so that positions far beyond training still fit.
The tokenizer splits text into pieces, and the model predicts the next piece at each step.
Greedy decoding takes the most likely token; sampling draws one from the distribution.
A seed makes the draw repeatable: the same seed and prompt give the same tokens every time.
The engine runs one loop: schedule, execute, update the counters, and account the memory.
Every slot of the cache is a token state, a reservation, fragmentation, or simply free.
The simulator and the real executor share one scheduler and one memory manager.
Small models with random weights are enough to check that the paging is right.
When a request emits the end of sequence token, it finishes and frees all of its blocks.
"""


def train_tokenizer(vocab_size: int = VOCAB) -> Any:
    """A BPE tokenizer trained on ``CORPUS`` (metaspace pieces, so decode restores spaces);
    ids 0, 1, 2 are ``<unk>``, ``<s>``, ``</s>``, and ``encode`` prepends ``<s>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
    )
    tok.train_from_iterator(CORPUS.splitlines(), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", BOS)]
    )
    return tok


def _rotary(**extra: Any) -> dict[str, Any]:
    shape = {
        "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": VOCAB,
        "max_position_embeddings": MAX_POSITION, "bos_token_id": BOS, "eos_token_id": EOS,
    }  # fmt: skip
    return {**shape, **extra}


def _scaled(kind: str, factor: float) -> dict[str, Any]:
    return {"rope_type": kind, "factor": factor}


def _longrope() -> dict[str, Any]:
    g = torch.Generator().manual_seed(7)
    short = (1 + torch.rand(8, generator=g)).tolist()  # head_dim 16: 8 frequencies
    long = (1 + 4 * torch.rand(8, generator=g)).tolist()
    return {
        "rope_type": "longrope",
        "short_factor": short,
        "long_factor": long,
        "original_max_position_embeddings": 16,  # the test prompts cross it
    }


# family name -> (transformers config class name, its arguments)
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", _rotary()),
    "llama-bias": ("LlamaConfig", _rotary(attention_bias=True, mlp_bias=True)),
    "llama-rope-linear": ("LlamaConfig", _rotary(rope_scaling=_scaled("linear", 4))),
    "llama-rope-dynamic": ("LlamaConfig", _rotary(rope_scaling=_scaled("dynamic", 2))),
    "llama-rope-yarn": (
        "LlamaConfig",
        _rotary(
            rope_scaling={"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32}
        ),
    ),
    "llama-rope-llama3": (
        "LlamaConfig",
        _rotary(
            rope_scaling={
                "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
            }
        ),
    ),
    "llama-rope-longrope": ("LlamaConfig", _rotary(rope_scaling=_longrope())),
    "llama-rope-proportional": (
        "LlamaConfig",
        _rotary(rope_scaling={**_scaled("proportional", 2), "partial_rotary_factor": 0.5}),
    ),
    "qwen2": ("Qwen2Config", _rotary()),
    "qwen2-sliding": (  # layer 1 (>= max_window_layers) slides
        "Qwen2Config",
        _rotary(use_sliding_window=True, sliding_window=5, max_window_layers=1),
    ),
    "qwen3": ("Qwen3Config", _rotary(head_dim=16)),
    "mistral": ("MistralConfig", _rotary(sliding_window=5)),
    "gemma": ("GemmaConfig", _rotary(head_dim=16, hidden_act="gelu_pytorch_tanh")),
    "gpt2": ("GPT2Config", {}),
    "gpt2-unscaled": ("GPT2Config", {"scale_attn_weights": False}),
    "gpt2-inverse-layer": ("GPT2Config", {"scale_attn_by_inverse_layer_idx": True}),
}  # fmt: skip

_GPT2_SHAPE = {
    "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": VOCAB, "n_positions": MAX_POSITION,
    "bos_token_id": BOS, "eos_token_id": EOS,
}  # fmt: skip


def hf_model(family: str) -> Any:
    """A random-initialised float64 model of ``family`` (seeded), 1-D parameters perturbed."""
    import transformers

    name, args = FAMILIES[family]
    if name == "GPT2Config":
        args = {**_GPT2_SHAPE, **args}
    config = getattr(transformers, name)(**args)
    torch.manual_seed(0)  # HF initialises from the global generator
    model = transformers.AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model.to(torch.float64).eval()


def save_checkpoint(family: str, path: Path, *, max_shard_size: str | None = None) -> Path:
    """``save_pretrained`` of ``hf_model(family)`` plus the trained tokenizer, into ``path``."""
    model = hf_model(family)
    path.mkdir(parents=True, exist_ok=True)
    kwargs: dict[str, Any] = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **kwargs)
    train_tokenizer().save(str(path / "tokenizer.json"))
    return path


_HF: dict[str, Any] = {}


def hf_from_dir(path: Path) -> Any:
    """The checkpoint as transformers loads it (float64), once per path."""
    key = str(path)
    if key not in _HF:
        import transformers

        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64)
        _HF[key] = model.eval()  # type: ignore[no-untyped-call]
    return _HF[key]


_GENERATED: dict[tuple[str, tuple[int, ...], int, int, tuple[int, ...]], tuple[int, ...]] = {}


def hf_generate(
    path: Path,
    prompt: tuple[int, ...],
    num_new: int,
    *,
    num_beams: int = 1,
    eos: tuple[int, ...] = (),
) -> tuple[int, ...]:
    """transformers' ``generate`` on one prompt: greedy (or ``num_beams`` beams, no length
    penalty), exactly ``num_new`` tokens unless ``eos`` names stop tokens (then it stops
    after the first one, which it keeps)."""
    key = (str(path), prompt, num_new, num_beams, eos)
    if key not in _GENERATED:
        model = hf_from_dir(path)
        ids = torch.tensor([prompt])
        extra: dict[str, Any] = (
            {"num_beams": num_beams, "length_penalty": 0.0, "early_stopping": True}
            if num_beams > 1
            else {}
        )
        stop: dict[str, Any] = (
            {"eos_token_id": list(eos)}
            if eos
            else {"min_new_tokens": num_new, "eos_token_id": None}
        )
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=num_new,
                pad_token_id=0,
                **stop,
                **extra,
            )
        _GENERATED[key] = tuple(int(t) for t in out[0, len(prompt) :])
    return _GENERATED[key]

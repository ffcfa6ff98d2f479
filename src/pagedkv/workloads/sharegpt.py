"""ShareGPT import: request lengths from a ShareGPT-format JSON file of conversations.

Two readings. ``load_sharegpt`` (kind 'trace' with a .json file): each human turn followed by a
gpt turn becomes one request; pairs too long for the model are dropped and counted.
``load_sharegpt_vllm`` (kind 'sharegpt'): as ``vllm bench serve --dataset-name sharegpt``
reads the file, one request per conversation. Lengths are counted by a tokenizer
(``load_tokenizer``: a local Hugging Face tokenizer directory) or ``approx_tokens``. Kept apart
from ``trace.py``: a ShareGPT file is a data set to draw from, not a trace, and has no arrival
times (the caller times the requests, see ``factory.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pagedkv import footprint
from pagedkv.errors import ConfigError
from pagedkv.validation import check_int, read_text
from pagedkv.workloads.spec import RequestSpec

CHARS_PER_TOKEN = 4
"""Without a tokenizer, a text of c characters counts ceil(c / 4) tokens: OpenAI's rule of thumb
("one token generally corresponds to ~4 characters of text for common English text", OpenAI
Help Center, "What are tokens and how to count them?"). Code and other languages differ."""


@dataclass(frozen=True)
class ShareGPTImport:
    """What ``load_sharegpt`` found: the requests kept and what it dropped, counted."""

    requests: tuple[RequestSpec, ...]
    pairs: int
    """Human turns followed by a gpt turn, in the whole file."""
    dropped_too_long: int
    """Pairs with prompt + output > max_model_len."""
    dropped_empty: int
    """Pairs with an empty (or all-blank) text on either side, or a tokenizer count of 0."""
    unpaired: int
    """Human turns not followed by a gpt turn (the conversation's last, or another role next)."""


VLLM_MIN_LEN = 4
VLLM_MAX_PROMPT_LEN = 1024
VLLM_MAX_TOTAL_LEN = 2048
"""vLLM's filter of ShareGPT pairs (``is_valid_sequence``, ``vllm/benchmarks/datasets/utils.py``,
defaults min_len 4, max_prompt_len 1024, max_total_len 2048): a prompt or an output under 4
tokens, a prompt over 1024 or a pair over 2048 is skipped."""


def load_tokenizer(path: str | Path) -> Callable[[str], int]:
    """A token counter from a local Hugging Face tokenizer: a directory holding
    ``tokenizer.json`` (or that file itself), read by the ``tokenizers`` library. A text
    counts the ids of ``encode(text)`` with the tokenizer's special tokens, as vLLM's
    ``tokenizer(prompt).input_ids`` counts them."""
    from tokenizers import Tokenizer

    where = Path(path)
    file = where / "tokenizer.json" if where.is_dir() else where
    if not file.is_file():
        raise ConfigError(
            "tokenizer",
            str(path),
            "must be a local Hugging Face tokenizer directory with a tokenizer.json",
        )
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as e:  # the library raises its own Exception for a bad file
        raise ConfigError("tokenizer", str(path), f"cannot be read ({_clip(str(e))})") from None
    return lambda text: len(tok.encode(text).ids)


def counting_note(tokenizer: str | None) -> str:
    """How a ShareGPT file's tokens are counted, for the run's output."""
    if tokenizer is not None:
        return f"ShareGPT tokens counted by the tokenizer in {tokenizer}"
    return (
        f"ShareGPT tokens estimated as ceil(characters / {CHARS_PER_TOKEN}) (no --tokenizer); "
        "give --tokenizer DIR to count them"
    )


def approx_tokens(text: str) -> int:
    """ceil(len(text) / CHARS_PER_TOKEN), at least 1 (see ``CHARS_PER_TOKEN``)."""
    return max(1, -(-len(text) // CHARS_PER_TOKEN))


def load_sharegpt(
    path: str | Path,
    *,
    tokenizer: Callable[[str], int] | None = None,
    max_model_len: int = 2048,
    seed: int = 0,
    num_requests: int | None = None,
) -> ShareGPTImport:
    """Pair each human turn of a ShareGPT-format file with the gpt turn after it.

    The file is a JSON list of ``{"id": ..., "conversations": [{"from": "human" | "gpt",
    "value": text}, ...]}``; turns of other roles are skipped. A pair's prompt is the human
    turn's text alone, without the conversation before it (as vLLM's benchmark takes the first
    turn of each conversation), so later turns have shorter prompts than a chat server would
    see. Token counts come from ``tokenizer(text)`` if given, else ``approx_tokens``. Pairs
    longer than ``max_model_len`` are dropped, not cut (as vLLM's benchmark filters them).

    With ``num_requests``, that many of the kept pairs are drawn without replacement by
    ``numpy.random.default_rng(seed)`` and kept in file order; otherwise all are kept and the
    seed is unused. Requests are numbered 0.. in file order, all arrive at t = 0 (the caller
    re-times them), and keep ``conversation_id`` (the item's "id", else its index) and
    ``turn`` (the pair's index within its conversation) in ``extra``.
    """
    path = Path(path)
    check_int("max_model_len", max_model_len, 2)
    check_int("seed", seed, 0)
    count = tokenizer if tokenizer is not None else approx_tokens
    # missing, a directory, not UTF-8, larger than a quarter of the footprint cap (its parsed
    # JSON holds a few times the file's bytes): one error
    text = read_text("trace_path", path, footprint.MEMORY_CAP_BYTES // 4)
    try:
        data = json.loads(text)
    except ValueError as e:  # a JSONDecodeError, or an integer of over 4300 digits
        raise ConfigError(str(path), _clip(str(e)), "must be a UTF-8 JSON file") from None
    if not isinstance(data, list):
        raise ConfigError(str(path), type(data).__name__, "must be a JSON list of conversations")
    kept: list[tuple[int, int, tuple[tuple[str, str], ...]]] = []
    pairs = too_long = empty = unpaired = 0
    for i, item in enumerate(data):
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list):
            raise ConfigError(f"{path}: item {i}", _clip(repr(item)), "needs a conversations list")
        for j, turn in enumerate(turns):
            if not (isinstance(turn, dict) and isinstance(turn.get("value"), str)):
                raise ConfigError(
                    f"{path}: item {i}: turn {j}", _clip(repr(turn)), 'needs a "value" string'
                )
        conv_id = str(item.get("id", i))
        k = pair_in_conversation = 0
        while k < len(turns):
            if turns[k].get("from") != "human":
                k += 1
                continue
            if k + 1 == len(turns) or turns[k + 1].get("from") != "gpt":
                unpaired += 1
                k += 1
                continue
            prompt_text, output_text = turns[k]["value"], turns[k + 1]["value"]
            extra = (("conversation_id", conv_id), ("turn", str(pair_in_conversation)))
            pair_in_conversation += 1
            pairs += 1
            k += 2
            if not prompt_text.strip() or not output_text.strip():
                empty += 1
                continue
            prompt, output = _count(count, prompt_text), _count(count, output_text)
            if prompt == 0 or output == 0:
                empty += 1
            elif prompt + output > max_model_len:
                too_long += 1
            else:
                kept.append((prompt, output, extra))
    if num_requests is not None:
        check_int("num_requests", num_requests, 1)
        if num_requests > len(kept):
            raise ConfigError(
                "num_requests", num_requests, f"must be <= the {len(kept)} pairs kept in {path}"
            )
        chosen = np.random.default_rng(seed).choice(len(kept), size=num_requests, replace=False)
        kept = [kept[int(i)] for i in sorted(chosen)]
    requests = tuple(
        RequestSpec(request_id=n, prompt_len=p, output_len=o, extra=x)
        for n, (p, o, x) in enumerate(kept)
    )
    return ShareGPTImport(requests, pairs, too_long, empty, unpaired)


def import_sharegpt(
    path: str | Path,
    *,
    tokenizer: Callable[[str], int] | None = None,
    max_model_len: int = 2048,
    seed: int = 0,
    num_requests: int | None = None,
) -> list[RequestSpec]:
    """The requests of ``load_sharegpt`` (which also counts what it dropped)."""
    result = load_sharegpt(
        path,
        tokenizer=tokenizer,
        max_model_len=max_model_len,
        seed=seed,
        num_requests=num_requests,
    )
    return list(result.requests)


@dataclass(frozen=True)
class VllmShareGPT:
    """What ``load_sharegpt_vllm`` found."""

    requests: tuple[RequestSpec, ...]
    conversations: int
    """Items with at least two turns (vLLM drops the others first)."""
    skipped: int
    """Conversations looked at and skipped by vLLM's length filter (``VLLM_MIN_LEN`` ...)."""
    repeated: int
    """Requests that repeat a kept one because the file had too few (vLLM's oversampling)."""


def load_sharegpt_vllm(
    path: str | Path,
    *,
    num_requests: int,
    tokenizer: Callable[[str], int] | None = None,
    seed: int = 0,
) -> VllmShareGPT:
    """``num_requests`` requests from a ShareGPT-format file, as vLLM's ``ShareGPTDataset``
    samples them (``vllm/benchmarks/datasets/sharegpt.py``):

    1. keep the items whose ``conversations`` list has at least two turns, and shuffle them
       with the seed (``numpy.random.default_rng(seed)``; vLLM shuffles with Python's
       ``random``, so the order, not the law, differs);
    2. in that order, a conversation's first turn (the human's, in ShareGPT) is the prompt and
       the second's token count the output length, whatever their roles, as vLLM reads them;
       a pair failing vLLM's filter (``VLLM_MIN_LEN``, ``VLLM_MAX_PROMPT_LEN``,
       ``VLLM_MAX_TOTAL_LEN``) is skipped, until ``num_requests`` are kept;
    3. too few in the file: kept requests drawn at random (with replacement) are repeated up
       to ``num_requests`` (vLLM's ``maybe_oversample_requests``); none kept is an error.

    Counted by ``tokenizer(text)`` if given, else ``approx_tokens``. Requests are numbered in
    that order, arrive at t = 0 (the caller times them) and keep ``conversation_id`` (the
    item's "id", else its index) in ``extra``.
    """
    path = Path(path)
    check_int("num_requests", num_requests, 1)
    check_int("seed", seed, 0)
    count = tokenizer if tokenizer is not None else approx_tokens
    text = read_text("trace_path", path, footprint.MEMORY_CAP_BYTES // 4)
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ConfigError(str(path), _clip(str(e)), "must be a UTF-8 JSON file") from None
    if not isinstance(data, list):
        raise ConfigError(str(path), type(data).__name__, "must be a JSON list of conversations")
    items = []
    for i, item in enumerate(data):
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        for j, turn in enumerate(turns[:2]):
            if not (isinstance(turn, dict) and isinstance(turn.get("value"), str)):
                raise ConfigError(
                    f"{path}: item {i}: turn {j}", _clip(repr(turn)), 'needs a "value" string'
                )
        items.append((str(item.get("id", i)), turns[0]["value"], turns[1]["value"]))
    rng = np.random.default_rng(seed)
    kept: list[tuple[int, int, str]] = []
    skipped = 0
    for k in rng.permutation(len(items)):
        if len(kept) == num_requests:
            break
        conv_id, prompt_text, output_text = items[int(k)]
        prompt, output = _count(count, prompt_text), _count(count, output_text)
        if (
            min(prompt, output) < VLLM_MIN_LEN
            or prompt > VLLM_MAX_PROMPT_LEN
            or prompt + output > VLLM_MAX_TOTAL_LEN
        ):
            skipped += 1
            continue
        kept.append((prompt, output, conv_id))
    if not kept:
        raise ConfigError(
            "trace_path",
            str(path),
            f"has no conversation that vLLM's ShareGPT filter keeps (of {len(items)} with two "
            f"turns: prompt and output >= {VLLM_MIN_LEN} tokens, prompt <= "
            f"{VLLM_MAX_PROMPT_LEN}, both <= {VLLM_MAX_TOTAL_LEN})",
        )
    repeated = num_requests - len(kept)
    if repeated:
        kept += [kept[int(i)] for i in rng.integers(0, len(kept), size=repeated)]
    requests = tuple(
        RequestSpec(request_id=n, prompt_len=p, output_len=o, extra=(("conversation_id", c),))
        for n, (p, o, c) in enumerate(kept)
    )
    return VllmShareGPT(requests, len(items), skipped, repeated)


def _count(count: Callable[[str], int], text: str) -> int:
    n = count(text)
    return check_int("tokenizer(text)", n, 0)


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."

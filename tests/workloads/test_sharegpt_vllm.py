"""Kind 'sharegpt': a ShareGPT file as vllm bench serve reads it (first turn, the next turn's
length, vLLM's filter, shuffled, oversampled), counted by a local Hugging Face tokenizer or as
characters / 4, and the run says which."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from pagedkv.cli import main
from pagedkv.errors import ConfigError
from pagedkv.exits import EXIT_OK
from pagedkv.workloads.config import WorkloadConfig
from pagedkv.workloads.factory import make_workload
from pagedkv.workloads.sharegpt import (
    CHARS_PER_TOKEN,
    VLLM_MAX_PROMPT_LEN,
    VLLM_MIN_LEN,
    load_sharegpt_vllm,
    load_tokenizer,
)

WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "sat",
    "on",
    "mat",
    "ran",
    "far",
    "and",
    "then",
    "slept",
    "under",
    "tree",
]


def _turns(*texts: str) -> list[dict[str, str]]:
    roles = ["human", "gpt"] * 4
    return [{"from": r, "value": v} for r, v in zip(roles, texts, strict=False)]


def _text(n: int, start: int = 0) -> str:
    return " ".join(WORDS[(start + i) % len(WORDS)] for i in range(n))


CONVERSATIONS = [
    {"id": "a", "conversations": _turns(_text(8), _text(12), _text(30), _text(40))},
    {"id": "b", "conversations": _turns(_text(20, 3), _text(6, 1))},
    {"id": "short", "conversations": _turns("hi", _text(30))},  # a 1-token prompt: skipped
    {"id": "alone", "conversations": _turns(_text(9))},  # one turn: dropped first
    {"id": "c", "conversations": _turns(_text(15, 5), _text(25, 2))},
]


@pytest.fixture
def sharegpt(tmp_path: Path) -> Path:
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(CONVERSATIONS))
    return path


@pytest.fixture
def tokenizer_dir(tmp_path: Path) -> Path:
    """A word-level tokenizer trained here on WORDS (the ``tokenizers`` library)."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    trainer = tokenizers.trainers.WordLevelTrainer(special_tokens=["<unk>"])
    tok.train_from_iterator([" ".join(WORDS)] * 3, trainer)
    where = tmp_path / "tok"
    where.mkdir()
    tok.save(str(where / "tokenizer.json"))
    return where


def _expected(count: Callable[[str], int]) -> dict[str, tuple[int, int]]:
    """conversation id -> (prompt, output) of what vLLM's filter keeps, counted by ``count``."""
    out = {}
    for item in CONVERSATIONS:
        turns: list[dict[str, str]] = item["conversations"]  # type: ignore[assignment]
        if len(turns) < 2:
            continue
        p, o = count(turns[0]["value"]), count(turns[1]["value"])
        if min(p, o) >= VLLM_MIN_LEN and p <= VLLM_MAX_PROMPT_LEN:
            out[str(item["id"])] = (p, o)
    return out


def _found(requests: Sequence[Any]) -> dict[str, tuple[int, int]]:
    return {dict(r.extra)["conversation_id"]: (r.prompt_len, r.output_len) for r in requests}


def test_first_turn_and_the_next_turns_length_by_the_tokenizer(
    sharegpt: Path, tokenizer_dir: Path
) -> None:
    count = load_tokenizer(tokenizer_dir)
    assert count(_text(8)) == 8  # one token per word: the trained vocabulary holds them all
    found = load_sharegpt_vllm(sharegpt, num_requests=3, tokenizer=count, seed=5)
    assert _found(found.requests) == _expected(count) == {"a": (8, 12), "b": (20, 6), "c": (15, 25)}
    assert (found.conversations, found.skipped, found.repeated) == (4, 1, 0)


def test_without_a_tokenizer_characters_over_four(sharegpt: Path) -> None:
    found = load_sharegpt_vllm(sharegpt, num_requests=3)

    def quarter(text: str) -> int:
        return math.ceil(len(text) / CHARS_PER_TOKEN)

    assert _found(found.requests) == _expected(quarter)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_too_few_are_repeated_and_the_seed_picks_the_order(sharegpt: Path, seed: int) -> None:
    found = load_sharegpt_vllm(sharegpt, num_requests=10, seed=seed)
    assert len(found.requests) == 10
    assert found.repeated == 10 - 3
    assert set(_found(found.requests)) == {"a", "b", "c"}
    assert [r.request_id for r in found.requests] == list(range(10))
    again = load_sharegpt_vllm(sharegpt, num_requests=10, seed=seed)
    assert again == found


def test_orders_differ_across_seeds(sharegpt: Path) -> None:
    orders = {
        tuple(
            dict(r.extra)["conversation_id"]
            for r in load_sharegpt_vllm(sharegpt, num_requests=3, seed=s).requests
        )
        for s in range(12)
    }
    assert len(orders) > 1


def test_nothing_kept_is_one_error(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps([{"conversations": _turns("hi", "yo")}]))
    with pytest.raises(ConfigError) as info:
        load_sharegpt_vllm(path, num_requests=1)
    assert info.value.field == "trace_path"


def test_a_missing_tokenizer_is_one_error(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    with pytest.raises(ConfigError) as info:
        load_tokenizer(tmp_path)
    assert info.value.field == "tokenizer"


def test_the_kind_reads_the_file_with_its_tokenizer(sharegpt: Path, tokenizer_dir: Path) -> None:
    config = WorkloadConfig(
        kind="sharegpt",  # type: ignore[arg-type]
        trace_path=str(sharegpt),
        tokenizer=str(tokenizer_dir),
        num_requests=3,
    )
    assert _found(make_workload(config)) == _expected(load_tokenizer(tokenizer_dir))
    assert WorkloadConfig(kind="sharegpt", trace_path=str(sharegpt)).num_requests == 1000  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        WorkloadConfig(kind="sharegpt", trace_path="s.jsonl")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        WorkloadConfig(kind="fixed", prompt_len=1, output_len=1, tokenizer="t")  # type: ignore[arg-type]


def test_the_run_says_how_it_counted(
    sharegpt: Path, tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--dataset-name", "sharegpt", "--dataset-path", str(sharegpt)]
    argv += ["--num-prompts", "3", "--cost-model", "unit", "--quiet"]
    assert main(argv) == EXIT_OK
    assert "ceil(characters / 4)" in capsys.readouterr().err
    assert main([*argv, "--tokenizer", str(tokenizer_dir)]) == EXIT_OK
    assert f"counted by the tokenizer in {tokenizer_dir}" in capsys.readouterr().err

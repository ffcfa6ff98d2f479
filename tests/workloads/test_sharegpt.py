"""ShareGPT import: pairing human and gpt turns, token counts, drops, sampling, bad files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pagedkv.errors import ConfigError
from pagedkv.workloads.sharegpt import (
    CHARS_PER_TOKEN,
    approx_tokens,
    import_sharegpt,
    load_sharegpt,
)
from pagedkv.workloads.spec import RequestSpec

C1 = [
    {"from": "human", "value": "Hello there, how are you?"},
    {"from": "gpt", "value": "Fine, thank you. And you?"},
    {"from": "human", "value": "Write me a long poem."},
    {"from": "gpt", "value": "x" * 400},
    {"from": "human", "value": "unanswered"},
]
C2 = [
    {"from": "system", "value": "be brief"},
    {"from": "human", "value": "a"},
    {"from": "gpt", "value": "   "},
    {"from": "gpt", "value": "an extra reply, without a question"},
    {"from": "human", "value": "what is 2 + 2?"},
    {"from": "human", "value": "hello?"},
    {"from": "gpt", "value": "four"},
]
CONVERSATIONS = [{"id": "c1", "conversations": C1}, {"conversations": C2}]


def _write_sharegpt(tmp_path: Path, data: object = CONVERSATIONS) -> Path:
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    return path


def test_sharegpt_without_tokenizer(tmp_path: Path) -> None:
    path = _write_sharegpt(tmp_path)
    result = load_sharegpt(path, max_model_len=60)

    def tokens(text: str) -> int:
        return math.ceil(len(text) / CHARS_PER_TOKEN)

    expected = [
        (C1[0]["value"], C1[1]["value"], "c1", "0"),
        (C2[5]["value"], C2[6]["value"], "1", "1"),  # no "id": the item's index
    ]
    assert result.requests == tuple(
        RequestSpec(i, tokens(p), tokens(o), 0.0, (("conversation_id", c), ("turn", t)))
        for i, (p, o, c, t) in enumerate(expected)
    )
    # 4 pairs; the poem (6 + 100 tokens) is too long for 60; the blank reply is empty;
    # "unanswered" and "what is 2 + 2?" have no reply right after them.
    counts = (result.pairs, result.dropped_too_long, result.dropped_empty, result.unpaired)
    assert counts == (4, 1, 1, 2)


def test_sharegpt_with_tokenizer(tmp_path: Path) -> None:
    path = _write_sharegpt(tmp_path)

    def words(text: str) -> int:
        return len(text.split())

    requests = import_sharegpt(path, tokenizer=words)
    # With the default 2048 the poem fits; the blank reply is still dropped.
    pairs = [(C1[0], C1[1]), (C1[2], C1[3]), (C2[5], C2[6])]
    expected = [(words(p["value"]), words(o["value"])) for p, o in pairs]
    assert [(r.prompt_len, r.output_len) for r in requests] == expected


def test_approx_tokens() -> None:
    assert [approx_tokens("x" * n) for n in (0, 1, 4, 5, 8, 9)] == [1, 1, 1, 2, 2, 3]


def test_sharegpt_sampling(tmp_path: Path) -> None:
    many = [
        {
            "id": str(i),
            "conversations": [
                {"from": "human", "value": "q" * (i + 1)},
                {"from": "gpt", "value": "a"},
            ],
        }
        for i in range(50)
    ]
    path = _write_sharegpt(tmp_path, many)
    a = import_sharegpt(path, num_requests=10, seed=1)
    assert a == import_sharegpt(path, num_requests=10, seed=1)
    assert a != import_sharegpt(path, num_requests=10, seed=2)
    assert [r.request_id for r in a] == list(range(10))
    ids = [int(dict(r.extra)["conversation_id"]) for r in a]
    assert ids == sorted(ids)  # kept in file order
    assert len(set(ids)) == 10
    with pytest.raises(ConfigError) as info:
        import_sharegpt(path, num_requests=51)
    assert info.value.field == "num_requests"


@pytest.mark.parametrize(
    "data",
    [
        {"conversations": []},
        [{"id": "x"}],
        [{"conversations": [{"from": "human", "value": 3}]}],
        [{"conversations": ["hi"]}],
    ],
)
def test_malformed_sharegpt(tmp_path: Path, data: object) -> None:
    path = _write_sharegpt(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        import_sharegpt(path)
    assert info.value.field.startswith(str(path))


def test_sharegpt_bad_json_and_bad_tokenizer(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text("[{")
    with pytest.raises(ConfigError) as info:
        import_sharegpt(path)
    assert info.value.field == str(path)
    good = _write_sharegpt(tmp_path)
    with pytest.raises(ConfigError) as info:
        import_sharegpt(good, tokenizer=lambda text: -1)
    assert info.value.field == "tokenizer(text)"


def test_a_file_too_large_to_parse_within_the_cap_is_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "sg.json"
    path.write_text(json.dumps([{"conversations": [{"value": "x" * 1000}]}]))
    monkeypatch.setattr("pagedkv.footprint.MEMORY_CAP_BYTES", 2000)
    with pytest.raises(ConfigError, match="must be at most 500 bytes") as err:
        import_sharegpt(path, max_model_len=2048, seed=0)
    assert err.value.field == "trace_path"


def test_a_directory_or_non_utf8_file_is_one_error(tmp_path: Path) -> None:
    (tmp_path / "d.json").mkdir()
    with pytest.raises(ConfigError, match="not a directory"):
        import_sharegpt(tmp_path / "d.json", max_model_len=2048, seed=0)
    (tmp_path / "b.json").write_bytes(b'[{"conversations": [{"value": "\xff"}]}]')
    with pytest.raises(ConfigError, match="UTF-8 text"):
        import_sharegpt(tmp_path / "b.json", max_model_len=2048, seed=0)

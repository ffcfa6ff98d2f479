"""Chat sessions in trace files: a ``session_id`` column chains turns into closed-loop chat.

* Round trip: the built-in chat workload written as a trace and read back as kind 'trace' is
  the same list of requests (ids, parents, think times, token ids), and simulates the same.
* A hand-written trace: turns become follow-ups whose ids start with the conversation, so
  prefix caching hits across turns; think time defaults to 0.
* Bad sessions are refused naming the file, the line, the column and the value.
* Determinism of the sharing workloads: the same seed gives byte-identical JSON, across
  processes with different string hash seeds.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.errors import ConfigError
from pagedkv.simulation import SimulationConfig, simulate
from pagedkv.workloads import (
    RequestSpec,
    TraceError,
    WorkloadConfig,
    WorkloadKind,
    make_workload,
    read_trace,
    write_trace,
)
from pagedkv.workloads.token_ids import (
    DEFAULT_TRACE_THINK_TIME,
    chain_sessions,
    owner_of,
    session_id_counts,
)


def _chat(**kw: Any) -> list[RequestSpec]:
    base: dict[str, Any] = {"kind": WorkloadKind.CHAT, "num_sessions": 4, "chat_turns": 3}
    return make_workload(WorkloadConfig(**{**base, **kw}))


def _replay(path: Path, **kw: Any) -> list[RequestSpec]:
    return make_workload(WorkloadConfig(kind=WorkloadKind.TRACE, trace_path=str(path), **kw))


@settings(max_examples=20, deadline=None)
@given(
    sessions=st.integers(1, 4),
    turns=st.integers(1, 4),
    system=st.sampled_from([None, 1, 20]),
    max_len=st.sampled_from([64, 2048]),
    think=st.sampled_from([0.0, 2.5]),
    timed=st.booleans(),
    suffix=st.sampled_from([".jsonl", ".csv"]),
    seed=st.integers(0, 20),
)
def test_chat_written_as_a_trace_reads_back_the_same(
    tmp_path_factory: pytest.TempPathFactory,
    sessions: int,
    turns: int,
    system: int | None,
    max_len: int,
    think: float,
    timed: bool,
    suffix: str,
    seed: int,
) -> None:
    arrivals: dict[str, Any] = {"arrival": "poisson", "request_rate": 1.0} if timed else {}
    specs = _chat(
        num_sessions=sessions,
        chat_turns=turns,
        prefix_len=system,
        max_model_len=max_len,
        think_time_mean=think,
        seed=seed,
        **arrivals,
    )
    path = write_trace(tmp_path_factory.mktemp("t") / f"chat{suffix}", specs)
    back = _replay(path, max_model_len=max_len)
    assert back == specs  # ids, parents, think times, token ids, lengths, times, columns
    assert [r.parent_id for r in back] == [r.parent_id for r in specs]  # (named, to be clear)


def test_a_replayed_chat_simulates_the_same(tmp_path: Path) -> None:
    specs = _chat(num_sessions=6, chat_turns=4, prefix_len=32, seed=2)
    path = write_trace(tmp_path / "chat.jsonl", specs)
    flat = {"enable_prefix_caching": True, "num_gpu_blocks": 200}
    chat = simulate(
        SimulationConfig.from_flat(
            {**flat, "workload": "chat", "num_sessions": 6, "chat_turns": 4, "prefix_len": 32}
            | {"seed": 2}
        )
    )
    replay = simulate(
        SimulationConfig.from_flat({**flat, "workload": "trace", "trace_path": str(path)})
    )
    assert chat.summary["prefix_cache"]["hit_tokens"] > 0
    assert replay.summary == chat.summary  # the same run: every metric, to the last bit
    assert replay.requests == chat.requests


def _trace(tmp_path: Path, lines: list[dict[str, Any]], name: str = "t.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(row) + "\n" for row in lines))
    return path


def test_session_turns_become_closed_loop_follow_ups(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = [
        {"arrival_time": 0.0, "prompt_len": 10, "output_len": 5, "session_id": "a"},
        {"arrival_time": 0.5, "prompt_len": 4, "output_len": 3},  # no session: unchanged
        {"arrival_time": 1.0, "prompt_len": 8, "output_len": 2, "session_id": "b"},
        {"arrival_time": 9.0, "prompt_len": 20, "output_len": 5, "session_id": "a"},
        {"arrival_time": 9.5, "prompt_len": 11, "output_len": 1, "session_id": "b"},
        {"arrival_time": 30, "prompt_len": 27, "output_len": 4, "session_id": "a", "think_time": 2},
    ]
    a0, other, b0, a1, b1, a2 = _replay(_trace(tmp_path, rows))
    assert other.parent_id is None
    assert other.token_ids is None  # nothing asked for ids
    for first in (a0, b0):
        assert first.parent_id is None
        assert first.token_ids is not None
        assert {owner_of(t) for t in first.token_ids} == {("request", first.request_id)}
    for turn, before in ((a1, a0), (b1, b0), (a2, a1)):
        assert turn.parent_id == before.request_id
        assert turn.token_ids is not None
        assert before.token_ids is not None
        assert before.output_token_ids is not None
        history = before.token_ids + before.output_token_ids
        assert turn.token_ids[: len(history)] == history
        assert {owner_of(t) for t in turn.token_ids[len(history) :]} == {
            ("request", turn.request_id)
        }
    assert a1.think_time == b1.think_time == DEFAULT_TRACE_THINK_TIME
    assert a2.think_time == 2.0
    flat: dict[str, Any] = {"workload": "trace", "trace_path": str(tmp_path / "t.jsonl")}
    flat |= {"enable_prefix_caching": True, "block_size": 4}
    cache = simulate(SimulationConfig.from_flat(flat)).summary["prefix_cache"]
    assert cache["hit_tokens"] > 0  # later turns reuse the conversation's blocks


def test_a_session_can_start_with_a_shared_prefix(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = [
        {"arrival_time": 0, "prompt_len": 9, "output_len": 2, "session_id": "s"}
        | {"prefix_id": "1", "prefix_len": "6"},
        {"arrival_time": 0, "prompt_len": 12, "output_len": 2, "session_id": "s"}
        | {"prefix_id": "private"},  # a later turn's prefix columns are not used
    ]
    first, second = _replay(_trace(tmp_path, rows))
    assert first.token_ids is not None
    assert second.token_ids is not None
    assert [owner_of(t) for t in second.token_ids[:6]] == [("prefix", 1)] * 6
    assert second.token_ids[:9] == first.token_ids


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
@pytest.mark.parametrize(
    ("rows", "column", "value", "line"),
    [
        ([(10, 5, {}), (14, 1, {})], "prompt_len", 14, 2),  # 14 < 10 + 5
        ([(10, 5, {"turn": 0}), (15, 1, {"turn": 0})], "turn", "0", 2),
        ([(10, 5, {"turn": 2}), (15, 1, {"turn": 1})], "turn", "1", 2),
        ([(10, 5, {"turn": "x"})], "turn", "x", 1),
        ([(10, 5, {}), (15, 1, {"think_time": -1})], "think_time", "-1", 2),
        ([(10, 5, {}), (15, 1, {"think_time": "soon"})], "think_time", "soon", 2),
    ],
)
def test_a_bad_session_names_the_line_column_and_value(
    tmp_path: Path,
    suffix: str,
    rows: list[tuple[int, int, dict[str, Any]]],
    column: str,
    value: object,
    line: int,
) -> None:
    specs = [
        RequestSpec(i, p, o, 0.0, (("session_id", "7"), *((k, str(v)) for k, v in extra.items())))
        for i, (p, o, extra) in enumerate(rows)
    ]
    path = write_trace(tmp_path / f"t{suffix}", specs)
    if suffix == ".csv":
        line += 1  # the header is line 1
    with pytest.raises(TraceError) as e:
        read_trace(path)
    assert e.value.line == line
    assert e.value.column == column
    assert e.value.value == value
    assert f"{path}:{line}: {column}" in str(e.value)


def test_a_turn_cut_to_max_model_len_is_refused_by_request(tmp_path: Path) -> None:
    specs = _chat(num_sessions=1, chat_turns=3, seed=1)
    path = write_trace(tmp_path / "chat.jsonl", specs)
    cut = specs[0].final_len  # turn 1's prompt is cut shorter than the conversation before it
    with pytest.raises(ConfigError) as e:
        _replay(path, max_model_len=cut)
    assert e.value.field == "request 1: prompt_len"
    assert "max_model_len" in str(e.value)


def test_chain_sessions_by_hand() -> None:
    session = (("session_id", "x"),)
    specs = [RequestSpec(0, 6, 2, 0.0, session), RequestSpec(1, 7, 2, 0.0, session)]
    with pytest.raises(ConfigError) as e:
        chain_sessions(specs)  # 7 < 6 + 2
    assert e.value.field == "request 1: prompt_len"
    bad = dataclasses.replace(specs[1], prompt_len=8, extra=(*session, ("think_time", "nan")))
    with pytest.raises(ConfigError) as e:
        chain_sessions([specs[0], bad])
    assert e.value.field == "request 1: think_time"
    plain = [RequestSpec(0, 6, 2)]
    assert chain_sessions(plain) == plain


# ----- determinism ---------------------------------------------------------------------------
_DUMP = """
import dataclasses, json, sys
from pagedkv.simulation import SimulationConfig, simulate
from pagedkv.workloads import WorkloadConfig, make_workload
configs = [
    {"kind": "shared-prefix", "prefix_len": 40, "num_prefixes": 3, "share_ratio": 0.6,
     "num_requests": 30, "arrival": "poisson", "request_rate": 2.0, "seed": 5},
    {"kind": "translation", "shots": 5, "share_ratio": 0.8, "num_requests": 30, "seed": 5},
    {"kind": "chat", "num_sessions": 5, "chat_turns": 3, "prefix_len": 16, "seed": 5},
]
out = [[dataclasses.asdict(r) for r in make_workload(WorkloadConfig(**c))] for c in configs]
flat = {"workload": "chat", "num_sessions": 5, "chat_turns": 3, "seed": 5,
        "enable_prefix_caching": True, "num_gpu_blocks": 300}
out.append(simulate(SimulationConfig.from_flat(flat)).to_dict())
sys.stdout.write(json.dumps(out, sort_keys=True, default=list))
"""


def test_sharing_workloads_are_byte_identical_across_processes() -> None:
    """Same seed, same bytes: the shared-prefix, translation and chat workloads and a chat
    simulation with prefix caching, in two processes whose str hashes differ."""
    dumps = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run(
            [sys.executable, "-c", _DUMP], capture_output=True, env=env, check=True, timeout=120
        )
        dumps.append(done.stdout)
    assert dumps[0] == dumps[1]
    assert len(json.loads(dumps[0])) == 4


def _entries(specs: list[RequestSpec]) -> int:
    """The token id slots the requests' tuples hold."""
    return sum(len(r.token_ids or ()) + len(r.output_token_ids or ()) for r in specs)


@settings(max_examples=30, deadline=None)
@given(
    turns=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 40), st.integers(1, 30)),
        min_size=1,
        max_size=12,
    )
)
def test_the_footprint_estimate_counts_every_id_chaining_makes(
    turns: list[tuple[str, int, int]],
) -> None:
    specs: list[RequestSpec] = []
    conversation: dict[str, int] = {}
    for i, (session, message, output) in enumerate(turns):
        prompt = conversation.get(session, 0) + message + 1
        conversation[session] = prompt + output
        extra = (("session_id", session),)
        specs.append(RequestSpec(i, prompt, output, float(i), extra))
    new, repeated = session_id_counts(specs)
    assert new + sum(repeated.values()) == _entries(chain_sessions(specs))


def test_a_small_trace_with_huge_sessions_is_refused_before_it_holds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 24 turns growing by 2^14 tokens: 2.2M ids repeated, 0.4M made: about 35 MB if made
    path = tmp_path / "chain.csv"
    rows = [f"0,{(t + 1) << 14},1,{s}" for t in range(12) for s in ("x", "y")]
    path.write_text("arrival_time,prompt_len,output_len,session_id\n" + "\n".join(rows) + "\n")
    config = WorkloadConfig(kind=WorkloadKind.TRACE, trace_path=str(path), max_model_len=1 << 24)
    monkeypatch.setattr("pagedkv.footprint.MEMORY_CAP_BYTES", 16 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError) as err:
            make_workload(config)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(err.value)
    assert err.value.field == f"{path}: session 'x'"  # the file and the session
    assert "repeated token ids" in message
    assert "MiB" in message
    assert "\n" not in message
    assert peak < 4 << 20  # refused from the lengths, before any id was made
    monkeypatch.undo()
    assert len(make_workload(config)) == 24  # under the real cap it runs

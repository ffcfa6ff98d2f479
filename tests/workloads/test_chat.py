"""Chat sessions: determinism, each turn holds the conversation before it, closed-loop turns,
the length cap, and prefix caching reusing the conversation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.errors import ConfigError
from pagedkv.simulation import SimulationConfig, simulate
from pagedkv.workloads import (
    RequestSpec,
    WorkloadConfig,
    WorkloadKind,
    make_workload,
    read_trace,
    write_trace,
)
from pagedkv.workloads.chat import chat_id_counts
from pagedkv.workloads.shared_prefix import suffix_model
from pagedkv.workloads.token_ids import owner_of


def _chat(**kw: Any) -> list[RequestSpec]:
    base: dict[str, Any] = {"kind": "chat", "num_sessions": 6, "chat_turns": 3}
    return make_workload(WorkloadConfig(**{**base, **kw}))


def _session(r: RequestSpec) -> tuple[int, int]:
    extra = dict(r.extra)
    return int(extra["session_id"]), int(extra["turn"])


def test_same_seed_same_sessions() -> None:
    assert _chat(seed=4, prefix_len=12) == _chat(seed=4, prefix_len=12)
    assert _chat(seed=4) != _chat(seed=5)


@settings(max_examples=30, deadline=None)
@given(
    sessions=st.integers(1, 5),
    turns=st.integers(1, 5),
    system=st.sampled_from([None, 1, 30]),
    max_len=st.sampled_from([64, 256, 2048]),
    think=st.sampled_from([0.0, 3.0]),
    seed=st.integers(0, 30),
)
def test_each_turn_holds_the_conversation_before_it(
    sessions: int, turns: int, system: int | None, max_len: int, think: float, seed: int
) -> None:
    specs = _chat(
        num_sessions=sessions,
        chat_turns=turns,
        prefix_len=system,
        max_model_len=max_len,
        think_time_mean=think,
        seed=seed,
    )
    assert [r.request_id for r in specs] == list(range(len(specs)))
    assert [r.arrival_time for r in specs] == sorted(r.arrival_time for r in specs)
    by_id = {r.request_id: r for r in specs}
    firsts = set()
    for r in specs:
        assert r.token_ids is not None
        assert r.output_token_ids is not None
        assert r.prompt_len <= max_len - 1
        assert r.final_len <= max_len
        s, t = _session(r)
        if t == 0:
            assert r.parent_id is None
            assert r.think_time == 0.0
            firsts.add(r.token_ids[: system or 0])
            own = r.token_ids[system or 0 :]
        else:
            assert r.parent_id is not None
            parent = by_id[r.parent_id]
            assert parent.request_id < r.request_id
            assert _session(parent) == (s, t - 1)
            assert parent.token_ids is not None
            assert parent.output_token_ids is not None
            history = parent.token_ids + parent.output_token_ids
            assert r.token_ids[: len(history)] == history
            own = r.token_ids[len(history) :]
            assert r.think_time >= 0
            assert think > 0 or r.think_time == 0
        assert own
        assert {owner_of(i) for i in own + r.output_token_ids} == {("request", r.request_id)}
    assert len(firsts) <= 1  # every session starts with the same system prompt
    assert {_session(r)[0] for r in specs if _session(r)[1] == 0} <= set(range(sessions))


def test_sessions_end_when_the_conversation_no_longer_fits() -> None:
    long = _chat(chat_turns=8, lengths="fixed", prompt_len=30, output_len=40, max_model_len=200)
    # turn t's prompt is 30 + 70 t: turns 0, 1, 2 fit 199 tokens, the fourth (240) does not
    assert {_session(r)[1] for r in long} == {0, 1, 2}
    assert [r.prompt_len for r in long[:3]] == [30, 100, 170]
    assert long[2].output_len == 30  # cut to max_model_len - prompt


def test_sessions_start_by_the_arrival_process() -> None:
    specs = _chat(arrival="poisson", request_rate=1.0, num_sessions=10)
    starts = [r.arrival_time for r in specs if _session(r)[1] == 0]
    assert starts[0] == 0.0
    assert starts == sorted(starts)
    assert starts[-1] > 0


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_trace_round_trip_keeps_session_columns(tmp_path: Path, suffix: str) -> None:
    specs = _chat()
    back = read_trace(write_trace(tmp_path / f"t{suffix}", specs))
    assert [(r.prompt_len, r.output_len, r.extra) for r in back] == [
        (r.prompt_len, r.output_len, r.extra) for r in specs
    ]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_sessions": 0}, "num_sessions"),
        ({"chat_turns": 0}, "chat_turns"),
        ({"think_time_mean": -1.0}, "think_time_mean"),
        ({"think_time_mean": float("nan")}, "think_time_mean"),
        ({"num_requests": 10}, "num_requests"),
        ({"num_prefixes": 2}, "num_prefixes"),
        ({"share_ratio": 0.5}, "share_ratio"),
        ({"lengths": "uniform"}, "min_prompt_len"),
        ({"prefix_len": 2047}, "prefix_len"),
    ],
)
def test_bad_config_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as e:
        WorkloadConfig(kind=WorkloadKind.CHAT, **kwargs)
    assert e.value.field == field


def test_chat_fields_only_for_chat() -> None:
    with pytest.raises(ConfigError) as e:
        WorkloadConfig(kind=WorkloadKind.ALPACA_LIKE, chat_turns=3)
    assert e.value.field == "chat_turns"


def _run(caching: bool) -> dict[str, Any]:
    flat = {
        "workload": "chat",
        "num_sessions": 8,
        "chat_turns": 3,
        "think_time_mean": 2.0,
        "request_rate": 1.0,
        "enable_prefix_caching": caching,
        "num_gpu_blocks": 2000,
    }
    summary: dict[str, Any] = simulate(SimulationConfig.from_flat(flat)).summary
    return summary


def test_later_turns_hit_the_conversation_in_the_cache() -> None:
    on, off = _run(True), _run(False)
    assert on["finished"] == off["finished"] == 24
    assert off["prefix_cache"]["hit_tokens"] == 0
    specs = _chat(
        num_sessions=8, chat_turns=3, think_time_mean=2.0, arrival="poisson", request_rate=1.0
    )
    # at most each later turn's whole-block part of its parent's conversation can hit
    bound = sum(
        min(r.prompt_len - 1, specs[r.parent_id].final_len) // 16 * 16
        for r in specs
        if r.parent_id is not None
    )
    assert 0 < on["prefix_cache"]["hit_tokens"] <= bound


@settings(max_examples=25, deadline=None)
@given(
    sessions=st.integers(1, 5),
    turns=st.integers(1, 6),
    system=st.sampled_from([None, 1, 30]),
    max_len=st.sampled_from([64, 300, 2048]),
    seed=st.integers(0, 50),
)
def test_the_footprint_estimate_counts_every_id_a_chat_holds(
    sessions: int, turns: int, system: int | None, max_len: int, seed: int
) -> None:
    config = WorkloadConfig(
        kind=WorkloadKind.CHAT,
        num_sessions=sessions,
        chat_turns=turns,
        prefix_len=system,
        max_model_len=max_len,
        seed=seed,
    )
    specs = make_workload(config)
    messages, outputs = suffix_model(config).sample(sessions * turns, seed)
    new, repeated = chat_id_counts(sessions, turns, system or 0, messages, outputs, max_len)
    entries = sum(len(r.token_ids or ()) + len(r.output_token_ids or ()) for r in specs)
    assert new + repeated == entries + (system or 0)  # the system prompt's ids made once


def test_a_chat_over_the_footprint_cap_is_refused_before_it_holds_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = WorkloadConfig(kind=WorkloadKind.CHAT, num_sessions=200, chat_turns=8)
    monkeypatch.setattr("pagedkv.footprint.MEMORY_CAP_BYTES", 1 << 20)
    with pytest.raises(ConfigError) as err:
        make_workload(config)
    assert err.value.field == "num_sessions"
    assert "token ids" in str(err.value)

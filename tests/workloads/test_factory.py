"""make_workload and WorkloadConfig: dispatch, re-timing, caps, order, and config errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.errors import ConfigError
from pagedkv.validation import field_help
from pagedkv.workloads import (
    LESSON,
    Arrival,
    RequestSpec,
    WorkloadConfig,
    WorkloadKind,
    lesson_workload,
    make_workload,
    write_trace,
)
from pagedkv.workloads.config import DEFAULT_NUM_REQUESTS
from pagedkv.workloads.synthetic import SHAREGPT_LIKE, cap_lengths

SYNTHETIC: list[dict[str, Any]] = [
    {"kind": "sharegpt-like"},
    {"kind": "alpaca-like"},
    {"kind": "fixed", "prompt_len": 10, "output_len": 20},
    {
        "kind": "uniform",
        "min_prompt_len": 1,
        "max_prompt_len": 300,
        "min_output_len": 5,
        "max_output_len": 900,
    },
]
TIMED: list[dict[str, Any]] = [
    {"arrival": "poisson", "request_rate": 4.0},
    {"arrival": "gamma", "request_rate": 4.0, "burstiness": 0.1},
]


def _lengths(requests: list[RequestSpec]) -> list[tuple[int, int]]:
    return [(r.prompt_len, r.output_len) for r in requests]


def _check_order(requests: list[RequestSpec]) -> None:
    assert [r.request_id for r in requests] == list(range(len(requests)))
    times = [r.arrival_time for r in requests]
    assert times == sorted(times)


def test_default_is_the_lesson() -> None:
    config = WorkloadConfig()
    assert config.kind is WorkloadKind.LESSON
    assert make_workload(config) == lesson_workload()
    assert len(make_workload(config)) == LESSON.num_requests


def test_lesson_with_poisson_arrivals_keeps_its_lengths() -> None:
    timed = make_workload(
        WorkloadConfig(num_requests=30, arrival=Arrival.POISSON, request_rate=1.0)
    )
    assert _lengths(timed) == _lengths(lesson_workload(30))
    assert timed[0].arrival_time == 0.0
    assert timed[-1].arrival_time > 0.0
    _check_order(timed)


@pytest.mark.parametrize("kwargs", SYNTHETIC)
def test_synthetic_default_size_and_order(kwargs: dict[str, Any]) -> None:
    requests = make_workload(WorkloadConfig(**kwargs))
    assert len(requests) == DEFAULT_NUM_REQUESTS
    assert all(r.arrival_time == 0.0 for r in requests)
    _check_order(requests)


@pytest.mark.parametrize("kwargs", SYNTHETIC)
def test_same_config_same_requests_other_seed_other_requests(kwargs: dict[str, Any]) -> None:
    config = WorkloadConfig(num_requests=200, seed=1, **kwargs, **TIMED[0])
    assert make_workload(config) == make_workload(config)
    other = make_workload(dataclasses.replace(config, seed=2))
    if kwargs["kind"] == "fixed":  # no random lengths: only the times change
        assert _lengths(other) == _lengths(make_workload(config))
    assert other != make_workload(config)


@pytest.mark.parametrize("kwargs", SYNTHETIC)
def test_lengths_do_not_depend_on_the_arrival_process(kwargs: dict[str, Any]) -> None:
    at_once = make_workload(WorkloadConfig(num_requests=300, seed=3, **kwargs))
    for timing in TIMED:
        timed = make_workload(WorkloadConfig(num_requests=300, seed=3, **kwargs, **timing))
        assert _lengths(timed) == _lengths(at_once)
        assert [r.arrival_time for r in timed] != [r.arrival_time for r in at_once]


def test_first_k_requests_are_the_workload_of_k() -> None:
    def make(n: int) -> list[RequestSpec]:
        return make_workload(
            WorkloadConfig(kind=WorkloadKind.SHAREGPT_LIKE, num_requests=n, **TIMED[1])
        )

    assert make(500)[:200] == make(200)


def test_sharegpt_like_lengths_are_the_capped_model() -> None:
    # The factory's lengths are the model's draws, cut by cap_lengths, in request order.
    requests = make_workload(
        WorkloadConfig(kind=WorkloadKind.SHAREGPT_LIKE, num_requests=2000, seed=4)
    )
    prompts, outputs = cap_lengths(*SHAREGPT_LIKE.sample(2000, 4), 2048)
    assert _lengths(requests) == list(zip(prompts, outputs, strict=True))


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(["sharegpt-like", "alpaca-like", "uniform", "lesson"]),
    st.integers(2, 3000),
    st.integers(0, 2**32),
)
def test_caps_hold(kind: str, max_model_len: int, seed: int) -> None:
    kwargs: dict[str, Any] = {"kind": kind, "max_model_len": max_model_len, "seed": seed}
    if kind == "uniform":
        kwargs |= {"min_prompt_len": 1, "max_prompt_len": 4000}
        kwargs |= {"min_output_len": 1, "max_output_len": 4000}
    if kind != "lesson":
        kwargs["num_requests"] = 200
    requests = make_workload(WorkloadConfig(**kwargs))
    assert all(r.final_len <= max_model_len for r in requests)
    assert all(r.prompt_len >= 1 and r.output_len >= 1 for r in requests)


def _trace(tmp_path: Path, suffix: str = ".csv") -> Path:
    path = tmp_path / f"t{suffix}"
    write_trace(
        path,
        [
            RequestSpec(10, 100, 3000, 0.5, (("user", "a"),)),
            RequestSpec(11, 4, 5, 0.5, (("user", "b"),)),
            RequestSpec(12, 6, 7, 2.0),
        ],
    )
    return path


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_trace_keeps_its_times_caps_and_renumbers(tmp_path: Path, suffix: str) -> None:
    requests = make_workload(
        WorkloadConfig(kind=WorkloadKind.TRACE, trace_path=str(_trace(tmp_path, suffix)))
    )
    assert requests == [
        RequestSpec(0, 100, 2048 - 100, 0.5, (("user", "a"),)),  # output cut to fit 2048
        RequestSpec(1, 4, 5, 0.5, (("user", "b"),)),
        RequestSpec(2, 6, 7, 2.0),
    ]


def test_trace_first_n_and_retimed(tmp_path: Path) -> None:
    path = str(_trace(tmp_path))
    first = make_workload(WorkloadConfig(kind=WorkloadKind.TRACE, trace_path=path, num_requests=2))
    assert _lengths(first) == [(100, 1948), (4, 5)]
    with pytest.raises(ConfigError) as info:
        make_workload(WorkloadConfig(kind=WorkloadKind.TRACE, trace_path=path, num_requests=4))
    assert info.value.field == "num_requests"
    retimed = make_workload(
        WorkloadConfig(
            kind=WorkloadKind.TRACE, trace_path=path, arrival=Arrival.POISSON, request_rate=1.0
        )
    )
    assert _lengths(retimed) == _lengths(
        make_workload(WorkloadConfig(kind=WorkloadKind.TRACE, trace_path=path))
    )
    assert retimed[0].arrival_time == 0.0
    assert retimed[1].arrival_time > 0.0  # the file had 0.5 and 0.5: the process's times now
    at_once = make_workload(
        WorkloadConfig(kind=WorkloadKind.TRACE, trace_path=path, arrival=Arrival.ALL_AT_ONCE)
    )
    assert all(r.arrival_time == 0.0 for r in at_once)


def test_sharegpt_file_as_trace(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    turns = [{"from": "human", "value": "abcd" * 3}, {"from": "gpt", "value": "xy"}]
    path.write_text(json.dumps([{"id": "z", "conversations": turns}] * 3))
    requests = make_workload(
        WorkloadConfig(
            kind=WorkloadKind.TRACE, trace_path=str(path), arrival=Arrival.GAMMA, request_rate=2.0
        )
    )
    assert _lengths(requests) == [(3, 1)] * 3  # ceil(12 / 4), ceil(2 / 4)
    _check_order(requests)


def test_strings_become_enums_and_paths_strings(tmp_path: Path) -> None:
    config = WorkloadConfig(
        kind="trace",  # type: ignore[arg-type]
        trace_path=tmp_path / "t.csv",  # type: ignore[arg-type]
        arrival="gamma",  # type: ignore[arg-type]
        request_rate=1.0,
    )
    assert config.kind is WorkloadKind.TRACE
    assert config.arrival is Arrival.GAMMA
    assert config.trace_path == str(tmp_path / "t.csv")


def test_every_field_has_help() -> None:
    for f in dataclasses.fields(WorkloadConfig):
        assert field_help(WorkloadConfig, f.name)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"kind": "vicuna"}, "kind"),
        ({"kind": "sharegpt"}, "trace_path"),  # vLLM's --dataset-name sharegpt needs its file
        ({"arrival": "bursty"}, "arrival"),
        ({"seed": -1}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"num_requests": 0}, "num_requests"),
        ({"num_requests": 51}, "num_requests"),  # the lesson has at most 50
        ({"max_model_len": 1}, "max_model_len"),
        ({"arrival": "poisson"}, "request_rate"),
        ({"arrival": "gamma"}, "request_rate"),
        ({"arrival": "poisson", "request_rate": 0}, "request_rate"),
        ({"arrival": "poisson", "request_rate": float("nan")}, "request_rate"),
        ({"request_rate": 2.0}, "request_rate"),
        ({"arrival": "all-at-once", "request_rate": 2.0}, "request_rate"),
        ({"arrival": "gamma", "request_rate": 1.0, "burstiness": 0}, "burstiness"),
        ({"arrival": "poisson", "request_rate": 1.0, "burstiness": 2.0}, "burstiness"),
        ({"kind": "fixed", "prompt_len": 10}, "output_len"),
        ({"kind": "fixed", "output_len": 10}, "prompt_len"),
        ({"kind": "fixed", "prompt_len": 0, "output_len": 1}, "prompt_len"),
        ({"kind": "fixed", "prompt_len": 2000, "output_len": 100}, "output_len"),
        ({"prompt_len": 10}, "prompt_len"),
        ({"kind": "sharegpt-like", "max_output_len": 10}, "max_output_len"),
        ({"kind": "uniform", "min_prompt_len": 1, "max_prompt_len": 5}, "min_output_len"),
        (
            {
                "kind": "uniform",
                "min_prompt_len": 6,
                "max_prompt_len": 5,
                "min_output_len": 1,
                "max_output_len": 1,
            },
            "max_prompt_len",
        ),
        (
            {
                "kind": "uniform",
                "min_prompt_len": 1500,
                "max_prompt_len": 1600,
                "min_output_len": 600,
                "max_output_len": 700,
            },
            "min_output_len",
        ),
        ({"kind": "trace"}, "trace_path"),
        ({"kind": "trace", "trace_path": "t.txt"}, "trace_path"),
        ({"kind": "trace", "trace_path": 3}, "trace_path"),
        ({"trace_path": "t.csv"}, "trace_path"),
    ],
)
def test_config_errors_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        WorkloadConfig(**kwargs)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: got ")


@pytest.mark.parametrize(
    "flat",
    [
        {"workload": "sharegpt-like", "num_requests": 40, "request_rate": 2.0},
        {"workload": "alpaca-like", "num_requests": 30},
        {"workload": "fixed", "prompt_len": 9, "output_len": 4, "num_requests": 12},
        {"workload": "trace", "trace_path": "TRACE", "arrival": "poisson", "request_rate": 3.0},
    ],
)
def test_a_request_is_made_once_and_checked_once(
    flat: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The columns are checked in bulk (a trace's lines when read), so the specs that
    make_workload returns are never checked one by one again; each would pass the checks."""
    from pagedkv.simulation import SimulationConfig
    from pagedkv.workloads.spec import RequestSpec

    if flat.get("trace_path") == "TRACE":
        trace = tmp_path / "t.csv"
        trace.write_text("arrival_time,prompt_len,output_len,tag\n0,5,3,a\n1.5,7,2,b\n")
        flat = {**flat, "trace_path": str(trace)}
    config = SimulationConfig.from_flat(flat).workload
    checks = 0
    check = RequestSpec.__post_init__

    def counted(self: RequestSpec) -> None:
        nonlocal checks
        checks += 1
        check(self)

    monkeypatch.setattr(RequestSpec, "__post_init__", counted)
    requests = make_workload(config)
    read = 2 if "trace_path" in flat else 0  # each line checked as read_trace makes its spec
    assert checks == read
    assert len(requests) == flat.get("num_requests", 2)
    monkeypatch.undo()
    again = [
        RequestSpec(**{f.name: getattr(r, f.name) for f in dataclasses.fields(r)}) for r in requests
    ]
    assert again == requests


_KINDS: dict[str, dict[str, Any]] = {
    "sharegpt-like": {},
    "shared-prefix": {"prefix_len": 30, "num_prefixes": 3, "share_ratio": 0.5},
    "translation": {},
    "random": {"random_input_len": 60, "random_output_len": 20, "random_prefix_len": 10},
    "chat": {"num_sessions": 6, "chat_turns": 3},
}


@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(sorted(_KINDS)),
    max_model_len=st.integers(90, 400),
    arrival=st.sampled_from([None, "poisson"]),
    seed=st.integers(0, 50),
)
def test_each_spec_is_the_one_the_checks_make(
    kind: str, max_model_len: int, arrival: str | None, seed: int
) -> None:
    """A workload may make its specs without checking each again (lengths checked in bulk,
    ids made to the lengths): every spec is the one RequestSpec's own checks pass and make,
    field types included."""
    fields: dict[str, Any] = {"kind": kind, "max_model_len": max_model_len, "seed": seed}
    fields |= _KINDS[kind] | ({} if kind == "chat" else {"num_requests": 25})
    if arrival is not None:
        fields |= {"arrival": arrival, "request_rate": 3.0}
    for spec in make_workload(WorkloadConfig(**fields)):
        values = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
        checked = RequestSpec(**values)
        assert checked == spec
        assert [type(v) for v in values.values()] == [
            type(getattr(checked, name)) for name in values
        ]

"""Shared-prefix and translation workloads: determinism, ids that share exactly the prefix,
the share ratio, and prefix caching finding exactly what is shared."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.errors import ConfigError
from pagedkv.footprint import BYTES_PER_TOKEN_ID
from pagedkv.memory.prefix_hash import hash_blocks
from pagedkv.simulation import SimulationConfig, simulate
from pagedkv.workloads import (
    RequestSpec,
    WorkloadConfig,
    WorkloadKind,
    make_workload,
    read_trace,
    write_trace,
)
from pagedkv.workloads.shared_prefix import PRIVATE, zipf_probabilities
from pagedkv.workloads.token_ids import MAX_PREFIX_ID, owner_of


def _workload(**kw: Any) -> list[RequestSpec]:
    base: dict[str, Any] = {"kind": "shared-prefix", "prefix_len": 40, "num_requests": 30}
    return make_workload(WorkloadConfig(**{**base, **kw}))


def _prefix(r: RequestSpec) -> str:
    return dict(r.extra)["prefix_id"]


def test_same_seed_same_requests_other_seed_other_structure() -> None:
    kw = {"num_prefixes": 3, "share_ratio": 0.5, "seed": 7}
    assert _workload(**kw) == _workload(**kw)
    assert _workload(**kw) != _workload(**{**kw, "seed": 8})


@settings(max_examples=30, deadline=None)
@given(
    k=st.integers(1, 4),
    ratio=st.sampled_from([0.0, 0.3, 0.5, 1.0]),
    zipf=st.sampled_from([0.0, 1.0, 2.5]),
    prefix_len=st.integers(1, 50),
    seed=st.integers(0, 50),
)
def test_ids_share_exactly_the_prefix(
    k: int, ratio: float, zipf: float, prefix_len: int, seed: int
) -> None:
    specs = _workload(
        num_prefixes=k, share_ratio=ratio, prefix_zipf=zipf, prefix_len=prefix_len, seed=seed
    )
    assert sum(_prefix(r) != PRIVATE for r in specs) == math.floor(ratio * len(specs) + 0.5)
    for r in specs:
        assert r.token_ids is not None
        assert r.output_token_ids is not None
        assert len(r.token_ids) == r.prompt_len > prefix_len
        label = _prefix(r)
        own_from = 0 if label == PRIVATE else prefix_len
        if label != PRIVATE:
            assert {owner_of(t) for t in r.token_ids[:own_from]} == {("prefix", int(label))}
        assert {owner_of(t) for t in r.token_ids[own_from:] + r.output_token_ids} == {
            ("request", r.request_id)
        }
        assert len(set(r.token_ids + r.output_token_ids)) == r.final_len  # no id repeats


@settings(max_examples=20, deadline=None)
@given(block_size=st.sampled_from([1, 3, 16]), seed=st.integers(0, 20))
def test_different_prefixes_and_requests_never_share_a_block_key(
    block_size: int, seed: int
) -> None:
    """Block keys (the prefix cache's) of two requests are equal only within their common
    shared prefix: never across prefixes, never in a request's own tokens."""
    specs = _workload(num_prefixes=3, share_ratio=0.6, prefix_len=20, seed=seed)
    owner: dict[bytes, tuple[str, int]] = {}
    for r in specs:
        assert r.token_ids is not None
        assert r.output_token_ids is not None
        ids = r.token_ids + r.output_token_ids
        shared = 0 if _prefix(r) == PRIVATE else 20
        for j, key in enumerate(hash_blocks(ids, block_size)):
            whose = ("prefix", int(_prefix(r))) if (j + 1) * block_size <= shared else None
            whose = whose or ("request", r.request_id)
            assert owner.setdefault(key, whose) == whose


def test_prompt_lengths_do_not_depend_on_the_share_ratio() -> None:
    lengths = {
        ratio: [(r.prompt_len, r.output_len) for r in _workload(share_ratio=ratio, seed=3)]
        for ratio in (0.0, 0.4, 1.0)
    }
    assert lengths[0.0] == lengths[0.4] == lengths[1.0]


def test_sharers_at_a_lower_ratio_share_at_a_higher_one() -> None:
    low = {r.request_id for r in _workload(share_ratio=0.3) if _prefix(r) != PRIVATE}
    high = {r.request_id for r in _workload(share_ratio=0.7) if _prefix(r) != PRIVATE}
    assert low < high


def test_suffixes_are_the_plain_kinds_prompts() -> None:
    """With lengths 'alpaca-like' the text after the prefix is the 'alpaca-like' prompt."""
    plain = make_workload(WorkloadConfig(kind=WorkloadKind.ALPACA_LIKE, num_requests=50, seed=2))
    shared = _workload(lengths="alpaca-like", num_requests=50, seed=2)
    assert [r.prompt_len - 40 for r in shared] == [r.prompt_len for r in plain]
    assert [r.output_len for r in shared] == [r.output_len for r in plain]


def test_zipf_probabilities() -> None:
    assert zipf_probabilities(4, 0.0) == [0.25] * 4
    p = zipf_probabilities(5, 1.2)
    assert math.isclose(sum(p), 1.0)
    assert p == sorted(p, reverse=True)
    assert math.isclose(p[0] / p[1], 2**1.2)


def test_popular_prefix_is_drawn_most() -> None:
    specs = _workload(num_prefixes=4, prefix_zipf=2.0, num_requests=400)
    counts = [sum(_prefix(r) == str(k) for r in specs) for k in range(4)]
    assert counts == sorted(counts, reverse=True)
    assert counts[0] > 200


def test_lengths_are_capped_around_the_prefix() -> None:
    specs = _workload(
        prefix_len=100, max_model_len=128, lengths="fixed", prompt_len=60, output_len=9
    )
    for r in specs:
        assert r.prompt_len == 127
        assert r.output_len == 1
    specs = _workload(
        prefix_len=100,
        lengths="uniform",
        min_prompt_len=1,
        max_prompt_len=5,
        min_output_len=2,
        max_output_len=3,
    )
    assert all(101 <= r.prompt_len <= 105 and 2 <= r.output_len <= 3 for r in specs)


def test_translation_prefixes_are_the_papers() -> None:
    for shots, length in ((1, 80), (5, 341)):
        specs = make_workload(
            WorkloadConfig(kind=WorkloadKind.TRANSLATION, shots=shots, num_requests=20)
        )
        assert {dict(r.extra)["prefix_len"] for r in specs} == {str(length)}
        assert {r.token_ids[:length] for r in specs if r.token_ids} == {tuple(range(length))}


def test_timed_arrivals_are_sorted_and_lengths_unchanged() -> None:
    timed = _workload(arrival="poisson", request_rate=2.0)
    assert [r.arrival_time for r in timed] == sorted(r.arrival_time for r in timed)
    assert timed[-1].arrival_time > 0
    untimed = _workload()
    assert [dataclasses.replace(r, arrival_time=0.0) for r in timed] == untimed


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_trace_round_trip_keeps_prefix_columns(tmp_path: Path, suffix: str) -> None:
    specs = _workload(num_prefixes=2, share_ratio=0.5)
    path = write_trace(tmp_path / f"t{suffix}", specs)
    back = read_trace(path)
    assert back == [dataclasses.replace(r, token_ids=None, output_token_ids=None) for r in specs]
    # the trace kind rebuilds the ids from prefix_id and prefix_len: the same requests
    assert make_workload(WorkloadConfig(kind=WorkloadKind.TRACE, trace_path=str(path))) == specs


def test_trace_prefix_ids_from_columns(tmp_path: Path) -> None:
    rows = [
        RequestSpec(0, 10, 2, 0.0, (("prefix_id", "3"), ("prefix_len", "4"))),
        RequestSpec(1, 3, 2, 0.0, (("prefix_id", "3"), ("prefix_len", "4"))),  # cut to 2
        RequestSpec(2, 5, 1, 0.0, (("prefix_id", "private"),)),
        RequestSpec(3, 5, 1, 0.0),
    ]
    path = write_trace(tmp_path / "t.csv", rows)
    got = make_workload(WorkloadConfig(kind=WorkloadKind.TRACE, trace_path=str(path)))
    owners = [[owner_of(t) for t in r.token_ids or ()] for r in got]
    assert owners[0] == [("prefix", 3)] * 4 + [("request", 0)] * 6
    assert owners[1] == [("prefix", 3)] * 2 + [("request", 1)]
    assert owners[2] == [("request", 2)] * 5
    assert owners[3] == [("request", 3)] * 5
    assert got[1].token_ids is not None
    assert got[0].token_ids is not None
    assert got[1].token_ids[:2] == got[0].token_ids[:2]
    bad = write_trace(tmp_path / "bad.csv", [RequestSpec(0, 5, 1, 0.0, (("prefix_id", "x"),))])
    with pytest.raises(ConfigError) as e:
        make_workload(WorkloadConfig(kind=WorkloadKind.TRACE, trace_path=str(bad)))
    assert e.value.field == "request 0: prefix_id"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"kind": "shared-prefix"}, "prefix_len"),
        ({"kind": "shared-prefix", "prefix_len": 0}, "prefix_len"),
        ({"kind": "shared-prefix", "prefix_len": 2047}, "prefix_len"),
        ({"kind": "shared-prefix", "prefix_len": 8, "num_prefixes": 0}, "num_prefixes"),
        ({"kind": "shared-prefix", "prefix_len": 8, "share_ratio": 1.5}, "share_ratio"),
        ({"kind": "shared-prefix", "prefix_len": 8, "share_ratio": -0.1}, "share_ratio"),
        ({"kind": "shared-prefix", "prefix_len": 8, "prefix_zipf": -1}, "prefix_zipf"),
        ({"kind": "shared-prefix", "prefix_len": 8, "prefix_zipf": math.inf}, "prefix_zipf"),
        ({"kind": "shared-prefix", "prefix_len": 8, "lengths": "lesson"}, "lengths"),
        ({"kind": "shared-prefix", "prefix_len": 8, "lengths": "fixed"}, "prompt_len"),
        ({"kind": "shared-prefix", "prefix_len": 8, "shots": 1}, "shots"),
        ({"kind": "translation", "shots": 3}, "shots"),
        ({"kind": "translation", "max_model_len": 300, "shots": 5}, "max_model_len"),
        ({"kind": "translation", "num_prefixes": 2}, "num_prefixes"),
        ({"kind": "sharegpt-like", "prefix_len": 8}, "prefix_len"),
        ({"kind": "sharegpt-like", "share_ratio": 0.5}, "share_ratio"),
        ({"kind": "fixed", "prompt_len": 1, "output_len": 1, "lengths": "fixed"}, "lengths"),
    ],
)
def test_bad_config_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as e:
        WorkloadConfig(**kwargs)
    assert e.value.field == field


def _run(ratio: float, caching: bool, **extra: Any) -> dict[str, Any]:
    flat = {
        "workload": "shared-prefix",
        "prefix_len": 64,
        "num_prefixes": 3,
        "num_requests": 40,
        "share_ratio": ratio,
        "lengths": "alpaca-like",
        "request_rate": 0.5,
        "enable_prefix_caching": caching,
        "num_gpu_blocks": 2000,  # never full: no preemption, no eviction
        **extra,
    }
    summary: dict[str, Any] = simulate(SimulationConfig.from_flat(flat)).summary
    assert summary["preemptions"] == 0
    assert summary["prefix_cache"]["evictions"] == 0
    return summary


def test_prefix_cache_hits_exactly_the_shared_prefixes() -> None:
    """No sharing, no hit (nothing private or of another prefix ever hits); full sharing, each
    request but the first of its prefix hits the prefix's 4 full blocks, and nothing else."""
    assert _run(0.0, True)["prefix_cache"]["hit_tokens"] == 0
    specs = _workload(
        prefix_len=64,
        num_prefixes=3,
        num_requests=40,
        lengths="alpaca-like",
        share_ratio=1.0,
        arrival="poisson",
        request_rate=0.5,
    )
    firsts = len({_prefix(r) for r in specs})
    assert _run(1.0, True)["prefix_cache"]["hit_tokens"] == (40 - firsts) * 64
    assert _run(1.0, False)["prefix_cache"]["hit_tokens"] == 0


def test_num_samples_asks_every_request_for_n_samples() -> None:
    from pagedkv.workloads.config import WorkloadConfig, WorkloadKind
    from pagedkv.workloads.factory import make_workload

    base = make_workload(WorkloadConfig(kind=WorkloadKind.ALPACA_LIKE, num_requests=30, seed=3))
    four = make_workload(
        WorkloadConfig(kind=WorkloadKind.ALPACA_LIKE, num_requests=30, seed=3, num_samples=4)
    )
    assert [(r.prompt_len, r.output_len, r.arrival_time) for r in base] == [
        (r.prompt_len, r.output_len, r.arrival_time) for r in four
    ]
    assert {r.n for r in base} == {1}
    assert {r.n for r in four} == {4}
    with pytest.raises(ConfigError) as info:
        WorkloadConfig(kind=WorkloadKind.ALPACA_LIKE, num_samples=0)
    assert info.value.field == "num_samples"


def test_a_workload_over_the_footprint_cap_is_refused_before_it_holds_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kw: dict[str, Any] = {"prefix_len": 100, "num_requests": 500, "lengths": "fixed"}
    kw |= {"prompt_len": 100, "output_len": 50}
    specs = _workload(**kw)
    ids = sum(len(r.token_ids or ()) + len(r.output_token_ids or ()) for r in specs)
    monkeypatch.setattr("pagedkv.footprint.MEMORY_CAP_BYTES", ids * BYTES_PER_TOKEN_ID - 1)
    with pytest.raises(ConfigError) as err:
        _workload(**kw)  # one byte short of what its ids take
    assert err.value.field == "num_requests"
    monkeypatch.setattr("pagedkv.footprint.MEMORY_CAP_BYTES", ids * BYTES_PER_TOKEN_ID)
    assert _workload(**kw) == specs


@pytest.mark.parametrize("label", [str(MAX_PREFIX_ID + 1), str(10**20), "9" * 5000])
def test_a_trace_prefix_id_beyond_int64_ids_is_refused(tmp_path: Path, label: str) -> None:
    extra = (("prefix_id", label), ("prefix_len", "4"))
    path = write_trace(tmp_path / "t.csv", [RequestSpec(0, 10, 2, 0.0, extra)])
    with pytest.raises(ConfigError) as e:
        make_workload(WorkloadConfig(kind=WorkloadKind.TRACE, trace_path=str(path)))
    assert e.value.field == "request 0: prefix_id"
    assert str(MAX_PREFIX_ID) in str(e.value)


def test_the_largest_prefix_id_gives_int64_ids_that_hash(tmp_path: Path) -> None:
    extra = (("prefix_id", str(MAX_PREFIX_ID)), ("prefix_len", "4"))
    path = write_trace(tmp_path / "t.csv", [RequestSpec(0, 10, 2, 0.0, extra)])
    (r,) = make_workload(WorkloadConfig(kind=WorkloadKind.TRACE, trace_path=str(path)))
    assert r.token_ids is not None
    assert max(r.token_ids) < 2**63
    assert owner_of(r.token_ids[0]) == ("prefix", MAX_PREFIX_ID)
    assert len(hash_blocks(r.token_ids, 2)) == 5

"""Closed-loop follow-ups (chat turns) and prefix caching driven by known token ids.

A follow-up arrives think_time after its parent finishes; with prefix caching and the ids a
simulated model will generate, the next turn hits the blocks of the previous turn's prompt
and output. The fast-forward must still equal stepping every round.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from pagedkv.engine.engine import Engine
from pagedkv.engine.request import Request, RequestStatus
from pagedkv.errors import ConfigError
from pagedkv.memory.manager import KVCacheManager
from pagedkv.memory.token_runs import TokenRuns
from pagedkv.workloads.spec import RequestSpec
from tests.engine.test_fast_forward import ROOFLINE, both_equal
from tests.factories import BLOCK_SIZES, make_engine


def ids(start: int, n: int) -> tuple[int, ...]:
    return tuple(range(start, start + n))


def conversation(turns: int, think: float, *, first_id: int = 0) -> list[RequestSpec]:
    """``turns`` chat turns: each prompt is the whole conversation so far plus 8 new ids."""
    out: list[RequestSpec] = []
    history: tuple[int, ...] = ()
    for t in range(turns):
        rid = first_id + t
        prompt = history + ids(1_000_000 * (rid + 1), 8)
        output = ids(1_000_000 * (rid + 1) + 500_000, 12)
        parent = None if t == 0 else rid - 1
        out.append(
            RequestSpec(
                rid,
                len(prompt),
                12,
                0.0,
                token_ids=prompt,
                output_token_ids=output,
                parent_id=parent,
                think_time=think,
            )
        )
        history = prompt + output
    return out


def by_id(engine: Engine) -> dict[int, Request]:
    return {r.request_id: r for r in engine.requests}


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_follow_up_arrives_think_time_after_its_parent_finishes(block_size: int) -> None:
    engine = make_engine("vllm", conversation(4, 2.5), block_size=block_size, num_gpu_blocks=400)
    engine.run()
    reqs = by_id(engine)
    for rid in range(1, 4):
        parent, child = reqs[rid - 1], reqs[rid]
        assert parent.finish_time is not None
        assert child.arrival_time == pytest.approx(parent.finish_time + 2.5)
        assert child.admitted_time is not None
        assert child.admitted_time >= child.arrival_time
        assert child.status is RequestStatus.FINISHED


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_next_turn_hits_the_previous_prompt_and_output(block_size: int) -> None:
    """Turn t's prompt holds turn t-1's prompt and output (their K/V computed already): every
    full block of it, bar the last prompt token, is a hit when the cache kept it."""
    specs = conversation(3, 1.0)
    engine = make_engine(
        "vllm", specs, block_size=block_size, num_gpu_blocks=400, prefix_caching=True
    )
    engine.run()
    kv = engine.scheduler.kv
    assert isinstance(kv, KVCacheManager)
    # The K/V of turn t-1's last output token is never computed (it is sampled, not fed
    # back), so the reusable history is its prompt + output - 1 tokens, in whole blocks.
    expected = sum(
        min(s.prompt_len - 1, specs[i - 1].final_len - 1) // block_size * block_size
        for i, s in enumerate(specs)
        if i
    )
    assert kv.stats.prefix_hit_tokens == expected
    assert kv.stats.prefix_query_tokens == sum(s.prompt_len for s in specs)


def test_without_caching_or_ids_nothing_hits() -> None:
    specs = conversation(3, 1.0)
    plain = [
        RequestSpec(s.request_id, s.prompt_len, s.output_len, parent_id=s.parent_id) for s in specs
    ]
    for workload, caching in ((specs, False), (plain, True)):
        engine = make_engine("vllm", workload, num_gpu_blocks=400, prefix_caching=caching)
        engine.run()
        assert isinstance(engine.scheduler.kv, KVCacheManager)
        assert engine.scheduler.kv.stats.prefix_hit_tokens == 0


def test_a_rejected_parent_rejects_its_follow_ups() -> None:
    specs = [
        RequestSpec(0, 300, 10),  # longer than max_model_len 256: rejected at arrival
        RequestSpec(1, 10, 5, parent_id=0, think_time=1.0),
        RequestSpec(2, 10, 5, parent_id=1),
        RequestSpec(3, 10, 5, 0.5),
    ]
    engine = make_engine("vllm", specs)
    result = engine.run()
    reqs = by_id(engine)
    assert [reqs[i].status for i in range(4)] == [RequestStatus.REJECTED] * 3 + [
        RequestStatus.FINISHED
    ]
    assert reqs[2].reject_reason == "its parent request 1 was rejected"
    assert not result.deadlocked


def test_a_parent_must_come_first() -> None:
    specs = [RequestSpec(0, 10, 5, parent_id=1), RequestSpec(1, 10, 5)]
    with pytest.raises(ConfigError) as info:
        make_engine("vllm", specs)
    assert info.value.field == "parent_id"


def test_spec_checks_ids_and_think_time() -> None:
    with pytest.raises(ConfigError, match="output_token_ids"):
        RequestSpec(0, 2, 3, output_token_ids=(1, 2))
    with pytest.raises(ConfigError, match="think_time"):
        RequestSpec(1, 2, 3, parent_id=0, think_time=-1.0)
    with pytest.raises(ConfigError, match="parent_id"):
        RequestSpec(1, 2, 3, parent_id=1)


def test_token_slice_spans_prompt_and_outputs() -> None:
    r = Request.from_spec(RequestSpec(0, 3, 4, token_ids=(1, 2, 3), output_token_ids=(7, 8, 9, 6)))
    r.num_output_tokens = 2
    assert r.known_token_ids == (1, 2, 3, 7, 8)
    assert r.token_slice(2, 5) == (3, 7, 8)
    assert r.token_slice(3, 6) == (7, 8, 9)  # planned outputs run ahead of the samples
    assert Request.from_spec(RequestSpec(1, 3, 4)).known_token_ids is None
    unplanned = Request.from_spec(RequestSpec(2, 3, 4, token_ids=(1, 2, 3)))
    assert unplanned.token_slice(0, 3) == (1, 2, 3)
    unplanned.num_output_tokens = 1
    assert unplanned.known_token_ids is None  # a simulated output's id is not known


@given(
    prompt=st.lists(st.integers(1, 3), min_size=1, max_size=4),
    outputs=st.lists(st.integers(1, 3), min_size=1, max_size=4),
    sampled=st.integers(0, 12),
    data=st.data(),
)
def test_token_slices_of_runs_equal_those_of_tuples(
    prompt: list[int], outputs: list[int], sampled: int, data: st.DataObject
) -> None:
    """The same ids as runs or as tuples give the same slices: runs of runs (no Python int per
    id), tuples of tuples."""

    def runs(lengths: list[int], base: int) -> TokenRuns:
        return TokenRuns(range(base + 100 * i, base + 100 * i + n) for i, n in enumerate(lengths))

    ids, outs = runs(prompt, 0), runs(outputs, 10_000)
    as_runs = Request.from_spec(
        RequestSpec(0, len(ids), len(outs), token_ids=ids, output_token_ids=outs)
    )
    as_tuples = Request.from_spec(
        RequestSpec(0, len(ids), len(outs), token_ids=tuple(ids), output_token_ids=tuple(outs))
    )
    for r in (as_runs, as_tuples):
        r.num_output_tokens = min(sampled, len(outs))
    end = data.draw(st.integers(0, as_runs.num_tokens))
    start = data.draw(st.integers(0, end))
    got, want = as_runs.token_slice(start, end), as_tuples.token_slice(start, end)
    assert type(got) is TokenRuns
    assert type(want) is tuple
    assert tuple(got) == want == (*ids, *outs)[start:end]
    assert as_runs.known_token_ids == as_tuples.known_token_ids


@st.composite
def sharing_workloads(draw: st.DrawFn) -> list[RequestSpec]:
    """Requests over a few shared prefixes, some of them chat follow-ups."""
    n = draw(st.integers(1, 14))
    t = 0.0
    out: list[RequestSpec] = []
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.01, 0.3, 1.0]))
        prefix = ids(10_000 * draw(st.integers(0, 2)), draw(st.integers(0, 40)))
        own = ids(1_000_000 * (i + 1), draw(st.integers(1, 30)))
        parent = draw(st.one_of(st.none(), st.integers(0, i - 1))) if i else None
        if parent is not None:
            base = out[parent]
            assert base.token_ids is not None
            assert base.output_token_ids is not None
            prefix = tuple(base.token_ids) + tuple(base.output_token_ids)
        prompt = (prefix + own)[:150]
        output = draw(st.integers(1, 60))
        out.append(
            RequestSpec(
                i,
                len(prompt),
                output,
                t,
                token_ids=prompt,
                output_token_ids=ids(2_000_000 * (i + 1), output),
                parent_id=parent,
                think_time=draw(st.sampled_from([0.0, 0.2])),
                n=draw(st.sampled_from([1, 1, 2, 4])),
            )
        )
    return out


@settings(max_examples=60, deadline=None)
@given(
    workload=sharing_workloads(),
    scheduler=st.sampled_from(["vllm", "reserve", "orca-oracle", "static", "greedy-nopreempt"]),
    block_size=st.sampled_from([1, 16, 7]),
    blocks_tokens=st.integers(450, 2000),
    mode=st.sampled_from(["recompute", "swap"]),
    caching=st.booleans(),
)
def test_fast_forward_equals_reference_with_sharing(
    workload: list[RequestSpec],
    scheduler: str,
    block_size: int,
    blocks_tokens: int,
    mode: str,
    caching: bool,
) -> None:
    ref, fast = both_equal(
        workload, ROOFLINE, scheduler, block_size, blocks_tokens, mode, prefix_caching=caching
    )
    a, b = ref[4].scheduler.kv, fast[4].scheduler.kv
    if isinstance(a, KVCacheManager):
        assert isinstance(b, KVCacheManager)
        assert a.stats.prefix_hit_tokens == b.stats.prefix_hit_tokens

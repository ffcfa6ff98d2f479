"""``reserve``'s aggregate of what running requests owe equals the sum over them, at every
admission test, fast and reference, over drawn workloads (groups, beams, prefix hits, chunks)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from pagedkv.engine.policies.reserve import ReserveScheduler
from pagedkv.engine.request import Request
from pagedkv.workloads.spec import RequestSpec
from pagedkv.workloads.token_ids import own_ids, prefix_ids
from tests.factories import make_engine


@contextmanager
def checked_admissions() -> Iterator[list[int]]:
    """Every admission test compares the aggregate with the sum; yields the count of tests."""
    seen: list[int] = []
    plain = ReserveScheduler._can_admit

    def can_admit(self: ReserveScheduler, req: Request, num_tokens: int) -> bool:
        assert self.owed_blocks() == self.owed_sum()
        seen.append(1)
        return plain(self, req, num_tokens)

    mp = pytest.MonkeyPatch()
    mp.setattr(ReserveScheduler, "_can_admit", can_admit)
    try:
        yield seen
    finally:
        mp.undo()


@st.composite
def workloads(draw: st.DrawFn) -> list[RequestSpec]:
    group = draw(st.sampled_from(["none", "samples", "beams", "mixed"]))
    shared = draw(st.integers(0, 40))
    out = []
    t = 0.0
    for i in range(draw(st.integers(1, 14))):
        t += draw(st.sampled_from([0.0, 0.5, 3.0]))
        prompt = draw(st.integers(1, 60))
        output = draw(st.integers(1, 50))
        width = draw(st.integers(1, 3)) if group != "none" else 1
        beams = group == "beams" or (group == "mixed" and draw(st.booleans()))
        head = min(shared, prompt - 1) if draw(st.booleans()) else 0
        ids = prefix_ids(0, head) + own_ids(i, 0, prompt - head)
        out.append(
            RequestSpec(
                i,
                prompt,
                output,
                t,
                token_ids=ids,
                output_token_ids=own_ids(i, prompt - head, output),
                n=1 if beams else width,
                beam_width=width if beams else 1,
            )
        )
    return out


@settings(max_examples=30, deadline=None)
@given(
    workload=workloads(),
    block_size=st.sampled_from([1, 4, 16]),
    blocks=st.integers(60, 200),
    chunked=st.booleans(),
    prefix_caching=st.booleans(),
    reference=st.booleans(),
)
def test_the_aggregate_equals_the_sum_at_every_admission(
    workload: list[RequestSpec],
    block_size: int,
    blocks: int,
    chunked: bool,
    prefix_caching: bool,
    reference: bool,
) -> None:
    blocks = max(blocks, 3 * (110 // block_size + 2))  # a beam group of 3 always fits
    with checked_admissions() as seen:
        engine = make_engine(
            "reserve",
            workload,
            num_gpu_blocks=blocks,
            block_size=block_size,
            chunked=chunked,
            max_num_batched_tokens=64 if chunked else None,
            max_num_seqs=64,
            prefix_caching=prefix_caching,
            reference=reference,
        )
        result = engine.run()
    assert seen  # the test ran
    assert all(r.finish_time is not None or r.reject_reason for r in result.requests)
    sched = engine.scheduler
    assert isinstance(sched, ReserveScheduler)
    assert sched.owed_blocks() == sched.owed_sum() == 0  # nothing runs: nothing owed

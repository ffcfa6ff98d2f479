"""The lesson's admission table: facts that must follow from the workload and the memory."""

from __future__ import annotations

from itertools import accumulate

from pagedkv.experiments.lesson_capacity import lesson_capacity
from pagedkv.memory.block_table import cdiv
from pagedkv.workloads.lesson import LESSON, lesson_workload


def fcfs_fit(sizes: list[int], budget: int) -> int:
    return sum(1 for total in accumulate(sizes) if total <= budget)


def test_paged_totals_follow_from_the_workload() -> None:
    result = lesson_capacity()
    reqs = lesson_workload()
    bs = LESSON.block_size
    assert result.paged_blocks_prompts == sum(cdiv(r.prompt_len, bs) for r in reqs)
    assert result.paged_blocks_completion == sum(cdiv(r.final_len, bs) for r in reqs)
    # The lesson's point: every prompt fits, but not everyone at full length.
    assert result.paged_blocks_prompts <= LESSON.num_blocks < result.paged_blocks_completion


def test_rows() -> None:
    result = lesson_capacity()
    rows = {r.allocator: r for r in result.rows}
    reqs = lesson_workload()
    bs = LESSON.block_size
    prompt_blocks = [cdiv(r.prompt_len, bs) for r in reqs]
    final_blocks = [cdiv(r.final_len, bs) for r in reqs]
    assert rows["paged"].held_at_once == fcfs_fit(prompt_blocks, LESSON.num_blocks)
    assert rows["paged, full length"].held_at_once == fcfs_fit(final_blocks, LESSON.num_blocks)
    assert rows["contiguous slots"].held_at_once == LESSON.capacity // LESSON.max_seq_len
    assert rows["lesson's own slots"].held_at_once == LESSON.lesson_contiguous_slots
    assert not rows["lesson's own slots"].equal_memory
    for placement in ("first-fit", "buddy"):
        held = [rows[f"{placement} {p}"].held_at_once for p in ("max", "pow2", "oracle")]
        assert held == sorted(held)  # tighter reservations never hold fewer
    for row in result.rows:
        assert 0 < row.token_utilization <= 1
        assert row.allocated_slots <= row.memory_blocks * bs
        if row.equal_memory:
            assert row.held_at_once <= rows["paged"].held_at_once
    assert rows["first-fit oracle"].held_at_once == fcfs_fit(
        [r.final_len for r in reqs], LESSON.capacity
    )


def test_to_dict_is_plain_data() -> None:
    d = lesson_capacity().to_dict()
    assert d["paged_blocks_prompts"] == lesson_capacity().paged_blocks_prompts
    assert all("token_utilization" in row for row in d["rows"])

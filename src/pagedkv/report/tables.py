"""Terminal tables (rich)."""

from __future__ import annotations

from rich.table import Table

from pagedkv.experiments.lesson_capacity import LessonCapacity


def lesson_capacity_table(result: LessonCapacity) -> Table:
    s = result.system
    table = Table(
        title=(
            f"Course lesson workload: {s.num_requests} requests at t=0, block size {s.block_size},"
            f" max length {s.max_seq_len}, {s.num_blocks} blocks"
        ),
        caption="Admitted first-come-first-served until the first request that does not fit.",
    )
    for col, justify in (
        ("allocator", "left"),
        ("reserves", "left"),
        ("memory blocks", "right"),
        ("held at once", "right"),
        ("allocated blocks", "right"),
        ("token util.", "right"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for r in result.rows:
        memory = str(r.memory_blocks) + ("" if r.equal_memory else " (less)")
        table.add_row(
            r.allocator,
            r.reserves,
            memory,
            str(r.held_at_once),
            f"{r.allocated_slots / s.block_size:,.1f}",  # buddy regions: fractions of blocks
            f"{r.token_utilization:.1%}",
        )
    return table


def lesson_capacity_summary(result: LessonCapacity) -> list[str]:
    """The two paged totals, one line each."""
    n = result.system.num_blocks
    return [
        f"Paged blocks for all prompts: {result.paged_blocks_prompts} (of {n})",
        f"Paged blocks at completion (every request at final length): "
        f"{result.paged_blocks_completion} (of {n})",
    ]

"""pagedkv.lesson: the course lesson's interface and benchmark, with correct behaviour."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from pagedkv.errors import UnknownSequenceError
from pagedkv.lesson import (
    ContiguousKVCacheAllocator,
    OutOfBlocksError,
    PagedKVCacheAllocator,
    SimulationEngine,
    run_benchmark,
)

# The lesson's __main__, unchanged but for dtype (a stand-in: torch is not needed).
WORKLOAD = [{"seq_id": i, "prompt_len": 20 + i * 5, "output_len": 50 - i} for i in range(20)]
BLOCK_SIZE = 16
MAX_SEQ_LEN = 256
NUM_TOTAL_BLOCKS = 100
CONTIGUOUS_ARGS = {"num_sequences": 5, "max_seq_len": MAX_SEQ_LEN, "block_size": BLOCK_SIZE}
PAGED_ARGS = {
    "num_blocks": NUM_TOTAL_BLOCKS,
    "block_size": BLOCK_SIZE,
    "num_heads": 1,
    "head_dim": 1,
    "dtype": "torch.float32",
}
MEMORY = NUM_TOTAL_BLOCKS * BLOCK_SIZE  # token slots of the equal-memory comparison
BLOCK_SIZES = [1, 16, 7]


def paged(num_blocks: int, block_size: int) -> PagedKVCacheAllocator:
    return PagedKVCacheAllocator(num_blocks, block_size, 1, 1, object())


def equal_memory_args(block_size: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(paged, contiguous) arguments with the same MEMORY token slots (rounded down)."""
    p = {**PAGED_ARGS, "num_blocks": MEMORY // block_size, "block_size": block_size}
    c = {
        "num_sequences": MEMORY // MAX_SEQ_LEN,
        "max_seq_len": MAX_SEQ_LEN,
        "block_size": block_size,
    }
    return p, c


def test_lesson_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    contiguous = run_benchmark(ContiguousKVCacheAllocator, CONTIGUOUS_ARGS, WORKLOAD)
    pag = run_benchmark(PagedKVCacheAllocator, PAGED_ARGS, WORKLOAD)
    out = capsys.readouterr().out
    assert out.count("Total steps to complete:") == 2
    assert "Max concurrent requests served: 20" in out
    assert "Average memory utilization:" in out
    assert contiguous["completed"] == pag["completed"] == 20
    assert pag["max_concurrent"] > contiguous["max_concurrent"] == 5
    assert pag["total_steps"] < contiguous["total_steps"]
    assert pag["avg_utilization"] > contiguous["avg_utilization"]
    assert 0 < contiguous["avg_utilization"] <= pag["avg_utilization"] <= 1


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_paged_wins_at_equal_memory(block_size: int, capsys: pytest.CaptureFixture[str]) -> None:
    p_args, c_args = equal_memory_args(block_size)
    assert c_args["num_sequences"] == 6
    contiguous = run_benchmark(ContiguousKVCacheAllocator, c_args, WORKLOAD)
    pag = run_benchmark(PagedKVCacheAllocator, p_args, WORKLOAD)
    assert contiguous["completed"] == pag["completed"] == 20
    assert pag["max_concurrent"] > contiguous["max_concurrent"]
    assert pag["total_steps"] < contiguous["total_steps"]


def _blocks_held(allocator: Any, seq_id: int) -> int:
    if isinstance(allocator, PagedKVCacheAllocator):
        return len(allocator.manager.block_ids(seq_id))
    assert isinstance(allocator, ContiguousKVCacheAllocator)
    return int(allocator.blocks_per_seq)


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("kind", ["paged", "contiguous"])
def test_every_step_is_sound(kind: str, block_size: int) -> None:
    """Utilization <= 1, no token past a sequence's blocks, and the proven step bound."""
    p_args, c_args = equal_memory_args(block_size)
    allocator: Any = (
        PagedKVCacheAllocator(**p_args) if kind == "paged" else ContiguousKVCacheAllocator(**c_args)
    )
    engine = SimulationEngine(allocator, WORKLOAD)
    bound = sum(max(r["output_len"], 1) for r in WORKLOAD)
    while engine.has_pending_work():
        engine.step()
        stats = engine.get_stats()
        assert 0 <= stats["utilization"] <= 1
        assert stats["step"] == engine.step_num <= bound
        for state in engine.running_sequences.values():
            assert state.current_len <= _blocks_held(allocator, state.seq_id) * block_size
        if isinstance(allocator, PagedKVCacheAllocator):
            allocator.manager.check_integrity()
            assert stats["allocated_blocks"] == sum(
                _blocks_held(allocator, s) for s in engine.running_sequences
            )
    assert sorted(s.seq_id for s in engine.completed_sequences) == list(range(20))
    assert all(s.current_len == s.prompt_len + s.output_len for s in engine.completed_sequences)
    assert allocator.get_num_allocated_blocks() == 0


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_a_full_prompt_gets_a_block_before_its_first_token(block_size: int) -> None:
    """The lesson's engine wrote this token past the sequence's last block."""
    allocator = paged(4, block_size)
    engine = SimulationEngine(allocator, [{"seq_id": 0, "prompt_len": block_size, "output_len": 2}])
    engine.step()
    assert engine.get_stats()["allocated_blocks"] == 2
    assert engine.get_stats()["utilization"] == 1.0


def test_preemption_instead_of_stall() -> None:
    """Two sequences fill the pool and both need a block: the later one is recomputed."""
    allocator = paged(2, 2)
    requests = [{"seq_id": i, "prompt_len": 2, "output_len": 2} for i in range(2)]
    engine = SimulationEngine(allocator, requests)
    engine.step()
    assert list(engine.running_sequences) == [0]
    assert engine.pending_requests[0]["seq_id"] == 1
    assert engine.num_preemptions == 1
    while engine.has_pending_work():
        engine.step()
    done = {s.seq_id: s for s in engine.completed_sequences}
    assert set(done) == {0, 1}
    assert (done[0].num_preemptions, done[1].num_preemptions) == (0, 1)
    assert done[1].current_len == 4  # recomputed from its prompt


def test_lesson_style_allocator_without_append_token() -> None:
    """An allocator with only the lesson's methods grows by append_block_to_sequence."""

    class LessonOnly:
        def __init__(self) -> None:
            self.inner = paged(12, 4)
            self.block_size = 4

        def allocate_for_sequence(self, seq_id: int, num_prompt_tokens: int) -> None:
            self.inner.allocate_for_sequence(seq_id, num_prompt_tokens)

        def append_block_to_sequence(self, seq_id: int) -> None:
            self.inner.append_block_to_sequence(seq_id)

        def free_sequence(self, seq_id: int) -> None:
            self.inner.free_sequence(seq_id)

        def get_num_allocated_blocks(self) -> int:
            return self.inner.get_num_allocated_blocks()

    allocator = LessonOnly()
    requests = [{"seq_id": i, "prompt_len": 4 * i, "output_len": 9} for i in range(4)]
    engine = SimulationEngine(allocator, requests)
    while engine.has_pending_work():
        engine.step()
        assert engine.get_stats()["utilization"] <= 1
        for state in engine.running_sequences.values():
            blocks = len(allocator.inner.manager.block_ids(state.seq_id))
            assert state.current_len <= blocks * 4
    assert len(engine.completed_sequences) == 4


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_append_block_is_one_block_then_tokens_use_it(block_size: int) -> None:
    allocator = paged(4, block_size)
    allocator.allocate_for_sequence(7, block_size + 1)
    allocator.append_block_to_sequence(7)  # the rest of block 2, then block 3
    assert allocator.get_num_allocated_blocks() == 3
    for _ in range(2 * block_size - 1):
        allocator.append_token(7)
    assert allocator.get_num_allocated_blocks() == 3
    allocator.append_token(7)
    assert allocator.get_num_allocated_blocks() == 4
    allocator.free_sequence(7)
    assert allocator.get_num_allocated_blocks() == 0


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_paged_out_of_blocks_raises_runtime_error(block_size: int) -> None:
    allocator = paged(4, block_size)
    allocator.allocate_for_sequence(0, 3 * block_size)
    with pytest.raises(RuntimeError, match="2 blocks needed, 1 free"):
        allocator.allocate_for_sequence(1, 2 * block_size)
    assert allocator.get_num_allocated_blocks() == 3  # nothing changed
    allocator.append_block_to_sequence(0)
    with pytest.raises(OutOfBlocksError):
        allocator.append_block_to_sequence(0)
    for _ in range(block_size):
        allocator.append_token(0)
    with pytest.raises(RuntimeError):
        allocator.append_token(0)
    assert allocator.get_num_allocated_blocks() == 4


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_contiguous_out_of_slots_raises_runtime_error(block_size: int) -> None:
    allocator = ContiguousKVCacheAllocator(2, 16, block_size)
    assert allocator.total_blocks == 2 * allocator.blocks_per_seq
    allocator.allocate_for_sequence(0, 16)
    allocator.allocate_for_sequence(1, 1)
    with pytest.raises(RuntimeError, match="Out of sequence slots"):
        allocator.allocate_for_sequence(2, 1)
    with pytest.raises(RuntimeError, match="max_seq_len=16"):
        allocator.append_token(0)
    assert allocator.get_num_allocated_blocks() == allocator.total_blocks


@pytest.mark.parametrize(
    "make", [lambda: paged(4, 16), lambda: ContiguousKVCacheAllocator(2, 32, 16)]
)
def test_unknown_sequence_is_a_clear_error(make: Any) -> None:
    allocator = make()
    allocator.allocate_for_sequence(1, 5)
    with pytest.raises(UnknownSequenceError, match="42") as err:
        allocator.free_sequence(42)
    assert isinstance(err.value, KeyError)
    allocator.free_sequence(1)
    with pytest.raises(UnknownSequenceError, match="1"):
        allocator.free_sequence(1)


def test_a_request_that_can_never_fit_fails_before_running(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = {**PAGED_ARGS, "num_blocks": 9}  # 144 tokens; request 19 needs 115 + 31 = 146
    with pytest.raises(ValueError, match="request 19 can never fit"):
        run_benchmark(PagedKVCacheAllocator, args, WORKLOAD)
    too_long = [{"seq_id": 3, "prompt_len": 250, "output_len": 10}]
    with pytest.raises(ValueError, match="request 3 can never fit"):
        run_benchmark(ContiguousKVCacheAllocator, CONTIGUOUS_ARGS, too_long)
    with pytest.raises(ValueError, match="appears twice"):
        run_benchmark(ContiguousKVCacheAllocator, CONTIGUOUS_ARGS, WORKLOAD[:2] * 2)
    with pytest.raises(ValueError, match="can never fit"):
        paged(2, 4).allocate_for_sequence(0, 9)
    assert "Total steps" not in capsys.readouterr().out


def test_verbose_prints_the_lessons_lines(capsys: pytest.CaptureFixture[str]) -> None:
    run_benchmark(PagedKVCacheAllocator, PAGED_ARGS, WORKLOAD[:3])
    assert "Scheduled" not in capsys.readouterr().out
    run_benchmark(PagedKVCacheAllocator, PAGED_ARGS, WORKLOAD[:3], verbose=True)
    out = capsys.readouterr().out
    assert "Step 1: Scheduled seq 0" in out
    assert "Finished seq 2, freed its memory." in out


def test_empty_workload(capsys: pytest.CaptureFixture[str]) -> None:
    summary = run_benchmark(PagedKVCacheAllocator, PAGED_ARGS, [])
    assert summary["total_steps"] == summary["max_concurrent"] == summary["completed"] == 0


def test_import_does_not_import_torch() -> None:
    code = "import pagedkv.lesson, sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)

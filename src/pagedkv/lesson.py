"""The course lesson's interface ("Paged KV Cache Integration & Benchmarking"), backed by pagedkv.

``PagedKVCacheAllocator``, ``ContiguousKVCacheAllocator``, ``RequestState``,
``SimulationEngine`` and ``run_benchmark`` keep the lesson's names, arguments, methods and
``get_stats()`` keys, so the lesson's script runs unchanged against this module. The books are
pagedkv's: a ``KVCacheManager`` (watermark 0, no swap, no prefix caching) and a
``ContiguousAllocator`` with the lesson's fixed ``slots`` reservation. What differs, and why:

- **No write past a block.** The lesson asked for a block only when ``current_len`` was a
  multiple of the block size *and* past the prompt, so a prompt that exactly filled its blocks
  wrote its first output token into a block it never got (and its utilization could exceed 1).
  Here a sequence gets its next block before it writes into it: ``append_token`` takes a block
  exactly when the last one is full. Utilization is therefore <= 1 at every step.
- **Preemption instead of stalling.** The lesson skipped a sequence that could not get a block
  ("stalled"), which can last forever once every running sequence waits for a block (the
  deadlock pagedkv's ``greedy-nopreempt`` policy reproduces). Here, as in vLLM, the most recently
  admitted running sequence is preempted by recompute: its memory is freed and it goes back to
  the front of the pending queue with its progress reset.
- **A finished sequence is freed in the step it writes its last token** (the lesson held its
  memory one idle step more). **No safety break**: the run provably ends (``run_benchmark``); a
  request that can never fit is a ``ValueError`` before it starts. The summary is returned.
- **Equal memory.** The lesson gave the contiguous allocator 5 slots of 256 tokens, i.e. 80
  blocks of 16, against paged's 100 blocks. Paged wins either way; a fair comparison gives the
  contiguous allocator the same memory: 100 x 16 // 256 = 6 slots.
- The lesson's progress lines print only with ``verbose=True``; the summary always prints.

Block level and token level: pagedkv's manager books token slots. ``append_token`` claims one
slot (a new block only when the last block is full); the lesson's ``append_block_to_sequence``
claims the rest of the last block and one whole new block, and the next ``append_token`` calls
use those claimed slots before any new block is taken.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pagedkv.errors import PagedKVError
from pagedkv.memory.block_table import cdiv
from pagedkv.memory.config import CacheConfig, ContiguousConfig, Reservation
from pagedkv.memory.contiguous import ContiguousAllocator
from pagedkv.memory.manager import KVCacheManager
from pagedkv.validation import check_int


class OutOfBlocksError(PagedKVError, RuntimeError):
    """No free memory for the request now (the lesson's contract: a ``RuntimeError``)."""


class PagedKVCacheAllocator:
    """The lesson's paged allocator on a ``KVCacheManager`` of ``num_blocks`` blocks.

    ``num_heads``, ``head_dim`` and ``dtype`` are kept but unused: this layer books memory, and
    the K/V tensors arrive with pagedkv's tensor layer (so ``dtype`` may be any object, a
    ``torch.dtype`` or a string; torch is never imported here).
    """

    def __init__(
        self, num_blocks: int, block_size: int, num_heads: int, head_dim: int, dtype: Any
    ) -> None:
        self.num_heads = check_int("num_heads", num_heads, 1)
        self.head_dim = check_int("head_dim", head_dim, 1)
        self.dtype = dtype
        self.manager = KVCacheManager(
            CacheConfig(num_gpu_blocks=num_blocks, block_size=block_size, watermark=0.0)
        )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ahead: dict[int, int] = {}  # slots claimed by append_block_to_sequence, unwritten

    @property
    def max_sequence_tokens(self) -> int:
        """The longest sequence that could ever fit: the whole pool."""
        return self.num_blocks * self.block_size

    def allocate_for_sequence(self, seq_id: int, num_prompt_tokens: int) -> None:
        """The blocks of the prompt; ``RuntimeError`` (``OutOfBlocksError``) if not free now."""
        if num_prompt_tokens > self.max_sequence_tokens:
            raise ValueError(
                f"sequence {seq_id!r}: {num_prompt_tokens} prompt tokens can never fit in "
                f"{self.num_blocks} blocks of {self.block_size}"
            )
        if self.manager.allocate(seq_id, num_prompt_tokens) is None:
            raise OutOfBlocksError(
                f"sequence {seq_id!r}: {self.manager.blocks_for(num_prompt_tokens)} blocks "
                f"needed, {self.manager.num_free_blocks} free"
            )
        self._ahead[seq_id] = 0

    def append_token(self, seq_id: int) -> None:
        """Room for one more token: a new block only when the last one is full."""
        if self._ahead.get(seq_id, 0) > 0:
            self._ahead[seq_id] -= 1
        elif self.manager.append_slots(seq_id, 1) is None:
            raise OutOfBlocksError(f"sequence {seq_id!r}: no free block for its next token")

    def append_block_to_sequence(self, seq_id: int) -> None:
        """One more block for ``seq_id``: claims the rest of its last block and a new one."""
        claim = self.manager.room(seq_id) + self.block_size
        if self.manager.append_slots(seq_id, claim) is None:
            raise OutOfBlocksError(f"sequence {seq_id!r}: no free block to append")
        self._ahead[seq_id] += claim

    def free_sequence(self, seq_id: int) -> None:
        """Every block of ``seq_id`` back to the pool; ``UnknownSequenceError`` if not held."""
        self.manager.free(seq_id)
        del self._ahead[seq_id]

    def get_num_allocated_blocks(self) -> int:
        return self.num_blocks - self.manager.num_free_blocks


class ContiguousKVCacheAllocator:
    """The lesson's naive allocator: ``num_sequences`` fixed slots of ``max_seq_len`` tokens,
    a ``ContiguousAllocator`` with the 'slots' reservation."""

    def __init__(
        self, num_sequences: int, max_seq_len: int, block_size: int, *, verbose: bool = False
    ) -> None:
        check_int("num_sequences", num_sequences, 1)
        self.backend = ContiguousAllocator(
            ContiguousConfig(
                capacity=num_sequences * max_seq_len,
                max_model_len=max_seq_len,
                reservation=Reservation.SLOTS,
                block_size=block_size,
            )
        )
        self.max_seq_len = max_seq_len
        self.block_size = block_size
        self.blocks_per_seq = cdiv(max_seq_len, block_size)
        self.total_blocks = num_sequences * self.blocks_per_seq
        if verbose:
            print(
                f"Contiguous Allocator: Total blocks = {self.total_blocks}, "
                f"reserving {self.blocks_per_seq} blocks per sequence."
            )

    @property
    def max_sequence_tokens(self) -> int:
        return self.max_seq_len

    def allocate_for_sequence(self, seq_id: int, num_prompt_tokens: int) -> None:
        """A whole slot; ``RuntimeError`` (``OutOfBlocksError``) if every slot is taken."""
        if num_prompt_tokens > self.max_seq_len:
            raise ValueError(
                f"sequence {seq_id!r}: {num_prompt_tokens} prompt tokens can never fit in a "
                f"slot of {self.max_seq_len}"
            )
        if self.backend.allocate(seq_id, num_prompt_tokens) is None:
            raise OutOfBlocksError("Out of sequence slots.")

    def append_token(self, seq_id: int) -> None:
        """One more token in the sequence's slot (reserved at admission: no memory taken)."""
        if self.backend.append_slots(seq_id, 1) is None:
            raise OutOfBlocksError(f"sequence {seq_id!r} is at max_seq_len={self.max_seq_len}")

    def append_block_to_sequence(self, seq_id: int) -> None:
        """The slot already holds max_seq_len tokens: nothing to take (checks ``seq_id``)."""
        self.backend.room(seq_id)

    def free_sequence(self, seq_id: int) -> None:
        self.backend.free(seq_id)

    def get_num_allocated_blocks(self) -> int:
        return self.backend.num_seqs * self.blocks_per_seq


@dataclass
class RequestState:
    seq_id: int
    prompt_len: int
    output_len: int
    current_len: int
    num_preemptions: int = 0


class SimulationEngine:
    """The lesson's engine: FCFS admission, one token per running sequence per step, and
    recompute preemption of the most recently admitted sequence when a block is missing."""

    def __init__(
        self, allocator: Any, requests: Sequence[Mapping[str, int]], *, verbose: bool = False
    ) -> None:
        self.allocator = allocator
        self.block_size: int = allocator.block_size
        self.verbose = verbose
        limit = getattr(allocator, "max_sequence_tokens", None)
        seen: set[int] = set()
        for r in requests:
            seq_id, prompt, output = r["seq_id"], r["prompt_len"], r["output_len"]
            if seq_id in seen:
                raise ValueError(f"request {seq_id!r} appears twice")
            seen.add(seq_id)
            check_int(f"request {seq_id!r} prompt_len", prompt, 0)
            check_int(f"request {seq_id!r} output_len", output, 0)
            if limit is not None and prompt + output > limit:
                raise ValueError(
                    f"request {seq_id!r} can never fit: {prompt} + {output} tokens, "
                    f"at most {limit} per sequence with this allocator"
                )
        self.pending_requests: deque[Mapping[str, int]] = deque(requests)
        self.running_sequences: dict[int, RequestState] = {}  # in admission order
        self.completed_sequences: list[RequestState] = []
        self.step_num = 0
        self.num_preemptions = 0
        self._preempted: dict[int, int] = {}  # seq_id -> times preempted so far

    def _log(self, message: str) -> None:
        if self.verbose:
            print(f"Step {self.step_num}: {message}")

    def _grow(self, state: RequestState) -> None:
        """Room for the token at position ``current_len`` (raises ``RuntimeError`` if none)."""
        append_token = getattr(self.allocator, "append_token", None)
        if append_token is not None:
            append_token(state.seq_id)
        elif state.current_len % self.block_size == 0:  # a lesson-style allocator
            self.allocator.append_block_to_sequence(state.seq_id)

    def _preempt(self, state: RequestState) -> None:
        """Recompute preemption: free it, back to the front of pending, progress reset."""
        del self.running_sequences[state.seq_id]
        self.allocator.free_sequence(state.seq_id)
        self._preempted[state.seq_id] = state.num_preemptions + 1
        self.num_preemptions += 1
        self.pending_requests.appendleft(
            {"seq_id": state.seq_id, "prompt_len": state.prompt_len, "output_len": state.output_len}
        )
        self._log(f"Preempted seq {state.seq_id} (recompute)")

    def step(self) -> None:
        self.step_num += 1
        # 1. Admit pending requests in order while their prompts fit.
        while self.pending_requests:
            request = self.pending_requests[0]
            try:
                self.allocator.allocate_for_sequence(request["seq_id"], request["prompt_len"])
            except RuntimeError:
                break
            self.pending_requests.popleft()
            state = RequestState(
                seq_id=request["seq_id"],
                prompt_len=request["prompt_len"],
                output_len=request["output_len"],
                current_len=request["prompt_len"],
                num_preemptions=self._preempted.get(request["seq_id"], 0),
            )
            self.running_sequences[state.seq_id] = state
            self._log(f"Scheduled seq {state.seq_id}")
        # 2. One decode step, oldest first. A victim is always the latest admitted, so it is
        # either this sequence or one not processed yet in this step.
        finished: list[RequestState] = []
        for state in list(self.running_sequences.values()):
            if state.seq_id not in self.running_sequences:
                continue  # preempted earlier in this step
            if state.current_len < state.prompt_len + state.output_len:
                while True:
                    try:
                        self._grow(state)
                        break
                    except RuntimeError:
                        victim = next(reversed(self.running_sequences.values()))
                        self._preempt(victim)
                        if victim is state:
                            break
                if state.seq_id not in self.running_sequences:
                    continue
                state.current_len += 1
            if state.current_len >= state.prompt_len + state.output_len:
                finished.append(state)
        # 3. Free what finished.
        for state in finished:
            del self.running_sequences[state.seq_id]
            self.allocator.free_sequence(state.seq_id)
            self.completed_sequences.append(state)
            self._log(f"Finished seq {state.seq_id}, freed its memory.")

    def has_pending_work(self) -> bool:
        return bool(self.pending_requests or self.running_sequences)

    def get_stats(self) -> dict[str, Any]:
        allocated_blocks: int = self.allocator.get_num_allocated_blocks()
        tokens_in_use = sum(s.current_len for s in self.running_sequences.values())
        blocks_in_use = cdiv(tokens_in_use, self.block_size)
        # Blocks used vs. blocks allocated (1.0 when nothing is allocated, as in the lesson).
        utilization = blocks_in_use / allocated_blocks if allocated_blocks else 1.0
        return {
            "step": self.step_num,
            "running": len(self.running_sequences),
            "allocated_blocks": allocated_blocks,
            "tokens_in_use": tokens_in_use,
            "utilization": utilization,
        }


def run_benchmark(
    allocator_class: Any,
    allocator_args: Mapping[str, Any],
    requests: Sequence[Mapping[str, int]],
    *,
    verbose: bool = False,
) -> dict[str, Any]:
    """Run ``requests`` to the end on ``allocator_class(**allocator_args)``; print and return
    the summary (total_steps, max_concurrent, avg_utilization, completed, preemptions).

    Raises ``ValueError`` before running if a request can never fit. Termination, without a
    safety break: every valid request fits alone in the empty pool, so admission into an empty
    pool always succeeds and a step with work always has a running sequence. The oldest running
    sequence is never preempted (victims are the latest admitted, and alone it gets every block
    it needs), and the order of running sequences only changes by removal, so the oldest writes
    one token every step until it finishes. Hence steps <= sum over requests of
    max(output_len, 1).
    """
    allocator = allocator_class(**allocator_args)
    engine = SimulationEngine(allocator, requests, verbose=verbose)
    history: list[dict[str, Any]] = []
    while engine.has_pending_work():
        engine.step()
        history.append(engine.get_stats())
    summary: dict[str, Any] = {
        "allocator": allocator_class.__name__,
        "total_steps": engine.step_num,
        "max_concurrent": max((h["running"] for h in history), default=0),
        "avg_utilization": (
            sum(h["utilization"] for h in history) / len(history) if history else 1.0
        ),
        "completed": len(engine.completed_sequences),
        "preemptions": engine.num_preemptions,
    }
    print("\n--- Benchmark Summary ---")
    print(f"Allocator: {summary['allocator']}")
    print(f"Total steps to complete: {summary['total_steps']}")
    print(f"Max concurrent requests served: {summary['max_concurrent']}")
    print(f"Average memory utilization: {summary['avg_utilization']:.2%}")
    print(f"Preemptions (recompute): {summary['preemptions']}")
    print("-------------------------\n")
    return summary

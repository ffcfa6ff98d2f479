"""Micro-benchmarks of the memory layer, each beside a minimal list-based allocator (the floor).

Every figure is the median over repeats of (elapsed ns / operations), measured side by side in
one run, so the ratio to the floor is what to read: this machine is noisy, absolute ns are not.

    python benchmarks/bench_memory.py [--repeats 7] [--json PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from pagedkv.io import atomic_write_json
from pagedkv.memory.config import CacheConfig, ContiguousConfig, Placement, Reservation
from pagedkv.memory.contiguous import ContiguousAllocator
from pagedkv.memory.manager import KVCacheManager

BS = 16
NUM_BLOCKS = 4096
SEQS = 64
BLOCKS_PER_SEQ = 32


class ListAllocator:
    """The floor: a Python list of free block ids and a list per sequence, no books at all."""

    def __init__(self, num_blocks: int) -> None:
        self.free_ids = list(range(num_blocks))
        self.refs = [0] * num_blocks
        self.tables: dict[int, list[int]] = {}
        self.tokens: dict[int, int] = {}

    def allocate(self, seq: int, num_tokens: int) -> None:
        n = -(-num_tokens // BS)
        blocks = [self.free_ids.pop() for _ in range(n)]
        for b in blocks:
            self.refs[b] = 1
        self.tables[seq] = blocks
        self.tokens[seq] = num_tokens

    def append(self, seq: int) -> None:
        if self.tokens[seq] % BS == 0:
            b = self.free_ids.pop()
            self.refs[b] = 1
            self.tables[seq].append(b)
        self.tokens[seq] += 1

    def fork(self, parent: int, child: int) -> None:
        self.tables[child] = list(self.tables[parent])
        self.tokens[child] = self.tokens[parent]
        for b in self.tables[child]:
            self.refs[b] += 1

    def cow_append(self, seq: int) -> None:
        old = self.tables[seq][-1]
        self.refs[old] -= 1
        new = self.free_ids.pop()
        self.refs[new] = 1
        self.tables[seq][-1] = new
        self.tokens[seq] += 1

    def free(self, seq: int) -> None:
        for b in reversed(self.tables.pop(seq)):
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.free_ids.append(b)
        del self.tokens[seq]


def measure(case: Callable[[], Callable[[], int]], repeats: int) -> float:
    """Median ns per operation. ``case()`` sets up (untimed) and returns the timed body, which
    returns how many operations it performed."""
    samples = []
    for _ in range(repeats):
        body = case()
        t0 = time.perf_counter_ns()
        ops = body()
        samples.append((time.perf_counter_ns() - t0) / ops)
    return statistics.median(samples)


def paged(caching: bool = False) -> KVCacheManager:
    return KVCacheManager(CacheConfig(NUM_BLOCKS, BS, watermark=0.0, enable_prefix_caching=caching))


# ----- the operations: each case sets up untimed and returns its timed body ------------------
Body = Callable[[], int]


def alloc_free_paged() -> Body:
    m = paged()

    def body() -> int:
        for s in range(SEQS):
            m.allocate(s, BLOCKS_PER_SEQ * BS)
        for s in range(SEQS):
            m.free(s)
        return SEQS * BLOCKS_PER_SEQ

    return body


def alloc_free_list() -> Body:
    a = ListAllocator(NUM_BLOCKS)

    def body() -> int:
        for s in range(SEQS):
            a.allocate(s, BLOCKS_PER_SEQ * BS)
        for s in range(SEQS):
            a.free(s)
        return SEQS * BLOCKS_PER_SEQ

    return body


STEPS = BLOCKS_PER_SEQ * BS - 1


def append_paged() -> Body:
    m = paged()
    for s in range(SEQS):
        m.allocate(s, 1)

    def body() -> int:
        for _ in range(STEPS):
            for s in range(SEQS):
                m.append_slots(s, 1)
        return SEQS * STEPS

    return body


def append_list() -> Body:
    a = ListAllocator(NUM_BLOCKS)
    for s in range(SEQS):
        a.allocate(s, 1)

    def body() -> int:
        for _ in range(STEPS):
            for s in range(SEQS):
                a.append(s)
        return SEQS * STEPS

    return body


FORKS = 2000


def fork_cow_paged() -> Body:
    m = paged()
    m.allocate("p", BLOCKS_PER_SEQ * BS - 1)

    def body() -> int:
        for i in range(FORKS):
            m.fork("p", i)
            m.append_slots(i, 1)  # copy-on-write of the shared partial last block
            m.free(i)
        return FORKS

    return body


def fork_cow_list() -> Body:
    a = ListAllocator(NUM_BLOCKS)
    a.allocate(-1, BLOCKS_PER_SEQ * BS - 1)

    def body() -> int:
        for i in range(FORKS):
            a.fork(-1, i)
            a.cow_append(i)
            a.free(i)
        return FORKS

    return body


PROMPT = list(range(BLOCKS_PER_SEQ * BS + 1))
LOOKUPS = 200


def lookup_paged() -> Body:
    m = paged(caching=True)
    m.allocate("a", len(PROMPT), token_ids=PROMPT)

    def body() -> int:
        for _ in range(LOOKUPS):
            m.lookup_prefix(PROMPT)
        return LOOKUPS * BLOCKS_PER_SEQ

    return body


def lookup_list() -> Body:
    # The floor chains Python's built-in hash over (parent, block tokens): fast, but 64 bits and
    # not collision-resistant (pagedkv.memory.prefix_hash says why we pay for SHA-256).
    cache: dict[int, int] = {}
    parent = 0
    for j in range(BLOCKS_PER_SEQ):
        parent = hash((parent, tuple(PROMPT[j * BS : (j + 1) * BS])))
        cache[parent] = j

    def body() -> int:
        for _ in range(LOOKUPS):
            key = 0
            for j in range(BLOCKS_PER_SEQ):
                key = hash((key, tuple(PROMPT[j * BS : (j + 1) * BS])))
                if key not in cache:
                    break
        return LOOKUPS * BLOCKS_PER_SEQ

    return body


def contiguous_alloc_free(placement: Placement) -> Callable[[], Body]:
    def case() -> Body:
        a = ContiguousAllocator(
            ContiguousConfig(NUM_BLOCKS * BS, 2048, placement, Reservation.ORACLE, block_size=BS)
        )
        lengths = [(37 * s) % 900 + 100 for s in range(SEQS)]  # fits even rounded up

        def body() -> int:
            for s, n in enumerate(lengths):
                assert a.allocate(s, n // 2, final_len=n) is not None
            for s in range(0, SEQS, 2):  # free every other region: holes to coalesce/merge
                a.free(s)
            for s in range(1, SEQS, 2):
                a.free(s)
            return 2 * SEQS

        return body

    return case


def regions_list() -> Body:
    a = ListAllocator(SEQS)

    def body() -> int:
        for s in range(SEQS):
            a.tables[s] = [a.free_ids.pop()]
        for s in range(SEQS):
            a.free_ids.extend(a.tables.pop(s))
        return 2 * SEQS

    return body


@dataclass(frozen=True)
class Result:
    operation: str
    unit: str
    pagedkv_ns: float
    floor_ns: float

    @property
    def ratio(self) -> float:
        return self.pagedkv_ns / self.floor_ns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    cases: list[tuple[str, str, Callable[[], Body], Callable[[], Body]]] = [
        ("paged allocate + free", "per block", alloc_free_paged, alloc_free_list),
        ("paged append", "per token", append_paged, append_list),
        ("paged fork + copy-on-write + free", "per fork", fork_cow_paged, fork_cow_list),
        ("paged prefix lookup (SHA-256)", "per block", lookup_paged, lookup_list),
        (
            "first-fit allocate / free",
            "per operation",
            contiguous_alloc_free(Placement.FIRST_FIT),
            regions_list,
        ),
        (
            "buddy allocate / free",
            "per operation",
            contiguous_alloc_free(Placement.BUDDY),
            regions_list,
        ),
    ]
    results = []
    for name, unit, ours, floor in cases:
        results.append(
            Result(name, unit, measure(ours, args.repeats), measure(floor, args.repeats))
        )
    table = Table(title=f"pagedkv memory micro-benchmarks (median of {args.repeats} repeats)")
    for col in ("operation", "unit", "pagedkv ns", "list floor ns", "ratio"):
        table.add_column(col, justify="left" if col in ("operation", "unit") else "right")
    for r in results:
        table.add_row(
            r.operation, r.unit, f"{r.pagedkv_ns:,.0f}", f"{r.floor_ns:,.0f}", f"{r.ratio:.1f}x"
        )
    Console().print(table)
    if args.json:
        atomic_write_json(
            args.json,
            [{**r.__dict__, "ratio": r.ratio} for r in results],
        )


if __name__ == "__main__":
    main()

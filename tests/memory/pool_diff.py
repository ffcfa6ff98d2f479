"""A differential driver for two block pools that must hand out the same blocks: any
allocate (one or many) / incref / decref / release sequence, checked after every step."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest

from pagedkv.errors import IntegrityError, PagedKVError
from pagedkv.memory.block_pool import BlockPool

OPS = st.lists(
    st.tuples(
        st.sampled_from(["alloc", "alloc_many", "incref", "decref", "release"]),
        st.integers(0, 10**6),
    ),
    max_size=80,
)


def drive(reference: BlockPool, candidate: BlockPool, ops: list[tuple[str, int]]) -> None:
    """Run ``ops`` on both pools: the same blocks taken and freed, the same free queue and
    counts after every step, the candidate's books whole; a release of every fifth pick
    names its chain backwards; at the end a double free raises in both."""
    size = reference.num_blocks
    held: list[int] = []  # one entry per reference taken
    for op, pick in ops:
        if op == "alloc" and reference.num_free:
            block = reference.allocate()
            assert candidate.allocate() == block
            held.append(block)
        elif op == "alloc_many":
            n = pick % (size + 2)
            if n > reference.num_free:
                for pool in (candidate, reference):
                    with pytest.raises(PagedKVError):
                        pool.allocate_many(n)
                continue
            blocks = reference.allocate_many(n)
            assert candidate.allocate_many(n) == blocks
            held += blocks
        elif op == "incref" and held:
            block = held[pick % len(held)]
            reference.incref(block)
            candidate.incref(block)
            held.append(block)
        elif op == "decref" and held:
            block = held.pop(pick % len(held))
            assert candidate.decref(block) == reference.decref(block)
        elif op == "release" and held:
            chain = held[pick % len(held) :]
            del held[pick % len(held) :]
            if pick % 5 == 0:
                chain.reverse()
            assert candidate.release(chain) == reference.release(chain)
        assert candidate.free_blocks() == reference.free_blocks()
        assert (candidate.num_free, candidate.num_used, candidate.num_refs) == (
            reference.num_free,
            reference.num_used,
            reference.num_refs,
        )
        candidate.check_integrity(list(reference.ref_counts))
    free = candidate.free_blocks()
    if free:  # a free block released again is a double free, in both pools
        for pool in (candidate, reference):
            with pytest.raises(IntegrityError):
                pool.release(free[:1])

"""BlockTable: slots on demand, copy-on-write on a shared last block, fork, release order."""

from __future__ import annotations

import pytest

from pagedkv.memory.block_pool import BlockPool
from pagedkv.memory.block_table import BlockTable, cdiv
from pagedkv.memory.interface import BlockCopy
from tests.factories import BLOCK_SIZES


@pytest.mark.parametrize("bs", BLOCK_SIZES)
@pytest.mark.parametrize("steps", [[1], [5, 1, 1], [3, 0, 20, 2]])
def test_holds_exactly_ceil_tokens_over_block_size(bs: int, steps: list[int]) -> None:
    pool = BlockPool(64)
    table = BlockTable(bs)
    total = 0
    for n in steps:
        assert table.blocks_needed(n) == cdiv(total + n, bs) - len(table.blocks)
        assert table.append_slots(pool, n) == []
        total += n
        assert table.num_tokens == total
        assert len(table.blocks) == cdiv(total, bs)
        assert pool.num_used == len(table.blocks)


@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_fill_per_logical_block(bs: int) -> None:
    pool = BlockPool(64)
    table = BlockTable(bs)
    table.append_slots(pool, 2 * bs + 1)
    assert [table.fill(j) for j in range(3)] == [bs, bs, 1]
    assert table.fill(3) == 0


@pytest.mark.parametrize("bs", [2, 16, 7])  # bs 1 has no partial block to copy
def test_append_into_shared_partial_block_copies_first(bs: int) -> None:
    pool = BlockPool(16)
    parent = BlockTable(bs)
    parent.append_slots(pool, bs + 1)  # last block partially filled
    child = parent.fork(pool)
    shared_last = parent.blocks[-1]
    assert pool.ref_counts[shared_last] == 2
    copies = child.append_slots(pool, 1)
    assert len(copies) == 1
    assert copies[0] == BlockCopy(shared_last, child.blocks[-1])
    assert child.blocks[-1] != shared_last
    assert pool.ref_counts[shared_last] == 1
    assert child.blocks[:-1] == parent.blocks[:-1]
    # The parent now owns its block alone: no copy needed.
    assert parent.append_slots(pool, 1) == []


@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_append_after_full_shared_block_needs_no_copy(bs: int) -> None:
    pool = BlockPool(16)
    parent = BlockTable(bs)
    parent.append_slots(pool, 2 * bs)
    child = parent.fork(pool)
    assert child.append_slots(pool, 1) == []
    assert all(pool.ref_counts[b] == 2 for b in parent.blocks)


@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_release_frees_last_block_first_and_keeps_shared(bs: int) -> None:
    pool = BlockPool(16)
    a = BlockTable(bs)
    a.append_slots(pool, 3 * bs)
    blocks = list(a.blocks)
    b = a.fork(pool)
    assert a.release(pool) == []  # all still referenced by b
    assert b.release(pool) == list(reversed(blocks))
    assert pool.num_free == 16


def test_token_ids_that_ran_ahead_stay_known() -> None:
    pool = BlockPool(8)
    table = BlockTable(4, token_ids=list(range(10)))
    table.append_slots(pool, 8)
    table.note_token_ids(8, None)
    assert table.tokens_known
    assert len(table.new_block_keys()) == 2


def test_appending_without_ids_stops_keys_for_good() -> None:
    pool = BlockPool(8)
    table = BlockTable(4, token_ids=[1, 2])
    table.append_slots(pool, 2)
    table.note_token_ids(2, None)
    table.append_slots(pool, 3)
    table.note_token_ids(3, None)
    assert not table.tokens_known
    table.append_slots(pool, 4)
    table.note_token_ids(4, [1, 2, 3, 4])
    assert not table.tokens_known
    assert table.new_block_keys() == []

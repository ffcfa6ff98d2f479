"""The linear address spaces of the contiguous baselines: first-fit, buddy, fixed slots."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.errors import ConfigError, IntegrityError, UnknownSequenceError
from pagedkv.memory.placement import AddressSpace, BuddySpace, FirstFitSpace, FixedSlotSpace

BLOCK_SIZES = [1, 16, 7]


def assert_partition(space: AddressSpace) -> None:
    """Regions and holes tile [0, C) exactly, and the free counter is C minus the regions."""
    runs = sorted(space.regions() + space.holes())
    at = 0
    for start, size in runs:
        assert start == at
        assert size >= 1
        at += size
    assert at == space.capacity
    assert space.free_slots == space.capacity - sum(n for _, n in space.regions())


# ------------------------------------------------------------------------------ first-fit
@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_first_fit_places_back_to_back_and_frees(bs: int) -> None:
    space = FirstFitSpace(8 * bs)
    starts = [space.alloc(n * bs) for n in (1, 2, 3)]
    assert starts == [0, bs, 3 * bs]
    assert space.free_slots == 2 * bs
    assert space.allocated_size(bs) == 2 * bs
    assert space.alloc(3 * bs) is None  # 2 blocks left
    space.free(bs)
    assert space.holes() == [(bs, 2 * bs), (6 * bs, 2 * bs)]
    space.check_integrity()


@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_first_fit_coalesces_middle_then_neighbours_into_one_hole(bs: int) -> None:
    space = FirstFitSpace(3 * bs)
    a, b, c = (space.alloc(bs) for _ in range(3))
    assert (a, b, c) == (0, bs, 2 * bs)
    assert space.holes() == []
    space.free(bs)
    assert space.holes() == [(bs, bs)]
    space.free(0)  # merges with the hole after it
    assert space.holes() == [(0, 2 * bs)]
    space.free(2 * bs)  # merges with the hole before it
    assert space.holes() == [(0, 3 * bs)]
    space.check_integrity()


@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_first_fit_takes_lowest_hole_not_best_fit(bs: int) -> None:
    space = FirstFitSpace(6 * bs)
    for n in (2, 1, 1, 2):
        space.alloc(n * bs)
    space.free(0)  # hole of 2 blocks at 0
    space.free(3 * bs)  # hole of 1 block at 3 (a best fit would pick it)
    assert space.alloc(bs) == 0
    assert space.holes() == [(bs, bs), (3 * bs, bs)]


@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_first_fit_external_fragmentation_is_real(bs: int) -> None:
    space = FirstFitSpace(4 * bs)
    for _ in range(4):
        space.alloc(bs)
    space.free(0)
    space.free(2 * bs)
    holes = space.holes()
    assert space.free_slots == 2 * bs >= bs + 1  # enough memory in total...
    assert space.largest_free == bs  # ...but no hole is big enough
    assert space.can_ever_fit(bs + 1)
    assert not space.fits_now(bs + 1)
    assert space.alloc(bs + 1) is None
    assert space.holes() == holes  # and nothing changed


def test_first_fit_misuse_raises() -> None:
    space = FirstFitSpace(10)
    with pytest.raises(ConfigError):
        space.alloc(0)
    start = space.alloc(4)
    assert start is not None
    with pytest.raises(UnknownSequenceError, match="slot 1"):
        space.free(1)
    space.free(start)
    with pytest.raises(UnknownSequenceError):
        space.free(start)  # double free
    assert not space.can_ever_fit(11)
    assert space.can_ever_fit(10)


def test_first_fit_integrity_catches_unmerged_holes() -> None:
    space = FirstFitSpace(10)
    space.alloc(5)
    space.alloc(5)
    space.check_integrity()
    # Corrupt the books as a buggy free would: two adjacent holes instead of one.
    space._regions.clear()
    space._free = 10
    space._starts, space._hole = [0, 5], {0: 5, 5: 5}
    with pytest.raises(IntegrityError, match="adjacent"):
        space.check_integrity()


def _lowest_free_run(used: list[bool], size: int) -> int | None:
    """A naive first fit over an occupancy map."""
    run = 0
    for i, u in enumerate(used):
        run = 0 if u else run + 1
        if run == size:
            return i - size + 1
    return None


@settings(max_examples=150, deadline=None)
@given(
    capacity=st.integers(1, 64),
    ops=st.lists(st.tuples(st.booleans(), st.integers(1, 24)), max_size=40),
)
def test_first_fit_matches_a_naive_occupancy_map(
    capacity: int, ops: list[tuple[bool, int]]
) -> None:
    space = FirstFitSpace(capacity)
    used = [False] * capacity
    live: list[tuple[int, int]] = []
    for do_alloc, n in ops:
        if do_alloc or not live:
            want = _lowest_free_run(used, n)
            got = space.alloc(n)
            assert got == want
            if got is not None:
                used[got : got + n] = [True] * n
                live.append((got, n))
        else:
            start, size = live.pop(n % len(live))
            space.free(start)
            used[start : start + size] = [False] * size
        space.check_integrity()
        assert_partition(space)
        assert space.free_slots == used.count(False)
    for start, _ in live:
        space.free(start)
    assert space.holes() == [(0, capacity)]


# ---------------------------------------------------------------------------------- buddy
@pytest.mark.parametrize("num_blocks", [100, 64, 37])
@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_buddy_arenas_follow_binary_decomposition(num_blocks: int, bs: int) -> None:
    capacity = num_blocks * bs
    space = BuddySpace(capacity)
    sizes = [1 << k for _, k in space.arenas]
    assert sum(sizes) == capacity
    assert sizes == sorted(set(sizes), reverse=True)  # distinct powers of two, largest first
    assert [b for b, _ in space.arenas] == [sum(sizes[:i]) for i in range(len(sizes))]
    assert space.holes() == [(b, 1 << k) for b, k in space.arenas]
    assert space.largest_block() == sizes[0]
    assert space.can_ever_fit(sizes[0])
    assert not space.can_ever_fit(sizes[0] + 1)  # even when C >= that size
    space.check_integrity()


def test_buddy_arenas_of_1600() -> None:
    assert BuddySpace(1600).arenas == [(0, 10), (1024, 9), (1536, 6)]  # 1024 + 512 + 64


@pytest.mark.parametrize(("size", "block"), [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (129, 256)])
def test_buddy_block_size_is_next_power_of_two(size: int, block: int) -> None:
    space = BuddySpace(1024)
    assert space.block_size_for(size) == block
    start = space.alloc(size)
    assert start is not None
    assert space.allocated_size(start) == block
    assert space.free_slots == 1024 - block


def test_buddy_split_then_merge_back_whole() -> None:
    space = BuddySpace(16)
    assert space.alloc(3) == 0  # 16 -> 8 + 8 -> 4 + 4 + 8: takes the 4-slot block at 0
    assert space.holes() == [(4, 4), (8, 8)]
    assert space.alloc(1) == 4  # smallest free block with room is the 4 at 4: split to 1
    assert space.holes() == [(5, 1), (6, 2), (8, 8)]
    space.check_integrity()
    space.free(0)
    assert space.holes() == [(0, 4), (5, 1), (6, 2), (8, 8)]  # buddy of 0 (order 2) is in use
    space.free(4)
    assert space.holes() == [(0, 16)]  # 4+1 -> 2 -> 4 -> 8 -> 16, recursively
    space.check_integrity()


def test_buddy_prefers_the_smallest_block_over_the_lowest_address() -> None:
    space = BuddySpace(24)  # arenas [0, 16) and [16, 24)
    assert space.alloc(8) == 16  # the 8-slot arena, not a split of the 16 at 0
    assert space.alloc(8) == 0
    assert space.alloc(8) == 8
    assert space.alloc(1) is None


def test_buddy_arenas_never_merge_together() -> None:
    space = BuddySpace(24)
    a, b = space.alloc(16), space.alloc(8)
    assert (a, b) == (0, 16)
    space.free(16)
    space.free(0)
    assert space.holes() == [(0, 16), (16, 8)]
    assert space.alloc(17) is None
    assert not space.can_ever_fit(17)


@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_buddy_external_fragmentation_is_real(bs: int) -> None:
    space = BuddySpace(8 * bs)  # one arena if bs is a power of two, else three
    block = space.block_size_for(bs)
    starts = []
    while (s := space.alloc(bs)) is not None:
        starts.append(s)
    assert len(starts) == sum((1 << k) // block for _, k in space.arenas)
    for s in starts:  # free every other block: no freed block's buddy is free
        if s // block % 2 == 0:  # (an arena's base is a multiple of twice its size)
            space.free(s)
    space.check_integrity()
    assert space.free_slots >= 2 * block
    assert space.largest_block() == block
    assert space.can_ever_fit(2 * block)
    assert space.alloc(2 * block) is None


def test_buddy_integrity_catches_unmerged_buddies() -> None:
    space = BuddySpace(8)
    space.check_integrity()
    space._free_lists[3].clear()
    del space._free_order[0]
    space._push(0, 2)
    space._push(4, 2)
    with pytest.raises(IntegrityError, match="not merged"):
        space.check_integrity()


@settings(max_examples=150, deadline=None)
@given(
    capacity=st.integers(1, 200),
    ops=st.lists(st.tuples(st.booleans(), st.integers(1, 70)), max_size=40),
)
def test_buddy_random_ops_keep_invariants(capacity: int, ops: list[tuple[bool, int]]) -> None:
    space = BuddySpace(capacity)
    arenas = space.holes()
    live: list[int] = []
    for do_alloc, n in ops:
        if do_alloc or not live:
            fits = space.fits_now(n)
            before = space.holes()
            got = space.alloc(n)
            assert (got is not None) == fits
            if got is None:
                assert space.holes() == before
            else:
                size = space.allocated_size(got)
                assert size == space.block_size_for(n) >= n
                base = max(b for b, _ in arenas if b <= got)
                assert (got - base) % size == 0
                live.append(got)
        else:
            space.free(live.pop(n % len(live)))
        space.check_integrity()
        assert_partition(space)
    for start in live:
        space.free(start)
    assert space.holes() == arenas


# ----------------------------------------------------------------------------- fixed slots
@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_fixed_slots_lesson_layout_remainder_unusable(bs: int) -> None:
    capacity, slot_len = 100 * bs, 16 * bs
    space = FixedSlotSpace(capacity, slot_len)
    assert space.num_slots == capacity // slot_len
    starts = [space.alloc(1) for _ in range(space.num_slots)]
    assert starts == [i * slot_len for i in range(space.num_slots)]
    assert all(space.allocated_size(s) == slot_len for s in starts if s is not None)
    remainder = capacity % slot_len
    assert remainder > 0
    assert space.free_slots == remainder  # free, yet never usable
    assert space.largest_free == 0
    assert space.alloc(1) is None
    assert space.holes() == [(capacity - remainder, remainder)]
    space.check_integrity()


def test_fixed_slots_reuse_lowest_free_and_refuse_oversize() -> None:
    space = FixedSlotSpace(50, 10)
    for _ in range(5):
        space.alloc(10)
    space.free(30)
    space.free(10)
    assert space.alloc(3) == 10
    assert space.alloc(10) == 30
    assert not space.can_ever_fit(11)
    space.free(0)
    assert space.alloc(11) is None
    assert space.holes() == [(0, 10)]
    with pytest.raises(UnknownSequenceError):
        space.free(5)
    space.check_integrity()


def test_fixed_slots_integrity_catches_double_booking() -> None:
    space = FixedSlotSpace(30, 10)
    space.alloc(5)
    space._free_idx.append(0)  # slot 0 both taken and free
    with pytest.raises(IntegrityError):
        space.check_integrity()

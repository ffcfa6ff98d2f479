"""The contiguous baselines: reservation policies, admission answers, accounting."""

from __future__ import annotations

from collections.abc import Hashable

import pytest

from pagedkv.errors import ConfigError, UnknownSequenceError
from pagedkv.memory.config import ContiguousConfig, Placement, Reservation
from pagedkv.memory.contiguous import ContiguousAllocator
from pagedkv.memory.interface import AllocStatus, KVAllocator, SlotCopy
from pagedkv.memory.placement import BuddySpace, FirstFitSpace, FixedSlotSpace
from tests.factories import BLOCK_SIZES
from tests.factories import CONTIGUOUS_VARIANTS as VARIANTS


def make(
    placement: Placement | str,
    reservation: Reservation | str,
    num_blocks: int,
    block_size: int,
    max_model_len: int,
) -> ContiguousAllocator:
    return ContiguousAllocator(
        ContiguousConfig(
            capacity=num_blocks * block_size,
            max_model_len=max_model_len,
            placement=placement,  # type: ignore[arg-type]  # strings are accepted
            reservation=reservation,  # type: ignore[arg-type]
            block_size=block_size,
        )
    )


def next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def snapshot(a: ContiguousAllocator) -> tuple[object, ...]:
    return (a.usage(), a.num_seqs, a.space.regions(), a.space.holes())


# --------------------------------------------------------------------------- reservations
@pytest.mark.parametrize("bs", BLOCK_SIZES)
@pytest.mark.parametrize(("placement", "reservation"), VARIANTS)
def test_reservation_size_and_region_held(
    placement: Placement, reservation: Reservation, bs: int
) -> None:
    mml = 10 * bs
    a = make(placement, reservation, 40, bs, mml)
    assert isinstance(a, KVAllocator)
    for i, final in enumerate([1, 3 * bs, 5 * bs + 1, mml]):
        out = final - 1  # a 1-token prompt
        want = {
            Reservation.MAX: mml,
            Reservation.SLOTS: mml,
            Reservation.POW2: min(1 + (next_pow2(out) if out else 0), mml),
            Reservation.ORACLE: final,
        }[reservation]
        assert a.reservation_for(final, 1) == want
        assert a.allocate(i, 1, final_len=final) == 0
        held = a.region(i)[1]
        assert held == (next_pow2(want) if placement is Placement.BUDDY else want)
        a.free(i)
    assert (
        type(a.space)
        is {
            (Placement.BUDDY, False): BuddySpace,
            (Placement.FIRST_FIT, False): FirstFitSpace,
            (Placement.FIRST_FIT, True): FixedSlotSpace,
        }[(placement, reservation is Reservation.SLOTS)]
    )


@pytest.mark.parametrize("reservation", [Reservation.POW2, Reservation.ORACLE])
def test_policies_that_need_the_final_length_say_so(reservation: Reservation) -> None:
    a = make(Placement.FIRST_FIT, reservation, 10, 16, 64)
    for call in (a.can_allocate, a.allocate):
        with pytest.raises(ConfigError, match=reservation.value) as err:
            call("s", 4)
        assert err.value.field == "final_len"
    assert a.num_seqs == 0


@pytest.mark.parametrize("placement", list(Placement))
def test_max_without_final_length_counts_the_region_as_final(placement: Placement) -> None:
    mml = 48  # not a power of two: a buddy block of 64 holds 16 slots more
    a = make(placement, Reservation.MAX, 10, 16, mml)
    a.allocate("s", 5)
    _, held = a.region("s")
    u = a.usage()
    assert (u.token_states, u.reservation, u.internal_fragmentation) == (5, mml - 5, held - mml)
    assert a.append_slots("s", mml - 5) == []
    assert a.append_slots("s") is None  # max_model_len caps growth, even inside a buddy block


# -------------------------------------------------------------------- OK / LATER / NEVER
@pytest.mark.parametrize("bs", BLOCK_SIZES)
@pytest.mark.parametrize(("placement", "reservation"), VARIANTS)
def test_never_later_ok(placement: Placement, reservation: Reservation, bs: int) -> None:
    mml = 4 * bs
    a = make(placement, reservation, 8, bs, mml)
    assert a.can_allocate("x", mml + 1, final_len=mml + 1) is AllocStatus.NEVER
    assert a.can_allocate("x", 1, final_len=mml + 1) is AllocStatus.NEVER
    assert a.can_allocate("x", 1, final_len=mml) is AllocStatus.OK
    i = 0
    while a.can_allocate(i, 1, final_len=mml) is AllocStatus.OK:
        assert a.allocate(i, 1, final_len=mml) == 0
        i += 1
    assert i >= 1
    before = snapshot(a)
    assert a.can_allocate("x", 1, final_len=mml) is AllocStatus.LATER
    assert a.allocate("x", 1, final_len=mml) is None
    assert a.allocate("y", mml + 1, final_len=mml + 1) is None
    assert snapshot(a) == before
    a.free(0)
    assert a.can_allocate("x", 1, final_len=mml) is AllocStatus.OK


@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_never_when_the_block_exceeds_the_largest_buddy_arena(bs: int) -> None:
    capacity = 100 * bs
    largest_arena = 1 << (capacity.bit_length() - 1)
    assert largest_arena < capacity
    mml = largest_arena + 1  # fits in C, but its buddy block does not fit in any arena
    buddy = make(Placement.BUDDY, Reservation.MAX, 100, bs, mml)
    assert buddy.can_allocate("s", 1) is AllocStatus.NEVER
    assert buddy.allocate("s", 1) is None
    first_fit = make(Placement.FIRST_FIT, Reservation.MAX, 100, bs, mml)
    assert first_fit.can_allocate("s", 1) is AllocStatus.OK


@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_later_under_external_fragmentation(bs: int) -> None:
    a = make(Placement.FIRST_FIT, Reservation.ORACLE, 8, bs, 8 * bs)
    for i in range(8):
        a.allocate(i, 1, final_len=bs)
    for i in range(0, 8, 2):
        a.free(i)
    assert a.num_free_slots == 4 * bs >= 2 * bs  # enough slots in total...
    before = snapshot(a)
    assert a.can_allocate("big", 1, final_len=2 * bs) is AllocStatus.LATER  # ...no hole fits
    assert a.allocate("big", 1, final_len=2 * bs) is None
    assert snapshot(a) == before
    assert a.usage(waiting_for_memory=True).external_fragmentation == 4 * bs


def test_duplicate_and_unknown_ids_are_misuse() -> None:
    a = make(Placement.FIRST_FIT, Reservation.MAX, 10, 16, 32)
    a.allocate(("req", 1), 4)
    for call in (a.can_allocate, a.allocate):
        with pytest.raises(UnknownSequenceError, match="already allocated"):
            call(("req", 1), 4)
    unknown: Hashable = "ghost"
    for op in (a.free, a.num_tokens, a.region, a.append_slots):
        with pytest.raises(UnknownSequenceError) as err:
            op(unknown)
        assert str(err.value) == "unknown sequence id 'ghost'"  # not KeyError's quoting
    with pytest.raises(UnknownSequenceError):
        a.fork(unknown, "child")
    with pytest.raises(UnknownSequenceError):
        a.fork(("req", 1), ("req", 1))
    assert a.num_seqs == 1
    assert not hasattr(a, "swap_out")
    assert not hasattr(a, "swap_in")


def test_bad_lengths_raise_config_errors() -> None:
    a = make(Placement.FIRST_FIT, Reservation.ORACLE, 10, 16, 64)
    with pytest.raises(ConfigError) as err:
        a.can_allocate("s", 10, final_len=5)
    assert err.value.field == "final_len"
    with pytest.raises(ConfigError) as err:
        a.allocate("s", -1, final_len=5)
    assert err.value.field == "num_tokens"
    assert a.num_seqs == 0


# ------------------------------------------------------------------------- append / fork
@pytest.mark.parametrize("bs", BLOCK_SIZES)
@pytest.mark.parametrize(("placement", "reservation"), VARIANTS)
def test_append_inside_region_then_refused(
    placement: Placement, reservation: Reservation, bs: int
) -> None:
    mml = 6 * bs
    a = make(placement, reservation, 20, bs, mml)
    final = 3 * bs + 1
    a.allocate("s", 2, final_len=final)
    _, held = a.region("s")
    room = min(held, mml)
    assert a.append_slots("s", room - 3) == []
    assert a.append_slots("s") == []
    assert a.num_tokens("s") == room
    before = snapshot(a)
    assert a.append_slots("s") is None
    assert snapshot(a) == before
    u = a.usage()
    assert u.token_states == room
    assert u.reservation == 0  # the final length was raised to what it reached, if beyond
    assert u.internal_fragmentation == held - room
    a.check_integrity()


@pytest.mark.parametrize("bs", BLOCK_SIZES)
@pytest.mark.parametrize(("placement", "reservation"), VARIANTS)
def test_fork_copies_into_a_new_region(
    placement: Placement, reservation: Reservation, bs: int
) -> None:
    mml, final = 8 * bs, 2 * bs + 6
    a = make(placement, reservation, 32, bs, mml)
    a.allocate("p", 3, final_len=final)
    a.append_slots("p", 2)
    copies = a.fork("p", "c")
    assert copies is not None
    (copy,) = copies
    assert copy == SlotCopy(a.region("p")[0], a.region("c")[0], 5)
    assert a.num_tokens("c") == 5
    assert a.region("c")[1] == a.region("p")[1]  # same final length -> same region size
    u = a.usage()
    assert u.token_states == 10
    assert u.reservation == 2 * (min(a.region("p")[1], final) - 5)
    a.free("p")
    assert a.num_tokens("c") == 5
    a.check_integrity()


def test_fork_without_room_changes_nothing() -> None:
    a = make(Placement.FIRST_FIT, Reservation.ORACLE, 4, 16, 64)
    a.allocate("p", 10, final_len=40)
    before = snapshot(a)
    assert a.fork("p", "c") is None  # 24 free slots, 40 needed
    assert snapshot(a) == before
    assert a.fork("p", "c", final_len=20) == [SlotCopy(0, 40, 10)]
    assert a.region("c") == (40, 20)


# ----------------------------------------------------------------------------- accounting
@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_accounting_by_hand(bs: int) -> None:
    capacity, mml = 16 * bs, 6 * bs
    a = make(Placement.FIRST_FIT, Reservation.MAX, 16, bs, mml)
    a.allocate("a", 3, final_len=2 * bs + 3)  # region 6bs: 3 tokens, 2bs to come, 4bs-3 never
    a.allocate("b", 1, final_len=6 * bs)  # region 6bs: 1 token, 6bs-1 to come
    u = a.usage()
    assert u.token_states == 3 + 1
    assert u.reservation == 2 * bs + (6 * bs - 1)
    assert u.internal_fragmentation == 4 * bs - 3
    assert u.free == capacity - 12 * bs == a.num_free_slots
    assert u.external_fragmentation == 0
    waiting = a.usage(waiting_for_memory=True)
    assert waiting.external_fragmentation == u.free
    assert waiting.free == 0
    assert waiting.allocated == u.allocated == 12 * bs
    assert u.token_utilization == pytest.approx(4 / (12 * bs))
    assert u.pool_occupancy == pytest.approx(12 / 16)
    a.free("a")
    u = a.usage()
    assert (u.token_states, u.reservation, u.internal_fragmentation) == (1, 6 * bs - 1, 0)
    assert u.free == capacity - 6 * bs
    a.check_integrity()


def test_buddy_rounding_is_internal_fragmentation() -> None:
    a = make(Placement.BUDDY, Reservation.ORACLE, 100, 16, 256)
    a.allocate("s", 20, final_len=70)  # block of 128
    u = a.usage()
    assert (u.token_states, u.reservation, u.internal_fragmentation) == (20, 50, 58)


def test_integrity_catches_stale_counters() -> None:
    a = make(Placement.FIRST_FIT, Reservation.ORACLE, 10, 16, 64)
    a.allocate("s", 4, final_len=30)
    a.check_integrity()
    a._reservation += 1
    with pytest.raises(AssertionError, match="counters"):
        a.check_integrity()


# ------------------------------------------------------------------- the course lesson
LESSON = {"num_blocks": 100, "block_size": 16, "max_model_len": 256}
LESSON_REQUESTS = [(20 + 5 * i, 50 - i) for i in range(20)]  # (prompt, output)


def test_lesson_slots_layout() -> None:
    a = make(Placement.FIRST_FIT, Reservation.SLOTS, **LESSON)
    capacity = LESSON["num_blocks"] * LESSON["block_size"]
    assert isinstance(a.space, FixedSlotSpace)
    assert a.space.num_slots == a.config.num_slots == capacity // LESSON["max_model_len"] == 6
    for i in range(6):
        assert a.allocate(i, 10) == 0
    assert a.can_allocate(6, 10) is AllocStatus.LATER
    assert a.num_free_slots == capacity % LESSON["max_model_len"]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"placement": "buddy", "reservation": "slots"}, "placement"),
        ({"reservation": "fifo"}, "reservation"),
        ({"placement": "best-fit"}, "placement"),
        ({"capacity": 100, "max_model_len": 101, "block_size": 1}, "max_model_len"),
    ],
)
def test_config_errors_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        ContiguousConfig(**kwargs)  # type: ignore[arg-type]
    assert err.value.field == field


def admit_fcfs(a: ContiguousAllocator) -> int:
    """Admit the lesson's requests in order until the first that does not fit now."""
    for i, (prompt, output) in enumerate(LESSON_REQUESTS):
        status = a.can_allocate(i, prompt, final_len=prompt + output)
        assert status is not AllocStatus.NEVER
        if status is AllocStatus.LATER:
            assert a.allocate(i, prompt, final_len=prompt + output) is None
            return i
        assert a.allocate(i, prompt, final_len=prompt + output) == 0
    return len(LESSON_REQUESTS)


def packed_count(sizes: list[int], capacity: int) -> int:
    """How many of ``sizes`` fit back to back, in order, in ``capacity`` slots."""
    total = 0
    for n, size in enumerate(sizes):
        total += size
        if total > capacity:
            return n
    return len(sizes)


def test_lesson_workload_fcfs_admission() -> None:
    capacity = LESSON["num_blocks"] * LESSON["block_size"]
    finals = [p + o for p, o in LESSON_REQUESTS]
    admitted: dict[tuple[Placement, Reservation], int] = {}
    for placement, reservation in VARIANTS:
        a = make(placement, reservation, **LESSON)
        n = admit_fcfs(a)
        admitted[placement, reservation] = n
        u = a.usage(waiting_for_memory=n < len(LESSON_REQUESTS))
        assert u.token_states == sum(p for p, _ in LESSON_REQUESTS[:n])
        reserved = [a.reservation_for(p + o, p) for p, o in LESSON_REQUESTS]
        if placement is Placement.FIRST_FIT and reservation is not Reservation.SLOTS:
            # No frees yet: first fit packs regions back to back.
            assert n == packed_count(reserved, capacity)
        else:  # a block or slot holds at least R, so it admits no more than packing R
            assert n <= packed_count(reserved, capacity)
        # Every admitted request runs to its final length without asking for more memory.
        for i, (_prompt, output) in enumerate(LESSON_REQUESTS[:n]):
            assert a.append_slots(i, output) == []
        u = a.usage()
        assert u.token_states == sum(finals[:n])
        assert u.reservation == 0
        a.check_integrity()

    ff, buddy = Placement.FIRST_FIT, Placement.BUDDY
    mml = LESSON["max_model_len"]
    assert admitted[ff, Reservation.SLOTS] == capacity // mml
    assert admitted[ff, Reservation.MAX] == capacity // mml
    assert (
        admitted[ff, Reservation.ORACLE]
        >= admitted[ff, Reservation.POW2]
        >= admitted[ff, Reservation.MAX]
    )
    for reservation in (Reservation.MAX, Reservation.POW2, Reservation.ORACLE):
        assert admitted[buddy, reservation] <= admitted[ff, reservation]
    assert admitted[buddy, Reservation.ORACLE] >= admitted[buddy, Reservation.POW2]
    assert admitted[ff, Reservation.ORACLE] > admitted[ff, Reservation.MAX]  # the point

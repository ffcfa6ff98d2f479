"""MemoryUsage: the categories partition the capacity; the ratios follow their definitions."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given

from pagedkv.errors import IntegrityError
from pagedkv.memory.usage import MemoryUsage, categories


@given(
    st.integers(1, 10_000).flatmap(
        lambda c: st.tuples(
            st.just(c), st.integers(0, c), st.integers(0, c), st.integers(0, c), st.booleans()
        )
    )
)
def test_from_books_partitions_capacity(args: tuple[int, int, int, int, bool]) -> None:
    c, t, r, i, waiting = args
    if t + r + i > c:
        with pytest.raises(IntegrityError):
            MemoryUsage.from_books(c, t, r, i, waiting)
        return
    u = MemoryUsage.from_books(c, t, r, i, waiting)
    assert u.allocated == t + r + i
    assert u.unallocated == c - u.allocated
    assert (u.external_fragmentation > 0) <= waiting
    assert (u.free > 0) <= (not waiting)
    # The bare categories (for callers that build no MemoryUsage) are the very same numbers.
    assert categories(c, t, r, i, waiting) == (
        u.token_states,
        u.reservation,
        u.internal_fragmentation,
        u.external_fragmentation,
        u.free,
    )
    assert u.pool_occupancy == pytest.approx(u.allocated / c)
    assert 0 <= u.token_utilization <= 1
    f = u.fractions()
    parts = ["token_states", "reservation", "internal_fragmentation"]
    assert sum(f[k] for k in [*parts, "external_fragmentation", "free"]) == pytest.approx(1.0)


def test_empty_allocation_wastes_nothing() -> None:
    u = MemoryUsage.from_books(100, 0, 0, 0, False)
    assert u.token_utilization == 1.0
    assert u.pool_occupancy == 0.0


def test_negative_category_is_an_integrity_error() -> None:
    with pytest.raises(IntegrityError):
        MemoryUsage(10, 11, -1, 0, 0, 0)


@given(
    st.integers(0, 100),
    st.integers(0, 100),
    st.integers(0, 100),
    st.integers(0, 100),
    st.integers(0, 100),
    st.booleans(),
)
def test_allocator_convention_moves_the_rounding_to_external(
    t: int, r: int, i: int, free: int, rounding: int, waiting: bool
) -> None:
    """Both conventions split the same slots: the rounding leaves internal fragmentation and
    joins external fragmentation; more rounding than internal fragmentation is refused."""
    c = t + r + i + free
    if c == 0:
        return
    if rounding > i:
        with pytest.raises(IntegrityError, match="rounding"):
            MemoryUsage.from_books(c, t, r, i, waiting, rounding)
        return
    u = MemoryUsage.from_books(c, t, r, i, waiting, rounding)
    assert u.internal_fragmentation_allocator_convention == i - rounding
    assert u.external_fragmentation_allocator_convention == u.external_fragmentation + rounding
    assert MemoryUsage.from_books(c, t, r, i, waiting).allocator_rounding == 0

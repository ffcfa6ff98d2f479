"""KVCacheManager: can/do pairs, growth, fork and copy-on-write, swap, accounting, errors."""

from __future__ import annotations

from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.errors import ConfigError, UnknownSequenceError
from pagedkv.memory.block_table import cdiv
from pagedkv.memory.interface import AllocStatus, KVAllocator
from tests.factories import BLOCK_SIZES, make_manager, make_request


def test_manager_is_a_kv_allocator() -> None:
    assert isinstance(make_manager(), KVAllocator)


@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_allocate_takes_blocks_for_the_prompt_only(bs: int) -> None:
    m = make_manager(bs, 64)
    req = make_request(0, prompt_len=3 * bs + 1, output_len=40)
    assert m.can_allocate(req.seq_id, req.prompt_len, final_len=req.final_len) is AllocStatus.OK
    assert m.allocate(req.seq_id, req.prompt_len, final_len=req.final_len) == 0
    assert m.num_free_blocks == 64 - cdiv(req.prompt_len, bs)
    assert m.num_tokens(0) == req.prompt_len
    m.check_integrity()


@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_never_later_ok(bs: int) -> None:
    m = make_manager(bs, 10, watermark=0.2)  # 2 watermark blocks
    assert m.can_allocate("big", 9 * bs) is AllocStatus.NEVER  # 10 - 9 < 2
    assert m.can_allocate("long", bs, final_len=11 * bs) is AllocStatus.NEVER
    assert m.can_allocate("ok", 8 * bs) is AllocStatus.OK
    assert m.allocate("x", 5 * bs) == 0
    assert m.can_allocate("later", 4 * bs) is AllocStatus.LATER  # would leave 1 < 2
    assert m.can_allocate("fits", 3 * bs) is AllocStatus.OK
    # can_allocate never changes state
    assert m.num_free_blocks == 5


@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_no_room_returns_none_and_changes_nothing(bs: int) -> None:
    m = make_manager(bs, 4)
    assert m.allocate("a", 3 * bs) == 0
    before = (m.num_free_blocks, m.usage(), m.stats)
    assert m.allocate("b", 2 * bs) is None
    assert not m.has_seq("b")
    m.append_slots("a", bs)  # takes the last block
    assert m.append_slots("a", 1) is None
    assert m.num_tokens("a") == 4 * bs
    assert before[0] - 1 == m.num_free_blocks
    m.check_integrity()


@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_append_grows_one_block_at_each_boundary(bs: int) -> None:
    m = make_manager(bs, 64)
    m.allocate(1, 1)
    for t in range(2, 5 * bs):
        assert m.append_slots(1) == []
        assert len(m.block_ids(1)) == cdiv(t, bs)
        m.check_integrity()


@pytest.mark.parametrize("bs", [2, 16, 7])
def test_fork_then_copy_on_write(bs: int) -> None:
    m = make_manager(bs, 16)
    m.allocate("p", bs + 1, final_len=4 * bs)
    used = 16 - m.num_free_blocks
    assert m.fork("p", "c") == []
    assert 16 - m.num_free_blocks == used  # sharing costs nothing
    shared = m.block_ids("p")[-1]
    copies = m.append_slots("c", 1)
    assert copies is not None
    assert [(c.src) for c in copies] == [shared]
    assert m.block_ids("c")[-1] == copies[0].dst
    assert m.stats.cow_copies == 1
    m.check_integrity()


@pytest.mark.parametrize("bs", [2, 16, 7])
def test_copy_on_write_needs_a_free_block(bs: int) -> None:
    m = make_manager(bs, 2)
    m.allocate("p", bs + 1)
    m.fork("p", "c")
    assert m.append_slots("c", 1) is None  # the copy has no block to go to
    m.check_integrity()


@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_shared_slots_count_once(bs: int) -> None:
    m = make_manager(bs, 32)
    m.allocate("p", 2 * bs + 1, final_len=3 * bs)
    before = m.usage()
    m.fork("p", "c", final_len=3 * bs)
    assert m.usage() == before
    m.check_integrity()


@pytest.mark.parametrize("bs", [4, 16, 7])
def test_categories_of_a_partial_block(bs: int) -> None:
    m = make_manager(bs, 10)
    # 1 token in a block, the request ends after 2 tokens: 1 reserved, bs - 2 never filled
    m.allocate("r", 1, final_len=2)
    u = m.usage()
    assert (u.token_states, u.reservation, u.internal_fragmentation) == (1, 1, bs - 2)
    assert u.free == 9 * bs
    waiting = m.usage(waiting_for_memory=True)
    assert (waiting.external_fragmentation, waiting.free) == (9 * bs, 0)
    assert u.token_utilization == pytest.approx(1 / bs)
    assert u.pool_occupancy == pytest.approx(0.1)


@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_free_returns_every_block(bs: int) -> None:
    m = make_manager(bs, 32)
    for i in range(4):
        m.allocate(i, 2 * bs + i)
    m.fork(0, "f")
    for s in [0, 1, 2, 3, "f"]:
        m.free(s)
        m.check_integrity()
    assert m.num_free_blocks == 32
    assert m.usage().free == m.capacity


@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_swap_out_and_in_round_trip(bs: int) -> None:
    m = make_manager(bs, 8, num_cpu_blocks=8)
    m.allocate("a", 3 * bs - 1, final_len=3 * bs)
    before = m.usage()
    gpu_blocks = m.block_ids("a")
    assert m.can_swap_out(["a"])
    out = m.swap_out(["a"])
    assert out is not None
    assert [o.src for o in out] == gpu_blocks
    assert m.is_swapped("a")
    assert not m.has_seq("a")
    assert m.num_free_blocks == 8
    assert m.stats.num_free_cpu_blocks == 8 - len(gpu_blocks)
    m.check_integrity()
    assert m.can_swap_in(["a"]) is AllocStatus.OK
    back = m.swap_in(["a"])
    assert back is not None
    assert [b.src for b in back] == [o.dst for o in out]
    assert m.block_ids("a") == [b.dst for b in back]
    assert m.usage() == before
    assert m.stats.num_free_cpu_blocks == 8
    m.check_integrity()


@pytest.mark.parametrize("bs", [2, 16, 7])
def test_swapping_a_group_keeps_its_sharing(bs: int) -> None:
    m = make_manager(bs, 8, num_cpu_blocks=8)
    m.allocate("p", 2 * bs + 1)
    m.fork("p", "c")
    out = m.swap_out(["p", "c"])
    assert out is not None
    assert len(out) == 3  # shared blocks move once
    assert m.block_ids("p") == m.block_ids("c")
    back = m.swap_in(["p", "c"])
    assert back is not None
    assert len(back) == 3
    assert m.block_ids("p") == m.block_ids("c")
    m.check_integrity()


@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_swap_needs_room(bs: int) -> None:
    m = make_manager(bs, 8, num_cpu_blocks=2)
    m.allocate("a", 3 * bs)
    assert not m.can_swap_out(["a"])
    assert m.swap_out(["a"]) is None
    assert m.has_seq("a")
    m2 = make_manager(bs, 4, num_cpu_blocks=4)
    m2.allocate("a", 3 * bs)
    m2.swap_out(["a"])
    m2.allocate("b", 2 * bs)
    assert m2.can_swap_in(["a"]) is AllocStatus.LATER
    assert m2.swap_in(["a"]) is None
    assert m2.is_swapped("a")
    m2.free("a")  # a swapped sequence can be freed where it is
    assert m2.stats.num_free_cpu_blocks == 4
    m2.check_integrity()


def test_misuse_raises_clear_errors() -> None:
    m = make_manager(4, 8, num_cpu_blocks=4)
    m.allocate("a", 4)
    with pytest.raises(UnknownSequenceError, match="already allocated"):
        m.allocate("a", 4)
    with pytest.raises(UnknownSequenceError, match="'zzz'"):
        m.append_slots("zzz")
    with pytest.raises(ConfigError, match="num_tokens"):
        m.allocate("b", -1)
    with pytest.raises(ConfigError, match="token_ids"):
        m.allocate("b", 5, token_ids=[1, 2])
    m.swap_out(["a"])
    with pytest.raises(UnknownSequenceError, match="swapped out"):
        m.append_slots("a")


@given(
    bs=st.sampled_from(BLOCK_SIZES),
    num_blocks=st.integers(1, 40),
    watermark=st.sampled_from([0.0, 0.01, 0.1, 0.3, 0.6]),
    prompt_blocks=st.integers(1, 50),
    extra=st.integers(0, 800),
)
@settings(max_examples=200, deadline=None)
def test_never_reason_names_the_watermark_exactly_when_it_is_the_cause(
    bs: int, num_blocks: int, watermark: float, prompt_blocks: int, extra: int
) -> None:
    """Differential: the reason blames the watermark iff the same pool without one would
    admit the request; otherwise it names the cache size."""
    m = make_manager(bs, num_blocks, watermark=watermark)
    prompt = prompt_blocks * bs - (bs // 2)
    final = prompt + extra
    if m.can_allocate("r", prompt, final_len=final) is not AllocStatus.NEVER:
        return
    reason = m.never_reason(prompt, final_len=final)
    without = make_manager(bs, num_blocks, watermark=0.0)
    blamed = "watermark" in reason
    assert blamed == (without.can_allocate("r", prompt, final_len=final) is not AllocStatus.NEVER)
    assert ("can never hold it" in reason) != blamed
    assert str(num_blocks) in reason
    m.check_integrity()
    assert m.num_free_blocks == num_blocks  # explaining changes nothing


# ----- a failed call changes nothing (issue 17, defect 7; the state machine makes many more) --
def test_float_token_ids_take_no_block() -> None:
    m = make_manager(4, 8, prefix_caching=True)
    with pytest.raises(ConfigError, match="token_ids"):
        m.allocate(1, 4, token_ids=cast(Any, [1.5] * 4))
    assert m.num_free_blocks == 8
    assert not m.has_seq(1)
    m.check_integrity()


def test_a_fractional_append_is_refused() -> None:
    m = make_manager(4, 8, prefix_caching=True)
    m.allocate(1, 3, token_ids=[1, 2, 3])
    with pytest.raises(ConfigError, match="num_tokens"):
        m.append_slots(1, 1.5)  # type: ignore[arg-type]
    assert m.num_tokens(1) == 3
    m.check_integrity()


def test_final_len_below_the_tokens_is_refused() -> None:
    m = make_manager(4, 8)
    for call in (m.can_allocate, m.allocate):
        with pytest.raises(ConfigError, match="final_len"):
            call(1, 5, final_len=3)
    assert m.num_free_blocks == 8


def test_a_repeated_id_in_a_swap_is_a_clear_error() -> None:
    m = make_manager(4, 8, num_cpu_blocks=8)
    m.allocate("a", 3)
    with pytest.raises(ConfigError, match="seq_ids: got 'a'; must name each sequence once"):
        m.swap_out(["a", "a"])
    assert m.has_seq("a")
    assert not m.is_swapped("a")
    m.check_integrity()


def test_numpy_integers_count_bools_do_not() -> None:
    np = pytest.importorskip("numpy")
    m = make_manager(4, 8)
    assert m.allocate(1, np.int64(10), final_len=np.int64(12)) == 0
    assert m.append_slots(1, np.int32(2)) is not None
    assert type(m.num_tokens(1)) is int
    assert m.num_tokens(1) == 12
    m.check_integrity()
    with pytest.raises(ConfigError, match="num_tokens"):
        m.allocate(2, True)

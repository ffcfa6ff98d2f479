"""PagedKVCache: write/gather round-trips, copy-on-write, swap, shape validation."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("torch")

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.memory.interface import BlockCopy, SwapMapping
from pagedkv.tensors.kv_cache import PagedKVCache, slot_mapping
from tests.factories import make_manager

SETTINGS = settings(max_examples=50, deadline=None)


def _randomize(cache: PagedKVCache, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    for t in (*cache.k_caches, *cache.v_caches, *cache.cpu_k_caches, *cache.cpu_v_caches):
        t.copy_(torch.rand(t.shape, generator=g, dtype=torch.float64).to(t.dtype))


def test_shapes_and_zeroed() -> None:
    cache = PagedKVCache(3, 5, 4, 2, 8, num_cpu_blocks=2, dtype=torch.float64)
    assert len(cache.k_caches) == len(cache.v_caches) == 3
    assert len(cache.cpu_k_caches) == len(cache.cpu_v_caches) == 3
    for t in (*cache.k_caches, *cache.v_caches):
        assert t.shape == (5, 4, 2, 8)
        assert t.dtype == torch.float64
        assert not t.any()
    for t in (*cache.cpu_k_caches, *cache.cpu_v_caches):
        assert t.shape == (2, 4, 2, 8)
        assert t.device.type == "cpu"
    assert cache.num_slots == 20
    assert cache.bytes_per_block == 2 * 3 * 4 * 2 * 8 * 8


def test_slot_mapping_follows_the_block_table() -> None:
    # block_size 2, blocks [3, 1]: positions 1, 2, 3 -> block 3 offset 1, block 1 offsets 0, 1
    assert slot_mapping([3, 1], 1, 4, 2).tolist() == [7, 2, 3]
    assert slot_mapping([3, 1], 2, 2, 2).tolist() == []
    assert slot_mapping([], 0, 0, 16).tolist() == []
    assert slot_mapping([5], 0, 3, 16).dtype == torch.long
    with pytest.raises(ValueError, match=r"^start/end"):
        slot_mapping([3, 1], 0, 5, 2)
    with pytest.raises(ValueError, match=r"^start/end"):
        slot_mapping([3, 1], 2, 1, 2)
    with pytest.raises(ValueError, match=r"^block_size"):
        slot_mapping([3, 1], 0, 1, 0)


@st.composite
def _layouts(draw: st.DrawFn) -> tuple[int, int, int, int, list[int], list[list[int]]]:
    """(num_layers, block_size, kv_heads, head_dim, seq lens, shuffled block tables)."""
    num_layers = draw(st.integers(1, 2))
    block_size = draw(st.sampled_from([1, 7, 16]))
    kv_heads = draw(st.integers(1, 2))
    head_dim = draw(st.sampled_from([8, 16]))
    lens = draw(st.lists(st.integers(0, 40), min_size=1, max_size=4))
    needed = [-(-n // block_size) for n in lens]
    num_blocks = sum(needed) + draw(st.integers(1, 3))
    perm = draw(st.permutations(range(num_blocks)))
    tables, at = [], 0
    for n in needed:
        tables.append(list(perm[at : at + n]))
        at += n
    return num_layers, block_size, kv_heads, head_dim, lens, tables


@SETTINGS
@given(layout=_layouts(), data=st.data())
def test_write_then_gather_round_trips(
    layout: tuple[int, int, int, int, list[int], list[list[int]]], data: st.DataObject
) -> None:
    num_layers, bs, kvh, hd, lens, tables = layout
    num_blocks = 1 + max((b for t in tables for b in t), default=0)
    cache = PagedKVCache(num_layers, num_blocks, bs, kvh, hd)
    _randomize(cache, seed=1)  # garbage everywhere: gather must read only what was written
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    written: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    for layer in range(num_layers):
        for i, (n, table) in enumerate(zip(lens, tables, strict=True)):
            k, v = torch.randn(2, n, kvh, hd, generator=g)
            # write in chunks, as chunked prefill and decode do
            cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=3)))
            bounds = [0, *cuts, n]
            for start, end in itertools.pairwise(bounds):
                slots = slot_mapping(table, start, end, bs)
                cache.write(layer, slots, k[start:end], v[start:end])
            written[layer, i] = (k, v)
    for (layer, i), (k, v) in written.items():
        got_k, got_v = cache.gather(layer, tables[i], lens[i])
        assert got_k.shape == (lens[i], kvh, hd)
        torch.testing.assert_close(got_k, k, atol=0, rtol=0)
        torch.testing.assert_close(got_v, v, atol=0, rtol=0)
        # the slots of sequence i in the flat view hold its K/V too
        slots = slot_mapping(tables[i], 0, lens[i], bs)
        flat = cache.k_caches[layer].view(-1, kvh, hd)
        torch.testing.assert_close(flat[slots], k, atol=0, rtol=0)


def test_copy_blocks_copies_every_layer_and_nothing_else() -> None:
    cache = PagedKVCache(3, 6, 4, 2, 8)
    _randomize(cache)
    before_k = [t.clone() for t in cache.k_caches]
    before_v = [t.clone() for t in cache.v_caches]
    # all copies read the blocks as they were before any of them: block 2 gets the old block 1
    cache.copy_blocks([BlockCopy(0, 1), BlockCopy(1, 2), BlockCopy(0, 5)])
    for now, old in zip((*cache.k_caches, *cache.v_caches), (*before_k, *before_v), strict=True):
        assert torch.equal(now[1], old[0])
        assert torch.equal(now[2], old[1])
        assert torch.equal(now[5], old[0])
        for b in (0, 3, 4):
            assert torch.equal(now[b], old[b])
    cache.copy_blocks([])  # nothing to do


def test_swap_out_then_in_round_trips_through_the_cpu_pool() -> None:
    cache = PagedKVCache(2, 6, 4, 2, 8, num_cpu_blocks=3)
    _randomize(cache, seed=3)
    blocks = {b: (cache.k_caches[1][b].clone(), cache.v_caches[1][b].clone()) for b in (4, 0, 2)}
    cache.swap_out([SwapMapping(4, 0), SwapMapping(0, 2), SwapMapping(2, 1)])
    assert torch.equal(cache.cpu_k_caches[1][0], blocks[4][0])
    assert torch.equal(cache.cpu_v_caches[1][2], blocks[0][1])
    for t in (*cache.k_caches, *cache.v_caches):
        t.zero_()  # the GPU blocks get reused meanwhile
    cache.swap_in([SwapMapping(0, 5), SwapMapping(2, 3), SwapMapping(1, 1)])
    for layer_k, layer_v, layer_cpu_k in zip(
        cache.k_caches, cache.v_caches, cache.cpu_k_caches, strict=True
    ):
        assert torch.equal(layer_k[5], layer_cpu_k[0])
        assert layer_v[0].abs().sum() == 0  # untouched
    assert torch.equal(cache.k_caches[1][5], blocks[4][0])
    assert torch.equal(cache.v_caches[1][3], blocks[0][1])
    assert torch.equal(cache.k_caches[1][1], blocks[2][0])
    cache.swap_out([])
    cache.swap_in([])


@pytest.mark.parametrize("block_size", [1, 7, 16])
def test_the_managers_copies_and_swaps_keep_every_sequences_kv(block_size: int) -> None:
    """Fork, copy-on-write, swap out and back in, as the memory manager decides: each sequence
    still reads its own K/V through its block table."""
    kvh, hd = 2, 8
    m = make_manager(block_size, 32, num_cpu_blocks=32)
    cache = PagedKVCache(2, 32, block_size, kvh, hd, num_cpu_blocks=32)
    g = torch.Generator().manual_seed(7)
    truth: dict[str, torch.Tensor] = {}  # seq -> [layers, 2, tokens, kvh, hd]

    def write(seq: str, start: int, end: int) -> None:
        new = torch.randn(2, 2, end - start, kvh, hd, generator=g)
        slots = slot_mapping(m.block_ids(seq), start, end, block_size)
        for layer in range(2):
            cache.write(layer, slots, new[layer, 0], new[layer, 1])
        old = truth.get(seq, torch.empty(2, 2, 0, kvh, hd))
        truth[seq] = torch.cat([old, new], dim=2)

    def check() -> None:
        for seq, kv in truth.items():
            for layer in range(2):
                k, v = cache.gather(layer, m.block_ids(seq), m.num_tokens(seq))
                assert torch.equal(k, kv[layer, 0]), seq
                assert torch.equal(v, kv[layer, 1]), seq

    prompt = 2 * block_size + block_size // 2 + 1
    assert m.allocate("a", prompt) == 0
    write("a", 0, prompt)
    assert m.fork("a", "b") == []
    truth["b"] = truth["a"].clone()
    for seq in ("a", "b"):  # the first append into the shared last block copies it
        copies = m.append_slots(seq, 1)
        assert copies is not None
        cache.copy_blocks(copies)
        write(seq, prompt, prompt + 1)
    check()
    mappings = m.swap_out(["a", "b"])
    assert mappings
    cache.swap_out(mappings)
    assert m.allocate("c", 3 * block_size) == 0  # reuses the freed GPU blocks
    write("c", 0, 3 * block_size)
    back = m.swap_in(["a", "b"])
    assert back
    cache.swap_in(back)
    check()


def test_constructor_validates_each_argument() -> None:
    for i, name in enumerate(
        ["num_layers", "num_blocks", "block_size", "num_kv_heads", "head_dim"]
    ):
        args = [1, 2, 4, 1, 8]
        args[i] = 0
        with pytest.raises(ValueError, match=rf"^{name}"):
            PagedKVCache(*args)
    with pytest.raises(ValueError, match=r"^num_cpu_blocks"):
        PagedKVCache(1, 2, 4, 1, 8, num_cpu_blocks=-1)
    with pytest.raises(ValueError, match=r"^dtype"):
        PagedKVCache(1, 2, 4, 1, 8, dtype=torch.int32)


def test_write_gather_and_moves_validate_their_arguments() -> None:
    cache = PagedKVCache(2, 3, 4, 2, 8, num_cpu_blocks=1)
    slots = torch.tensor([0, 5])
    kv = torch.zeros(2, 2, 8)
    with pytest.raises(ValueError, match=r"^layer"):
        cache.write(2, slots, kv, kv)
    with pytest.raises(ValueError, match=r"^slot_mapping"):
        cache.write(0, slots.view(1, 2), kv, kv)
    with pytest.raises(ValueError, match=r"^slot_mapping"):
        cache.write(0, slots.float(), kv, kv)
    with pytest.raises(ValueError, match=r"^slot_mapping"):
        cache.write(0, torch.tensor([0, 12]), kv, kv)
    with pytest.raises(ValueError, match=r"^k:"):
        cache.write(0, slots, torch.zeros(2, 1, 8), kv)
    with pytest.raises(ValueError, match=r"^v:"):
        cache.write(0, slots, kv, torch.zeros(3, 2, 8))
    with pytest.raises(ValueError, match=r"^v:"):
        cache.write(0, slots, kv, kv.double())
    with pytest.raises(ValueError, match=r"^block_table"):
        cache.gather(0, [0], 5)
    with pytest.raises(ValueError, match=r"^block_table"):
        cache.gather(0, [3], 1)
    with pytest.raises(ValueError, match=r"^num_tokens"):
        cache.gather(0, [0], -1)
    with pytest.raises(ValueError, match=r"^copies"):
        cache.copy_blocks([BlockCopy(0, 3)])
    with pytest.raises(ValueError, match=r"^mappings"):
        cache.swap_out([SwapMapping(0, 1)])  # one CPU block
    with pytest.raises(ValueError, match=r"^mappings"):
        cache.swap_in([SwapMapping(1, 0)])

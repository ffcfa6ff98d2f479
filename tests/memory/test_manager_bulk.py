"""Differential: the bulk append under prefix caching (``append_slots_all`` of k tokens, which
appends each sequence's quiet tokens in one piece) leaves the manager exactly as k rounds of
one ``append_slots`` per sequence do: the same tables, free order, keys, evictions, copies."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.memory.manager import KVCacheManager
from tests.factories import BLOCK_SIZES, make_manager


def _state(m: KVCacheManager, seqs: list[int]) -> dict[str, Any]:
    return {
        "tables": [m.block_ids(s) for s in seqs],
        "tokens": [m.num_tokens(s) for s in seqs],
        "free": m.gpu.free_blocks(),
        "keys": list(m.gpu.block_hash),
        "refs": list(m.gpu.ref_counts),
        "evictions": m.gpu.num_evictions,
        "stats": m.stats,
        "books": m.books(),
    }


@st.composite
def scenes(draw: st.DrawFn) -> dict[str, Any]:
    bs = draw(st.sampled_from(BLOCK_SIZES))
    alphabet = draw(st.sampled_from([2, 10**6]))  # small: siblings write equal blocks
    n_seqs = draw(st.integers(1, 5))
    prompts = []
    for i in range(n_seqs):
        shared = draw(st.integers(0, 3 * bs))
        own = draw(st.integers(1, 2 * bs))
        prompts.append(list(range(shared)) + [10**7 * (i + 1) + k for k in range(own)])
    return {
        "bs": bs,
        "prompts": prompts,
        "dead": draw(st.lists(st.integers(0, n_seqs - 1), unique=True, max_size=n_seqs - 1)),
        "forks": draw(st.lists(st.integers(0, n_seqs - 1), max_size=3)),
        "k": draw(st.integers(2, 3 * bs + 2)),
        "unknown": draw(st.lists(st.booleans(), min_size=n_seqs + 3, max_size=n_seqs + 3)),
        "ids": draw(st.integers(0, 2**31)),
        "alphabet": alphabet,
    }


def _build(scene: dict[str, Any]) -> tuple[KVCacheManager, list[int]] | None:
    """Prompts allocated, some freed (cached free blocks to evict), some forked (shared
    partial blocks: copies on write)."""
    m = make_manager(scene["bs"], 400, prefix_caching=True)
    for i, prompt in enumerate(scene["prompts"]):
        assert m.allocate(i, len(prompt), token_ids=prompt) is not None
    for i in scene["dead"]:
        m.free(i)
    live = [i for i in range(len(scene["prompts"])) if i not in scene["dead"]]
    for j, parent in enumerate(scene["forks"]):
        if parent in live:
            child = 100 + j
            m.fork(parent, child)
            live.append(child)
    return (m, live) if live else None


@settings(max_examples=300, deadline=None)
@given(scenes())
def test_bulk_append_equals_rounds_of_single_appends(scene: dict[str, Any]) -> None:
    built, ref_built = _build(scene), _build(scene)
    if built is None or ref_built is None:
        return
    (m, seqs), (ref, _) = built, ref_built
    k, base = scene["k"], scene["ids"]
    ids = [
        None if scene["unknown"][n] else [(base + 7 * n + r) % scene["alphabet"] for r in range(k)]
        for n, _ in enumerate(seqs)
    ]
    copies = m.append_slots_all(seqs, k, token_ids=ids)
    ref_copies = []
    for r in range(k):
        for s, own in zip(seqs, ids, strict=True):
            got = ref.append_slots(s, 1, token_ids=None if own is None else own[r : r + 1])
            assert got is not None
            ref_copies.extend(got)
    assert copies == ref_copies
    assert _state(m, seqs) == _state(ref, seqs)
    m.check_integrity()

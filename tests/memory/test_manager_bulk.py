"""Differential: the bulk append under prefix caching (``append_slots_all`` of k tokens: all
blocks at once when no key can collide, else round by round with each sequence's quiet tokens
in one piece) leaves the manager exactly as k rounds of one ``append_slots`` per sequence do:
the same tables, free order, keys, evictions, copies; under every eviction policy, with ids as
lists or as runs."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.memory.block_pool import BlockPool
from pagedkv.memory.config import CacheConfig
from pagedkv.memory.eviction import LFUBlockPool, V1BlockPool
from pagedkv.memory.manager import KVCacheManager
from pagedkv.memory.token_runs import TokenRuns
from tests.factories import BLOCK_SIZES

POOLS = {"lru": BlockPool, "lfu": LFUBlockPool, "v1": V1BlockPool}


def _ids(values: list[int], as_runs: bool) -> list[int] | TokenRuns:
    return TokenRuns(range(t, t + 1) for t in values) if as_runs else values


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
        "k": draw(st.integers(1, 3 * bs + 2)),
        "pool": draw(st.sampled_from(sorted(POOLS))),
        "runs": draw(st.booleans()),
        "slack": draw(st.integers(0, 4)),
        "again": draw(st.none() | st.integers(0, 4)),
        "cut": draw(st.integers(1, 4 * bs)),
        "unknown": draw(st.lists(st.booleans(), min_size=n_seqs + 3, max_size=n_seqs + 3)),
        "ids": draw(st.integers(0, 2**31)),
        "alphabet": alphabet,
    }


AGAIN = 200


def _again(scene: dict[str, Any]) -> tuple[list[int], list[int]] | None:
    """A freed sequence's prompt cut in two: the head a new sequence starts with, and the ids
    it then appends (the rest of the prompt), as a recompute after a preemption would."""
    if scene["again"] is None or not scene["dead"]:
        return None
    prompt = scene["prompts"][scene["dead"][scene["again"] % len(scene["dead"])]]
    cut = max(1, min(len(prompt) - 1, scene["cut"]))
    return prompt[:cut], prompt[cut:]


def _build(scene: dict[str, Any]) -> tuple[KVCacheManager, list[int]] | None:
    """Prompts allocated, some freed (cached free blocks to evict), some forked (shared
    partial blocks: copies on write)."""
    config = CacheConfig(num_gpu_blocks=400, block_size=scene["bs"], enable_prefix_caching=True)
    m = KVCacheManager(config, POOLS[scene["pool"]](400, enable_caching=True))
    for i, prompt in enumerate(scene["prompts"]):
        ids = _ids(prompt, scene["runs"])
        assert m.allocate(i, len(prompt), token_ids=ids) is not None
    for i in scene["dead"]:
        m.free(i)
    live = [i for i in range(len(scene["prompts"])) if i not in scene["dead"]]
    again = _again(scene)
    if again is not None:  # a freed prompt's head again: its appended ids meet the old keys
        head, _ = again
        assert m.allocate(AGAIN, len(head), token_ids=_ids(head, scene["runs"])) is not None
        live.append(AGAIN)
    for j, parent in enumerate(scene["forks"]):
        if parent in live:
            child = 100 + j
            m.fork(parent, child)
            live.append(child)
    # A filler takes all but ``slack`` of the uncached free blocks: the append's allocations
    # then evict cached ones (the freed sequences' blocks), where the order matters.
    uncached = m.gpu.num_free - m.gpu.num_cached_free
    if uncached > scene["slack"]:
        assert m.allocate("filler", (uncached - scene["slack"]) * scene["bs"]) is not None
    return (m, live) if live else None


@settings(max_examples=300, deadline=None)
@given(scenes())
def test_bulk_append_equals_rounds_of_single_appends(scene: dict[str, Any]) -> None:
    built, ref_built = _build(scene), _build(scene)
    if built is None or ref_built is None:
        return
    (m, seqs), (ref, _) = built, ref_built
    if not m.can_append_all(seqs, scene["k"]):
        return
    k, base = scene["k"], scene["ids"]
    ids = [
        None
        if scene["unknown"][n]
        else _ids([(base + 7 * n + r) % scene["alphabet"] for r in range(k)], scene["runs"])
        for n, _ in enumerate(seqs)
    ]
    again = _again(scene)
    if again is not None:
        rest = again[1] + [10**8 + r for r in range(k)]
        ids[seqs.index(AGAIN)] = _ids(rest[:k], scene["runs"])
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


def _pair(bs: int, prompt: list[int], outputs: list[int]) -> list[tuple[KVCacheManager, Any]]:
    """Two equal managers holding ``prompt`` as sequence 0 after an earlier run of it (prompt
    then ``outputs``) was freed: its blocks are cached free ones. Each comes with a counter of
    calls into the round-by-round path."""
    out = []
    for _ in range(2):
        whole = prompt + outputs
        blocks = -(-len(whole) // bs)  # the pool holds the earlier run exactly: allocations evict
        m = KVCacheManager(
            CacheConfig(num_gpu_blocks=blocks, block_size=bs, enable_prefix_caching=True)
        )
        assert m.allocate(9, len(whole), token_ids=whole) is not None
        m.free(9)
        assert m.allocate(0, len(prompt), token_ids=prompt) is not None
        calls: list[int] = []
        rounds = m._append_in_rounds

        def spy(*args: Any, rounds: Any = rounds, calls: list[int] = calls) -> Any:
            calls.append(1)
            return rounds(*args)

        m._append_in_rounds = spy  # type: ignore[method-assign, assignment]
        out.append((m, calls))
    return out


def _bulk_against_rounds(bs: int, prompt: list[int], outputs: list[int], new: list[int]) -> int:
    """``new`` appended to sequence 0 in bulk and one token at a time: equal books; returns
    how many times the bulk call took the round-by-round path."""
    (m, calls), (ref, _) = _pair(bs, prompt, outputs)
    assert m.append_slots_all([0], len(new), token_ids=[new]) == []
    for r in range(len(new)):
        assert ref.append_slots(0, 1, token_ids=new[r : r + 1]) == []
    assert _state(m, [0]) == _state(ref, [0])
    m.check_integrity()
    return len(calls)


def test_new_keys_take_the_blocks_at_once() -> None:
    """Ids no cached block holds: no key can collide, so the blocks are taken at once."""
    prompt, outputs = list(range(20)), list(range(100, 140))
    assert _bulk_against_rounds(8, prompt, outputs, list(range(500, 540))) == 0


def test_a_recomputed_sequence_meeting_its_old_keys_goes_round_by_round() -> None:
    """A sequence recomputes the outputs it had before it was freed: the keys its blocks fill
    with are held by its old, cached free blocks, which the window's allocations may evict
    first. Then the order matters, and the bulk append keeps the rounds' order."""
    prompt, outputs = list(range(20)), list(range(100, 140))
    assert _bulk_against_rounds(8, prompt, outputs, outputs) == 1

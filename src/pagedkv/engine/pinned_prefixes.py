"""Explicit prefix sharing at engine build: find a workload's shared prefixes, register them
with the memory manager (pinned blocks), and charge their prefill once.

The prefixes are the workload's own: the distinct ``prefix_id`` values (other than ``private``)
of its requests, each with its first ``prefix_len`` token ids (``workloads/token_ids``); a
workload without the columns registers nothing. Their prefill is one batched prefill at t = 0,
before any request: the clock starts after it (docs/sharing.md, "Explicit (pinned) prefixes").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pagedkv.engine.batch_shape import BatchShape
from pagedkv.engine.clock import to_seconds
from pagedkv.engine.cost_model import CostModel
from pagedkv.engine.executor import SimExecutor
from pagedkv.engine.ledger import Span
from pagedkv.engine.policies import SCHEDULERS
from pagedkv.engine.policies.contiguous import ContiguousScheduler
from pagedkv.errors import ConfigError
from pagedkv.memory.interface import KVAllocator
from pagedkv.memory.manager import KVCacheManager
from pagedkv.workloads.spec import RequestSpec

if TYPE_CHECKING:
    from pagedkv.engine.engine import Engine

FIELD = "enable_pinned_prefixes"


def check_policy(scheduler: str, kv: KVAllocator | None = None) -> None:
    """Explicit mode needs paged memory: a contiguous region cannot share part of itself.

    Checked by name at config time and, for a custom policy, by its allocator at build time.
    """
    cls = SCHEDULERS.get(scheduler)
    contiguous = cls is not None and issubclass(cls, ContiguousScheduler)
    if contiguous or (kv is not None and not isinstance(kv, KVCacheManager)):
        paged = sorted(n for n, c in SCHEDULERS.items() if not issubclass(c, ContiguousScheduler))
        raise ConfigError(
            FIELD,
            True,
            f"needs a paged policy ({', '.join(paged)}); scheduler {scheduler!r} keeps each "
            "request in one contiguous region, which cannot share blocks",
        )


def workload_prefixes(specs: Iterable[RequestSpec]) -> dict[str, tuple[int, ...]]:
    """``prefix_id`` -> the prefix's token ids, in order of first appearance.

    A prompt no longer than its prefix carries only its first prompt_len - 1 tokens (its last
    is its own, ``token_ids.with_prefix_ids``); the longest one seen is the prefix (all must
    agree where they overlap, or the ids are not one prefix).
    """
    found: dict[str, tuple[int, ...]] = {}
    for r in specs:
        extra = dict(r.extra)
        label = extra.get("prefix_id")
        if label is None or label == "private" or r.token_ids is None:
            continue
        length = int(extra.get("prefix_len", "0"))
        ids = tuple(r.token_ids[: min(length, len(r.token_ids) - 1)])
        have = found.get(label, ())
        short, long_ = sorted((have, ids), key=len)
        if long_[: len(short)] != short:
            raise ConfigError(
                f"request {r.request_id}: prefix_id",
                label,
                "must name one prefix: its token ids differ from another request's",
            )
        found[label] = long_
    return {k: v for k, v in found.items() if v}


@dataclass(frozen=True)
class PinnedSetup:
    """What registration did: prefixes, blocks and tokens pinned, and the one-off prefill."""

    num_prefixes: int
    blocks: int
    tokens: int
    prefill_ticks: int  # the clock's (``clock.py``)

    @property
    def prefill_time(self) -> float:
        """``prefill_ticks`` in seconds."""
        return to_seconds(self.prefill_ticks)


def register_workload_prefixes(kv: KVCacheManager, specs: Iterable[RequestSpec]) -> None:
    """Register every shared prefix of ``specs`` with ``kv`` (pinned blocks). Raises
    ``ConfigError`` when they do not fit in the pool above the watermark."""
    for label, ids in workload_prefixes(specs).items():
        kv.register_prefix(label, ids)


def pinned_setup(kv: KVCacheManager, cost: CostModel | None) -> PinnedSetup:
    """The registered prefixes of ``kv``, and the cost model's time for one batched prefill of
    all of them (nothing cached; 0 without a cost model: a real executor)."""
    prefixes = kv.pinned_prefixes()
    shape = BatchShape.from_chunks((p.num_tokens, 0) for p in prefixes)
    return PinnedSetup(
        num_prefixes=len(prefixes),
        blocks=kv.num_pinned_blocks,
        tokens=sum(p.num_tokens for p in prefixes),
        prefill_ticks=cost.step_ticks(shape) if prefixes and cost is not None else 0,
    )


def account_prefill(engine: Engine, setup: PinnedSetup) -> None:
    """Start the clock after the prefixes' prefill: one busy iteration holding only the pins."""
    if not setup.prefill_ticks:
        return
    kv = engine.scheduler.kv
    saved = kv.blocks_saved_by_sharing
    engine.ledger.add(Span.of_round(setup.prefill_ticks, kv.usage(), 0, 0, saved))
    engine.ledger.advance(setup.prefill_ticks)


def pinned_summary(engine: Engine) -> dict[str, Any]:
    """``summary["pinned"]``: prefixes, blocks and tokens pinned, the one-off prefill time
    (0 unless the executor is simulated), and hit_tokens: prompt tokens served from pinned
    prefixes (``summary["prefix_cache"]`` has the same count with the tokens looked up)."""
    kv = engine.scheduler.kv
    if not isinstance(kv, KVCacheManager):
        return {"prefixes": 0, "blocks": 0, "tokens": 0, "prefill_time": 0.0, "hit_tokens": 0}
    executor = engine.executor
    setup = pinned_setup(kv, executor.cost_model if isinstance(executor, SimExecutor) else None)
    return {
        "prefixes": setup.num_prefixes,
        "blocks": setup.blocks,
        "tokens": setup.tokens,
        "prefill_time": setup.prefill_time,
        "hit_tokens": kv.stats.prefix_hit_tokens,
    }

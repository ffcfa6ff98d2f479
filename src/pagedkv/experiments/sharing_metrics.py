"""The raw columns the sharing experiments read from a run's summary, besides ``metrics.py``'s.

Registered into ``metrics.METRICS`` when this module is imported (the sharing experiments
import it; a forked worker process inherits the registration, and ``workers=1`` runs in
process).

* ``prefix_hit_rate``: the prefix cache's hit tokens over the prompt tokens it looked up
  (``summary["prefix_cache"]``); 0 without caching. Recompute after a preemption looks the
  request's own blocks up again, so it can hit even when nothing is shared.
* ``saved_fraction`` (**blocks saved**, the one definition, the engine's
  ``summary["sharing"]``): time-averaged saved / (saved + allocated) blocks, where saved =
  block references - blocks in use, i.e. the share of the memory a run without sharing would
  need that sharing saves (the vLLM paper's "memory saving", §6.3-6.4); ``saved_blocks`` the
  time-averaged saved blocks themselves.
* ``blocks_per_running``: time-averaged allocated blocks over the mean running requests,
  pool_occupancy x num_gpu_blocks / mean_running: the KV memory one running request costs, to
  compare settings (caching on / off, contiguous) at equal load.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pagedkv.experiments.metrics import METRICS

Summary = Mapping[str, Any]


def _cache(name: str) -> Callable[[Summary], float]:
    def read(s: Summary) -> float:
        block = s.get("prefix_cache") or {}
        return float(block.get(name, 0))

    return read


def _sharing(name: str) -> Callable[[Summary], float]:
    def read(s: Summary) -> float:
        block = s.get("sharing") or {}
        return float(block.get(name, 0.0))

    return read


def blocks_per_running(s: Summary) -> float | None:
    """pool_occupancy x num_gpu_blocks / mean_running (None when nothing ran)."""
    running = float(s["mean_running"])
    if running <= 0:
        return None
    return float(s["memory"]["pool_occupancy"]) * int(s["num_gpu_blocks"]) / running


def ttft_mean(s: Summary) -> float | None:
    block = s["ttft"]
    return None if block is None else float(block["mean"])


SHARING_METRICS: dict[str, tuple[Callable[[Summary], Any], str]] = {
    "prefix_hit_rate": (_cache("hit_rate"), "hit / looked-up tokens"),
    "prefix_hit_tokens": (_cache("hit_tokens"), "tokens"),
    "prefix_evictions": (_cache("evictions"), "blocks"),
    "saved_fraction": (_sharing("saved_fraction"), "saved / needed without sharing"),
    "saved_blocks": (_sharing("saved_blocks"), "blocks"),
    "blocks_per_running": (blocks_per_running, "blocks / running request"),
    "ttft_mean": (ttft_mean, "s"),
}
for _name, _reader in SHARING_METRICS.items():
    METRICS.setdefault(_name, _reader)

"""Every contiguous variant, by policy name (all built in: ``pagedkv.engine.policies``)."""

from __future__ import annotations

CONTIGUOUS_VARIANTS = (
    "contiguous-slots",
    "firstfit-max",
    "firstfit-pow2",
    "firstfit-oracle",
    "orca-max",
    "orca-pow2",
    "orca-oracle",
)
"""Every contiguous variant: the lesson's fixed slots, then first-fit and buddy (Orca) x
max / pow2 / oracle reservations."""

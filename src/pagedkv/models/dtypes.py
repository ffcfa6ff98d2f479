"""The data types a model is served in: vLLM's ``--dtype`` (weights and activations) and
``--kv-cache-dtype`` (the cached K/V), with vLLM's names and defaults.

``serving_model`` applies them to a ModelSpec: its weight bytes (capacity, the roofline's
weight stream) and its K/V bytes per token (capacity, swap blocks, the roofline's K/V reads
and writes) follow.
"""

from __future__ import annotations

import dataclasses
import enum

from pagedkv.models.models import ModelSpec


class ModelDType(enum.Enum):
    """vLLM's ``--dtype``: 'auto' serves a 16-bit checkpoint in its own type and a 32-bit one
    in float16 (vLLM's rule); the others force a type."""

    AUTO = "auto"
    HALF = "half"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT = "float"
    FLOAT32 = "float32"

    def bytes_for(self, checkpoint_bytes: int) -> int:
        if self is ModelDType.AUTO:
            return min(checkpoint_bytes, 2)
        return 4 if self in (ModelDType.FLOAT, ModelDType.FLOAT32) else 2


class KVCacheDType(enum.Enum):
    """vLLM's ``--kv-cache-dtype``: 'auto' caches K/V in the model's dtype; the fp8 formats
    take one byte per element, half of a 16-bit cache."""

    AUTO = "auto"
    FP8 = "fp8"
    FP8_E4M3 = "fp8_e4m3"
    FP8_E5M2 = "fp8_e5m2"

    def bytes_for(self, model_bytes: int) -> int:
        return model_bytes if self is KVCacheDType.AUTO else 1


def serving_model(model: ModelSpec, dtype: ModelDType, kv_cache_dtype: KVCacheDType) -> ModelSpec:
    """``model`` as served with these dtypes (the same object when nothing changes)."""
    weights = dtype.bytes_for(model.dtype_bytes)
    kv = kv_cache_dtype.bytes_for(weights)
    if weights == model.dtype_bytes and kv == model.kv_dtype:
        return model
    return dataclasses.replace(
        model, dtype_bytes=weights, kv_dtype_bytes=None if kv == weights else kv
    )

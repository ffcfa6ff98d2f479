"""Synthetic operator profiles for the tests (random, seeded; no measurement behind them)."""

from __future__ import annotations

import random
from typing import Any

from pagedkv.engine.profile import SHAPE_FIELDS, Curve, Profile
from pagedkv.models.models import ModelSpec


def _curve(
    rng: random.Random, scale: float, xs: list[int], monotone: bool = True
) -> dict[str, list[Any]]:
    """Nondecreasing, or (``monotone=False``) rising and falling, never below 0, its last line
    not falling (``Curve.monotone``)."""
    y = rng.uniform(0, scale)
    ys = []
    for _ in xs:
        ys.append(y)
        low = 0.0 if monotone else -scale
        y = max(y + rng.choice([0.0, rng.uniform(low, scale)]), 0.0)
    if len(ys) >= 2:
        ys[-1] = max(ys[-1], ys[-2])
    return {"x": xs, "y": ys}


def _points(rng: random.Random, top: int) -> list[int]:
    inner = sorted(rng.sample(range(1, top), rng.randint(1, 6)))
    return [0, *inner]


def _residual(rng: random.Random, linear: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """A signed ``layer_residual``: at the linear curve's points and some of its own, a share
    of -linear there plus a rise (so linear + residual stays >= 0), its last line not falling."""
    line = Curve(tuple(linear["x"]), tuple(linear["y"]), monotone=False)
    xs = sorted({*linear["x"], *_points(rng, 900)})
    share = rng.uniform(0, 1)
    ys = [-share * line.at(x) + rng.choice([0.0, rng.uniform(0, 1e-4)]) for x in xs]
    ys[-1] = max(ys[-1], ys[-2])
    return {"x": xs, "y": ys}


def profile_dict(
    model: ModelSpec, block_sizes: list[int], seed: int = 0, residual: bool | None = None
) -> dict[str, Any]:
    """A valid profile of ``model``'s shapes at ``block_sizes``, with random curves (the
    context curves nondecreasing, the token and row curves rising and falling) whose points
    fall inside the windows the engine builds; with a ``layer_residual`` when ``residual``
    (None: for every other seed)."""
    rng = random.Random(seed)
    dtype = {2: "bfloat16", 4: "float32", 8: "float64"}[model.dtype_bytes]
    data = _profile_dict(rng, model, block_sizes, dtype)
    if residual or (residual is None and seed % 2):
        data["layer_residual"] = _residual(rng, data["linear"])
    if seed % 3 == 0:  # how the points were timed (optional, not priced)
        data["timing"] = _timing(rng)
    return data


def _timing(rng: random.Random) -> dict[str, Any]:
    passes = rng.randint(0, 25)
    points = {}
    for term in rng.sample(["linear", "lm_head", "decode_attention.16", "swap.16"], 2):
        runs = [rng.choice([1, passes or 1]) for _ in range(rng.randint(1, 5))]
        points[term] = {"runs": runs, "spread": [rng.uniform(0, 0.5) for _ in runs]}
    return {"passes": passes, "points": dict(sorted(points.items()))}


def _profile_dict(
    rng: random.Random, model: ModelSpec, block_sizes: list[int], dtype: str
) -> dict[str, Any]:
    return {
        "format": "pagedkv-profile",
        "version": 1,
        "source": {"device": "synthetic", "date": "2026-01-01T00:00:00Z"},
        "model": {
            "name": model.name,
            "arch": "test",
            **{f: getattr(model, f) for f in SHAPE_FIELDS},
        },
        "dtype": dtype,
        "block_sizes": block_sizes,
        "per_iteration_s": rng.uniform(1e-4, 3e-3),
        "per_sequence_s": rng.uniform(0, 1e-5),
        "per_token_s": rng.uniform(0, 1e-6),
        "embedding": _curve(rng, 1e-5, _points(rng, 600), monotone=False),
        "linear": _curve(rng, 3e-4, _points(rng, 600), monotone=False),
        "lm_head": _curve(rng, 1e-4, _points(rng, 60), monotone=False),
        "prefill_attention": {
            "per_call_s": rng.uniform(0, 1e-5),
            "per_sequence_s": rng.uniform(0, 1e-5),
            "per_pair_s": rng.uniform(0, 1e-9),
            "per_read_token_s": rng.uniform(0, 1e-8),
        },
        "decode_attention": {
            str(bs): {
                "context": _curve(rng, 1e-4, _points(rng, 4000)),
                "per_sequence_s": rng.uniform(0, 1e-6),
            }
            for bs in block_sizes
        },
        "swap": {
            str(bs): {"fixed_s": rng.uniform(0, 1e-5), "per_block_s": rng.uniform(0, 1e-5)}
            for bs in block_sizes
        },
        "rates": {
            "matmul_flops": 1e11,
            "read_bandwidth": 1e10,
            "copy_bandwidth": 1e10,
            "roofline_overhead_s": 1e-3,
        },
    }


def synthetic_profile(
    model: ModelSpec, block_sizes: list[int], seed: int = 0, residual: bool | None = None
) -> Profile:
    return Profile.from_dict(profile_dict(model, block_sizes, seed, residual))

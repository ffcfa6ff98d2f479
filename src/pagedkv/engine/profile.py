"""An operator profile: what one model's operators measured on one device, for ``ProfiledCost``.

``pagedkv profile`` (``pagedkv.tensors.profiler``) measures the operators of one layer at the
model's real shapes and writes this file; ``ProfiledCost`` (``profiled_cost.py``) reads it. All
times are seconds on the profiled device; "per layer" terms are multiplied by the layers:

* ``linear``: the layer without attention (norms, QKV, RoPE, K/V write, output, MLP) against
  the batched tokens, piecewise linear between measured points;
* ``embedding``: what a step spends outside the layers against its tokens (embedding, positions);
* ``lm_head``: the final norm and the lm head against the rows that get logits (sequences);
* ``prefill_attention``: a batch with any prefill (the gather path): per call, per sequence,
  per (query, context) pair and per K/V token read (a least-squares fit, per layer);
* ``decode_attention``, per block size: a decode-only batch (the paged kernel) against the total
  context of the batch, piecewise linear, plus a per-sequence term (the kernel's per-block cost
  is in the curve measured at that block size);
* ``per_iteration_s``, ``per_sequence_s``, ``per_token_s``: the executor's own work (input
  preparation, sampling), fitted to a calibration run of its own;
* ``swap``, per block size: per layer, a fixed cost plus a cost per block (K and V copies);
* ``rates``: achieved matmul FLOP/s, read and copy bandwidth and the roofline's per-step overhead
  on this device, so today's roofline can be judged on the same machine;
* ``layer_residual`` (optional): per layer, against the batched tokens, what whole forwards of
  the profiled layers measured less the sum of the operators above timed one by one (signed:
  operators run in sequence find their inputs and buffers warm, and cost less than each timed
  alone after a flush); flat beyond its last point. Absent (older files, the built-in profiles,
  which have no whole-step measurement): 0, the operators' sum.
* ``timing`` (optional; not read by the cost model): how the points were measured, the round-
  robin passes over all of them and, per term (``linear``, ``decode_attention.16``, ...) in
  measurement order, each point's timings and spread ((75th - 25th percentile) / median).

A file is one JSON object (``to_dict`` / ``from_dict``); every field is validated and a bad one is
one ConfigError naming it (``profile.<field>``).
"""

from __future__ import annotations

import json
import math
from bisect import bisect_right
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from pagedkv.errors import ConfigError
from pagedkv.models.models import ModelSpec

FORMAT = "pagedkv-profile"
VERSION = 1
DTYPE_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}
SHAPE_FIELDS = (
    "num_layers",
    "hidden_size",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
)


def _seconds(field: str, value: object, positive: bool = False) -> float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float))
    if not ok or not math.isfinite(float(value)) or float(value) < 0:  # type: ignore[arg-type]
        raise ConfigError(field, value, "must be a finite number >= 0")
    if positive and float(value) <= 0:  # type: ignore[arg-type]
        raise ConfigError(field, value, "must be a finite number > 0")
    return float(value)  # type: ignore[arg-type]


def _finite(field: str, value: object) -> float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float))
    if not ok or not math.isfinite(float(value)):  # type: ignore[arg-type]
        raise ConfigError(field, value, "must be a finite number (seconds, may be < 0)")
    return float(value)  # type: ignore[arg-type]


def _count(field: str, value: object, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(field, value, f"must be an integer >= {minimum}")
    return value


def _mapping(field: str, value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(field, type(value).__name__, "must be a JSON object")
    return value


@dataclass(frozen=True)
class Curve:
    """A piecewise-linear function of a count: ``y[i]`` at ``x[i]`` (``x[0] = 0``, strictly
    increasing ints), straight lines between, the last line extended beyond (so it never falls:
    a price never goes below 0). ``monotone``: nondecreasing everywhere, as the K/V context
    curves must be (a decode window's reads grow a round); the token and row curves need not
    be (a GEMM over 3 rows can take longer than over 4), their arguments fixed in a window."""

    x: tuple[int, ...]
    y: tuple[float, ...]
    monotone: bool = True
    signed: bool = False
    """y may be negative (a residual added to other curves); never with ``monotone``."""

    def check(self, field: str) -> Curve:
        if len(self.x) < 2 or len(self.x) != len(self.y):
            raise ConfigError(f"{field}.x", list(self.x), "needs >= 2 points, one y per x")
        for i, v in enumerate(self.x):
            _count(f"{field}.x[{i}]", v)
        if self.x[0] != 0 or any(b <= a for a, b in zip(self.x, self.x[1:], strict=False)):
            raise ConfigError(f"{field}.x", list(self.x), "must start at 0 and increase")
        for i, y in enumerate(self.y):
            if self.signed:
                _finite(f"{field}.y[{i}]", y)
            else:
                _seconds(f"{field}.y[{i}]", y)
        if self.monotone and any(b < a for a, b in zip(self.y, self.y[1:], strict=False)):
            raise ConfigError(f"{field}.y", list(self.y), "must be nondecreasing (seconds)")
        if self.y[-1] < self.y[-2]:
            raise ConfigError(f"{field}.y", list(self.y), "must not fall on its last line")
        return self

    def segment(self, x: int) -> int:
        """The index i of the line that holds at ``x``: from ``x[i]`` to ``x[i+1]``."""
        return min(max(bisect_right(self.x, x) - 1, 0), len(self.x) - 2)

    def line(self, i: int) -> tuple[float, float]:
        """(value at 0, slope) of line i."""
        x0, x1, y0, y1 = self.x[i], self.x[i + 1], self.y[i], self.y[i + 1]
        slope = (y1 - y0) / (x1 - x0)
        return y0 - slope * x0, slope

    def at(self, x: int) -> float:
        a, b = self.line(self.segment(x))
        return a + b * x

    @classmethod
    def read(cls, field: str, value: object, monotone: bool = True, signed: bool = False) -> Curve:
        data = _mapping(field, value)
        xs, ys = data.get("x"), data.get("y")
        if not isinstance(xs, list) or not isinstance(ys, list):
            raise ConfigError(field, value, "must be {'x': [counts], 'y': [seconds]}")
        return cls(tuple(xs), tuple(ys), monotone, signed).check(field)

    def to_dict(self) -> dict[str, list[Any]]:
        return {"x": list(self.x), "y": list(self.y)}


@dataclass(frozen=True)
class PrefillAttention:
    """Per layer: attention of a batch with a prefill in it, linear in its counts."""

    per_call_s: float
    per_sequence_s: float
    per_pair_s: float
    per_read_token_s: float


@dataclass(frozen=True)
class DecodeAttention:
    """Per layer, at one block size: ``context(total context) + per_sequence_s x sequences``."""

    context: Curve
    per_sequence_s: float


@dataclass(frozen=True)
class SwapCost:
    """Per layer, at one block size: a swap of m > 0 blocks costs ``fixed_s + per_block_s m``."""

    fixed_s: float
    per_block_s: float


@dataclass(frozen=True)
class DeviceRates:
    """Achieved rates on the profiled device (for a roofline of the same machine)."""

    matmul_flops: float
    read_bandwidth: float
    copy_bandwidth: float
    roofline_overhead_s: float


_SCALARS = {
    PrefillAttention: ("per_call_s", "per_sequence_s", "per_pair_s", "per_read_token_s"),
    SwapCost: ("fixed_s", "per_block_s"),
    DeviceRates: ("matmul_flops", "read_bandwidth", "copy_bandwidth", "roofline_overhead_s"),
}


def _read_scalars(cls: Any, field: str, value: object) -> Any:
    data = _mapping(field, value)
    names = _SCALARS[cls]
    extra = sorted(set(data) - set(names))
    if extra:
        raise ConfigError(f"{field}.{extra[0]}", data[extra[0]], "is not a field of this term")
    positive = cls is DeviceRates
    return cls(
        **{
            n: _seconds(f"{field}.{n}", data.get(n), positive and n != "roofline_overhead_s")
            for n in names
        }
    )


@dataclass(frozen=True)
class PointTimings:
    """One term's measured points, in measurement order: timings and spread of each."""

    runs: tuple[int, ...]
    spread: tuple[float, ...]


@dataclass(frozen=True)
class Timing:
    """How a profile's points were timed (``pagedkv.tensors.profile_ops.Timer``)."""

    passes: int
    """Round-robin passes over every point after the warm-up (0: one timing each)."""
    points: dict[str, PointTimings]

    def to_dict(self) -> dict[str, Any]:
        return {
            "passes": self.passes,
            "points": {
                k: {"runs": list(v.runs), "spread": list(v.spread)}
                for k, v in sorted(self.points.items())
            },
        }

    @classmethod
    def read(cls, value: object) -> Timing:
        field = "profile.timing"
        data = _mapping(field, value)
        extra = sorted(set(data) - {"passes", "points"})
        if extra:
            raise ConfigError(f"{field}.{extra[0]}", data[extra[0]], "is not a field of timing")
        passes = _count(f"{field}.passes", data.get("passes"))
        points = {}
        for name, term in _mapping(f"{field}.points", data.get("points")).items():
            where = f"{field}.points.{name}"
            term = _mapping(where, term)
            runs, spread = term.get("runs"), term.get("spread")
            if set(term) != {"runs", "spread"} or not isinstance(runs, list):
                raise ConfigError(where, term, "must be {'runs': [counts], 'spread': [ratios]}")
            if not isinstance(spread, list) or len(spread) != len(runs):
                raise ConfigError(f"{where}.spread", spread, "must be a list, one per run count")
            points[str(name)] = PointTimings(
                tuple(_count(f"{where}.runs[{i}]", r, 1) for i, r in enumerate(runs)),
                tuple(_ratio(f"{where}.spread[{i}]", x) for i, x in enumerate(spread)),
            )
        return cls(passes, points)


def _ratio(field: str, value: object) -> float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float))
    if not ok or not math.isfinite(float(value)) or float(value) < 0:  # type: ignore[arg-type]
        raise ConfigError(field, value, "must be a finite ratio >= 0")
    return float(value)  # type: ignore[arg-type]


OPTIONAL = frozenset({"layer_residual", "timing"})
"""Profile fields a file may leave out (each with its fallback in ``Profile``)."""


def read_residual(linear: Curve, value: object) -> Curve:
    """The ``layer_residual`` curve, checked: a layer's operators plus it never below 0 (both
    piecewise linear and their last lines not falling: checked at every point of either, to
    rounding)."""
    field = "profile.layer_residual"
    residual = Curve.read(field, value, monotone=False, signed=True)
    for x in sorted({*linear.x, *residual.x}):
        # a residual fitted to -linear at a point may round an ulp below it
        if linear.at(x) + residual.at(x) < -1e-12 - 1e-9 * linear.at(x):
            raise ConfigError(
                field,
                residual.at(x),
                f"must keep linear + layer_residual >= 0 (at {x} tokens: linear "
                f"{linear.at(x):.3g} s)",
            )
    return residual


@dataclass(frozen=True)
class Profile:
    """One model's operators measured on one device (see the module docstring)."""

    source: dict[str, str]
    """Where it was measured: device, device name, platform, library versions, date, clock."""
    model: dict[str, Any]
    """The profiled shapes: name, arch and ``SHAPE_FIELDS``."""
    dtype: str
    block_sizes: tuple[int, ...]
    per_iteration_s: float
    per_sequence_s: float
    per_token_s: float
    embedding: Curve
    linear: Curve
    lm_head: Curve
    prefill_attention: PrefillAttention
    decode_attention: dict[int, DecodeAttention]
    swap: dict[int, SwapCost]
    rates: DeviceRates
    layer_residual: Curve | None = None
    """Per layer: whole forwards less their operators' sum (module docstring); None: 0."""
    timing: Timing | None = None
    """How the points were timed (module docstring); None in files without it."""

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def check_model(self, model: ModelSpec) -> None:
        """ConfigError unless ``model`` has the profiled shapes and dtype."""
        for name in SHAPE_FIELDS:
            if getattr(model, name) != self.model[name]:
                raise ConfigError(
                    f"profile.model.{name}",
                    self.model[name],
                    f"the profile measured another model than {model.name} "
                    f"({name} {getattr(model, name)}); profile this one",
                )
        if model.dtype_bytes != self.dtype_bytes:
            raise ConfigError(
                "profile.dtype",
                self.dtype,
                f"{model.name} holds {model.dtype_bytes}-byte values; profile it in that dtype",
            )

    def check_block_size(self, block_size: int) -> None:
        if block_size not in self.decode_attention:
            raise ConfigError(
                "block_size",
                block_size,
                f"the profile measured block sizes {list(self.block_sizes)}; "
                "profile again with --block-size",
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "source": dict(self.source),
            "model": dict(self.model),
            "dtype": self.dtype,
            "block_sizes": list(self.block_sizes),
            "per_iteration_s": self.per_iteration_s,
            "per_sequence_s": self.per_sequence_s,
            "per_token_s": self.per_token_s,
            "embedding": self.embedding.to_dict(),
            "linear": self.linear.to_dict(),
            "lm_head": self.lm_head.to_dict(),
            "prefill_attention": asdict(self.prefill_attention),
            "decode_attention": {
                str(bs): {"context": d.context.to_dict(), "per_sequence_s": d.per_sequence_s}
                for bs, d in sorted(self.decode_attention.items())
            },
            "swap": {str(bs): asdict(s) for bs, s in sorted(self.swap.items())},
            "rates": asdict(self.rates),
            **(
                {}
                if self.layer_residual is None
                else {"layer_residual": self.layer_residual.to_dict()}
            ),
            **({} if self.timing is None else {"timing": self.timing.to_dict()}),
        }

    @classmethod
    def from_dict(cls, data: object) -> Profile:
        d = _mapping("profile", data)
        if d.get("format") != FORMAT:
            raise ConfigError("profile.format", d.get("format"), f"must be {FORMAT!r}")
        if d.get("version") != VERSION:
            raise ConfigError("profile.version", d.get("version"), f"must be {VERSION}")
        known = {f.name for f in fields(cls)} | {"format", "version"}
        extra = sorted(set(d) - known)
        if extra:
            raise ConfigError(f"profile.{extra[0]}", d[extra[0]], "is not a profile field")
        missing = sorted(known - set(d) - OPTIONAL)
        if missing:
            raise ConfigError(f"profile.{missing[0]}", None, "is missing")
        source = _mapping("profile.source", d["source"])
        if not all(isinstance(v, str) for v in source.values()):
            raise ConfigError("profile.source", source, "must map names to strings")
        model = _mapping("profile.model", d["model"])
        for name in SHAPE_FIELDS:
            _count(f"profile.model.{name}", model.get(name), 1)
        if d["dtype"] not in DTYPE_BYTES:
            raise ConfigError("profile.dtype", d["dtype"], f"must be one of {sorted(DTYPE_BYTES)}")
        sizes = d["block_sizes"]
        if not isinstance(sizes, list) or not sizes:
            raise ConfigError("profile.block_sizes", sizes, "must be a non-empty list")
        block_sizes = tuple(_count(f"profile.block_sizes[{i}]", b, 1) for i, b in enumerate(sizes))
        decode = {}
        swap = {}
        for bs in block_sizes:
            key = str(bs)
            dec = _mapping("profile.decode_attention", d["decode_attention"]).get(key)
            where = f"profile.decode_attention.{key}"
            dec = _mapping(where, dec)
            decode[bs] = DecodeAttention(
                Curve.read(f"{where}.context", dec.get("context")),
                _seconds(f"{where}.per_sequence_s", dec.get("per_sequence_s")),
            )
            sw = _mapping("profile.swap", d["swap"]).get(key)
            swap[bs] = _read_scalars(SwapCost, f"profile.swap.{key}", sw)
        for table in ("decode_attention", "swap"):
            extra = sorted(set(d[table]) - {str(b) for b in block_sizes})
            if extra:
                raise ConfigError(f"profile.{table}.{extra[0]}", extra[0], "is not in block_sizes")
        linear = Curve.read("profile.linear", d["linear"], monotone=False)
        residual = None
        if "layer_residual" in d:
            residual = read_residual(linear, d["layer_residual"])
        return cls(
            source={str(k): v for k, v in source.items()},
            model=dict(model),
            dtype=d["dtype"],
            block_sizes=block_sizes,
            per_iteration_s=_seconds("profile.per_iteration_s", d["per_iteration_s"], True),
            per_sequence_s=_seconds("profile.per_sequence_s", d["per_sequence_s"]),
            per_token_s=_seconds("profile.per_token_s", d["per_token_s"]),
            embedding=Curve.read("profile.embedding", d["embedding"], monotone=False),
            linear=linear,
            lm_head=Curve.read("profile.lm_head", d["lm_head"], monotone=False),
            prefill_attention=_read_scalars(
                PrefillAttention, "profile.prefill_attention", d["prefill_attention"]
            ),
            decode_attention=decode,
            swap=swap,
            rates=_read_scalars(DeviceRates, "profile.rates", d["rates"]),
            layer_residual=residual,
            timing=Timing.read(d["timing"]) if "timing" in d else None,
        )

    def write(self, path: str | Path) -> Path:
        from pagedkv.io import atomic_write_json

        return atomic_write_json(path, self.to_dict())


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile file, or a built-in profile by name (``a100-80gb/opt-13b``,
    ``pagedkv.profiles``) where no file of that name exists; a bad one is one ConfigError
    naming the field."""
    if not Path(path).exists():
        from pagedkv.profiles import builtin_path

        path = builtin_path(str(path)) or path
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(
            "profile",
            str(path),
            f"must be a readable file ({err.strerror}) or a built-in profile's name, "
            "gpu/model (a100-40gb, a100-80gb, h100-sxm x a preset model: pagedkv.profiles)",
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError("profile", str(path), f"must be valid JSON ({err.msg})") from None
    return Profile.from_dict(data)

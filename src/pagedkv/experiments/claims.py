"""``pagedkv claims``: the seed simulator's and the vLLM paper's claims, measured and judged.

Each claim carries the range its source states, where it states it (paper, section, figure,
workload, baseline: ``citation``), the condition it is measured under here, and whether it needs
a time model (rates, latencies, throughput: ``time_model`` names the cost model). Measurements
come from the experiments' results (per seed, with a 95% interval) and are judged by
``verdict.verdict_each``, each against the range stated for its condition: no verdict is typed
here. Sources: the seed simulator's README (single unseeded runs) and the vLLM paper (Kwon et
al., SOSP 2023, arXiv 2309.06180); the ranges and their sections are in ``paper_claims``.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pagedkv import footprint
from pagedkv.errors import ConfigError
from pagedkv.experiments import framework
from pagedkv.experiments.framework import ExperimentResult
from pagedkv.experiments.verdict import Favour, Measurement, Target, describe_range, verdict_each
from pagedkv.io import atomic_write_json, atomic_write_text, output_set
from pagedkv.report import stats
from pagedkv.report.html import RESULTS_SHAPE  # the experiments' schema, defined once
from pagedkv.validation import check_json_shape, read_text

EVIDENCE = (
    "fragmentation",
    "block-size",
    "memory-pressure",
    "rate-latency",
    "preemption",
    "prefix-sharing",
    "sampling",
)


@dataclass(frozen=True)
class Claim:
    id: str
    source: str
    """'seed-simulator' or 'vllm-paper'."""
    citation: str
    """Where the source states the claim and its range (section, figure, workload, baseline)."""
    statement: str
    metric: str
    unit: str
    claimed: str
    """The range as judged, e.g. 'in [1.7, 2.7]; favour: higher'."""
    favour: str
    condition: str
    """What it is measured under here (workload, model, load, experiment)."""
    time_model: str | None
    """The cost model the figures need (None: none)."""
    measured: float | None
    ci_low: float | None
    ci_high: float | None
    verdict: str
    judged: str
    """Each measurement's value, range and own verdict."""
    evidence: str
    measurements: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Spec:
    """A claim before it is measured: everything but the numbers."""

    id: str
    source: str
    citation: str
    statement: str
    metric: str
    unit: str
    favour: Favour
    condition: str
    evidence: str
    time_model: str | None


def load_result(path: Path) -> ExperimentResult:
    """An experiment's results.json back as an ``ExperimentResult`` (no timelines, no plots);
    one ``ConfigError`` naming the file when it is not JSON or not of the experiments' shape."""
    text = read_text("results", path, footprint.MEMORY_CAP_BYTES)
    try:
        data = json.loads(text)
    except ValueError as e:  # a JSONDecodeError, or an integer of over 4300 digits
        where = f"line {e.lineno}: {e.msg}" if isinstance(e, json.JSONDecodeError) else str(e)
        raise ConfigError(str(path), _clip(text), f"must be JSON ({where})") from None
    check_json_shape(str(path), data, RESULTS_SHAPE, required=True)
    cols = data["columns"]
    if "seed" not in cols:
        raise ConfigError(f"{path}: columns", _clip(repr(cols)), "must name a 'seed' column")
    cut = cols.index("seed")
    return ExperimentResult(
        experiment=data["experiment"],
        title=data["title"],
        question=data["question"],
        setup=data["setup"],
        config_keys=tuple(cols[:cut]),
        metrics=tuple(cols[cut + 1 :]),
        rows=data["rows"],
        summary=data["summary"],
        findings=data["findings"],
        derived=data.get("derived", {}),
    )


"""What ``load_result`` reads of a results.json: every key required."""


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def gather(
    results_dir: Path, *, quick: bool = False, workers: int | None = None
) -> dict[str, ExperimentResult]:
    """Each evidence experiment from ``results_dir/<name>/results.json``, run (and written
    there) when missing."""
    from pagedkv.experiments.registry import get_experiment

    out = {}
    for name in EVIDENCE:
        path = results_dir / name / "results.json"
        if path.exists():
            out[name] = load_result(path)
        else:
            out[name] = framework.run_experiment(
                get_experiment(name), quick=quick, out=results_dir / name, workers=workers
            )
    return out


def summary_measurement(
    res: ExperimentResult, condition: str, metric: str, **key: Any
) -> Measurement:
    """A summary row's mean and interval; not measured when no row matches (e.g. a block size
    a quick run leaves out)."""
    try:
        s = res.summary_for(**key)
    except KeyError:
        return Measurement(condition, None, None, None, 0)
    return Measurement(
        condition, s[f"{metric}_mean"], s[f"{metric}_ci_low"], s[f"{metric}_ci_high"], s["n"]
    )


def ci_measurement(condition: str, ci: stats.MeanCI) -> Measurement:
    return Measurement(condition, ci.mean, ci.low, ci.high, ci.n)


def paired(
    res: ExperimentResult, condition: str, metric: str, top: dict[str, Any], bottom: dict[str, Any]
) -> Measurement:
    """Per seed, ``metric`` of ``top`` over ``bottom`` (paired by seed), as a measurement."""
    return ci_measurement(condition, framework.paired_ratio(res, metric, top, bottom))


def make_claim(spec: Spec, targets: Sequence[Target]) -> Claim:
    """Judge ``targets`` (each against its own range) and build the claim's record."""
    overall, judged = verdict_each(targets, spec.favour)
    ranges = {(t.low, t.high) for t in targets}
    claimed = (
        describe_range(*next(iter(ranges))) if len(ranges) == 1 else "per condition, see judged"
    )
    records = []
    parts = []
    for t, j in zip(targets, judged, strict=True):
        m = t.measurement
        records.append(
            {
                "condition": m.condition,
                "mean": m.mean,
                "ci_low": m.ci_low,
                "ci_high": m.ci_high,
                "n": m.n,
                "low": t.low,
                "high": t.high,
                "verdict": j.verdict,
                "seeds_to_decide": j.seeds_to_decide,
            }
        )
        parts.append(
            f"{m.condition}: {_fmt(m)} against {describe_range(t.low, t.high)}: {j.describe(m.n)}"
        )
    first = targets[0].measurement
    return Claim(
        id=spec.id,
        source=spec.source,
        citation=spec.citation,
        statement=spec.statement,
        metric=spec.metric,
        unit=spec.unit,
        claimed=f"{claimed}; favour: {spec.favour}",
        favour=spec.favour,
        condition=spec.condition,
        time_model=spec.time_model,
        measured=first.mean,
        ci_low=first.ci_low,
        ci_high=first.ci_high,
        verdict=overall,
        judged="; ".join(parts),
        evidence=spec.evidence,
        measurements=records,
    )


def _fmt(m: Measurement) -> str:
    if m.mean is None:
        return "n/a"
    if m.ci_low is None or m.ci_high is None:
        return f"{m.mean:.3g}"
    return f"{m.mean:.3g} [{m.ci_low:.3g}, {m.ci_high:.3g}]"


def build_claims(results: dict[str, ExperimentResult]) -> list[Claim]:
    from pagedkv.experiments.paper_claims import paper_claims
    from pagedkv.experiments.seed_claims import seed_claims

    return [*seed_claims(results), *paper_claims(results)]


@output_set()  # both files or neither
def write_claims(claims: Sequence[Claim], out: Path) -> Path:
    """claims.csv (measurements as a JSON cell), then claims.json (the shared schema),
    atomically."""
    rows = [asdict(c) for c in claims]
    flat = [{**r, "measurements": json.dumps(r["measurements"])} for r in rows]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(flat)
    atomic_write_text(out / "claims.csv", buf.getvalue())
    return atomic_write_json(out / "claims.json", {"claims": rows})


def run_claims(
    results_dir: Path, *, quick: bool = False, workers: int | None = None
) -> list[Claim]:
    """Gather the evidence (running what is missing), judge every claim, write
    ``results_dir/claims/``."""
    claims = build_claims(gather(results_dir, quick=quick, workers=workers))
    write_claims(claims, results_dir / "claims")
    return claims

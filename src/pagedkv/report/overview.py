"""The report's first section: what was run, how long it took, the claims' verdicts at a glance.

What was run comes from each results.json (its setup's seeds, requests per run and ``quick``,
its rows and summary: the runs and configurations); how long from ``timings.json`` at the top
of the results directory, which ``pagedkv reproduce`` writes (wall seconds per step on the
machine that ran it: the one file of a results directory that differs between two runs, so it
is read only here, and a directory without it says wall time was not recorded).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagedkv.report.markup import (
    VERDICT_CLASS,
    anchor,
    cell,
    esc,
    fmt,
    fmt_interval,
    is_quick,
    table,
)
from pagedkv.validation import JsonShape

TIMINGS = "timings.json"
TIMINGS_SHAPE: JsonShape = {
    "command": (str, None),
    "steps": (dict, None),
    "total_s": (float, None),
}
"""What the report reads of timings.json, each key optional."""


@dataclass(frozen=True)
class Entry:
    """One experiment of the page: its results, its section's id, its directory under DIR."""

    name: str
    results: Mapping[str, Any]
    anchor: str
    where: str


def command(e: Entry) -> str:
    """The command that writes these results again (seeds explicit, --quick where it was)."""
    quick = " --quick" if is_quick(e.results) else ""
    if e.name == "block-map":
        return f"pagedkv report --block-map{quick}"
    seeds = _setup(e).get("seeds")
    count = f" --seeds {len(seeds)}" if isinstance(seeds, list) and len(seeds) >= 2 else ""
    return f"pagedkv experiment {e.name}{quick}{count}"


def _setup(e: Entry) -> Mapping[str, Any]:
    setup = e.results.get("setup")
    return setup if isinstance(setup, Mapping) else {}


def _seconds(value: object) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "-"
    return f"{value:,.0f} s" if value >= 10 else f"{value:.1f} s"


def runs_table(entries: Sequence[Entry], timings: Mapping[str, Any] | None) -> str:
    steps = timings.get("steps") if timings else None
    steps = steps if isinstance(steps, Mapping) else {}
    header = [
        "experiment",
        "command",
        "configurations",
        "seeds",
        "runs",
        "requests a run",
        "wall time",
    ]
    rows = []
    for e in entries:
        seeds = _setup(e).get("seeds")
        rows.append(
            [
                f'<td><a href="#{e.anchor}">{esc(e.results.get("title") or e.name)}</a></td>',
                f"<td><code>{esc(command(e))}</code></td>",
                cell(len(e.results.get("summary") or [])),
                cell(len(seeds) if isinstance(seeds, list) else None),
                cell(len(e.results.get("rows") or [])),
                cell(_setup(e).get("num_requests")),
                f'<td class="num">{esc(_seconds(steps.get(e.name)))}</td>',
            ]
        )
    return table(header, rows, quick=any(is_quick(e.results) for e in entries))


def glance_table(
    claims: Sequence[Mapping[str, Any]], anchors: Mapping[str, str], *, quick: bool = False
) -> str:
    """One row a claim: its id (a link to its row of the claims table), verdict, measured."""
    rows, classes = [], []
    for c in claims:
        evidence = str(c.get("evidence") or "")
        link = (
            f'<a href="#{anchors[evidence]}">{esc(evidence)}</a>'
            if evidence in anchors
            else esc(evidence or "-")
        )
        unit = (c.get("unit") or "") if c.get("measured") is not None else ""
        measured = fmt_interval(c.get("measured"), c.get("ci_low"), c.get("ci_high"))
        verdict = str(c.get("verdict", ""))
        classes.append(VERDICT_CLASS.get(verdict, "other"))
        rows.append(
            [
                f'<td><a href="#{anchor("claim", str(c.get("id")))}">{esc(c.get("id"))}</a></td>',
                f'<td class="verdict">{esc(verdict)}</td>',
                f'<td class="num">{esc(measured)}{" " + esc(unit) if unit else ""}</td>',
                f"<td>{link}</td>",
            ]
        )
    header = ["claim", "verdict", "measured [95% CI]", "evidence"]
    return table(header, rows, classes, quick=quick)


def tally(claims: Sequence[Mapping[str, Any]]) -> str:
    """'3 claims: 1 supported, 2 contradicted' (verdicts in the rule's order, others after)."""
    known = [v for v in VERDICT_CLASS if any(c.get("verdict") == v for c in claims)]
    others = sorted({str(c.get("verdict")) for c in claims} - set(VERDICT_CLASS))
    counts = ", ".join(
        f"{sum(str(c.get('verdict')) == v for c in claims)} {esc(v)}" for v in known + others
    )
    return f"{len(claims)} claims: {counts}" if claims else "0 claims"


def summary_section(
    entries: Sequence[Entry],
    claims: Sequence[Mapping[str, Any]] | None,
    anchors: Mapping[str, str],
    timings: Mapping[str, Any] | None,
    *,
    claims_quick: bool = False,
) -> str:
    """The page's first section (``claims`` None: no claims file; ``claims_quick``: they
    were measured on quick results)."""
    runs = sum(len(e.results.get("rows") or []) for e in entries)
    if timings is not None:
        how = (
            f"<code>{esc(timings.get('command') or 'pagedkv reproduce')}</code> took "
            f"{esc(_seconds(timings.get('total_s')))} of wall time on the machine that ran it "
            f"(<code>{TIMINGS}</code>)."
        )
    else:
        how = (
            f"Wall time was not recorded (<code>pagedkv reproduce</code> records it in "
            f"<code>{TIMINGS}</code>)."
        )
    parts = [
        '<section id="summary"><h2>Summary</h2>',
        f"<p>{len(entries)} experiment{'s' if len(entries) != 1 else ''}, "
        f"{fmt(runs)} simulated runs in all. {how}</p>",
        "<h3>What was run</h3>",
        runs_table(entries, timings) if entries else '<p class="note">No experiments.</p>',
    ]
    if claims is not None:
        parts += [
            "<h3>Claims at a glance</h3>",
            f'<p>{tally(claims)}; details in <a href="#claims">Claims</a>.</p>',
            glance_table(claims, anchors, quick=claims_quick),
        ]
    parts.append("</section>")
    return "\n".join(parts)


def timings_path(results_dir: Path) -> Path:
    return results_dir / TIMINGS

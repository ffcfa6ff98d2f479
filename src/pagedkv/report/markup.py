"""The HTML report's pieces: escaped text, number formats, tables and cells, the quick banner.

Every piece returns escaped HTML; nothing here reads files.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

VERDICT_CLASS = {
    "supported": "ok",
    "exceeds": "beyond",
    "inconclusive": "mixed",
    "contradicted": "bad",
    "not measured": "other",
}
"""The five verdicts of ``pagedkv.experiments.verdict``, by row class (the report reads
claims.json, never the engine, so the names are repeated here)."""
QUICK_MEANING = (
    "fewer requests per run, 3 seeds and fewer configurations than the full run (the same "
    "command without --quick): intervals over 3 seeds are wide, so these figures show what "
    "the experiment looks like more than what it finds"
)
"""What ``--quick`` means, the banner's text (``pagedkv experiment --help``: fewer requests,
3 seeds, fewer points)."""


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def fmt(value: object) -> str:
    """A cell: numbers to four significant figures, None as a dash, structures as JSON."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1e5 else f"{value:.4g}"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def fmt_interval(mean: object, low: object, high: object) -> str:
    """'mean [low, high]', or the mean alone when there is no interval."""
    if low is None or high is None:
        return fmt(mean)
    return f"{fmt(mean)} [{fmt(low)}, {fmt(high)}]"


def is_quick(results: Mapping[str, Any]) -> bool:
    """Did a ``--quick`` run write these results (``setup.quick``)?"""
    setup = results.get("setup")
    return isinstance(setup, Mapping) and setup.get("quick") is True


def quick_banner(where: str = "", setup: Mapping[str, Any] | None = None) -> str:
    """The banner over a page (``where`` names it: what ``--quick`` means, in full) or, without
    ``where``, the short one over a section or table (its seeds and requests a run, from
    ``setup``, where known)."""
    if where:
        return (
            f'<p class="quick" role="note"><strong>Quick results ({esc(where)}), from --quick:'
            f"</strong> {esc(QUICK_MEANING)}.</p>"
        )
    facts = []
    seeds = (setup or {}).get("seeds")
    if isinstance(seeds, list):
        facts.append(f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''}")
    requests = (setup or {}).get("num_requests")
    if isinstance(requests, int) and not isinstance(requests, bool):
        facts.append(f"{requests:,} requests a run")
    said = f": {', '.join(facts)}" if facts else ""
    return (
        f'<p class="quick" role="note"><strong>Quick results</strong> (--quick{esc(said)}): '
        "a smaller run than the full one, not for conclusions.</p>"
    )


def table(
    header: Sequence[str],
    rows: Iterable[Sequence[str]],
    cls: Sequence[str] = (),
    *,
    ids: Sequence[str] = (),
    quick: bool = False,
    setup: Mapping[str, Any] | None = None,
) -> str:
    """An HTML table of already escaped cells; ``cls`` gives each row's class, ``ids`` its
    id; ``quick`` puts the short quick banner above it (``setup``: the run's, for its facts)."""
    head = "".join(f"<th>{h}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        attr = f' class="{cls[i]}"' if i < len(cls) and cls[i] else ""
        attr += f' id="{ids[i]}"' if i < len(ids) and ids[i] else ""
        body.append(f"<tr{attr}>" + "".join(row) + "</tr>")
    rows_html = "\n".join(body)
    # a wide table scrolls inside its box instead of widening the whole page
    return (
        (quick_banner(setup=setup) if quick else "")
        + f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>\n{rows_html}'
        "</tbody></table></div>"
    )


def cell(value: object, css: str = "") -> str:
    num = isinstance(value, (int, float)) and not isinstance(value, bool)
    classes = " ".join(c for c in ("num" if num else "", css) if c)
    return (
        f'<td class="{classes}">{esc(fmt(value))}</td>'
        if classes
        else f"<td>{esc(fmt(value))}</td>"
    )


def plain(value: object) -> str:
    """A left-aligned cell, for values of mixed kinds (a setup's)."""
    return f"<td>{esc(fmt(value))}</td>"


def anchor(prefix: str, name: str) -> str:
    """An id from a name: 'exp-block-size', 'claim-vllm-2-4x'."""
    return prefix + "-" + "".join(ch if ch.isalnum() else "-" for ch in name.lower())

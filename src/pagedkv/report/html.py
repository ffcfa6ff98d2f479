"""One self-contained HTML page of every experiment's results and the claims table.

It reads results directories only (the schema every experiment writes: ``results.json``, PNGs
beside it; ``claims/claims.json``), never engine state. The page works offline and alone: images
are embedded as base64 data URIs, the style is inline, nothing is fetched. The same inputs give
byte-identical output (sorted order, no clock, no absolute paths). A small inline script marks
each image as decoded or not once the page has loaded (``data-decoded``), for a browser test.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pagedkv import __version__
from pagedkv.errors import PagedKVError
from pagedkv.io import atomic_write_text
from pagedkv.report import overview
from pagedkv.report.markup import (
    VERDICT_CLASS,
    anchor,
    cell,
    esc,
    fmt,
    fmt_interval,
    is_quick,
    plain,
    quick_banner,
    table,
)
from pagedkv.report.stats import MIN_N
from pagedkv.validation import JsonShape, check_json_shape

__all__ = ["RESULTS_SHAPE", "build_report", "fmt", "fmt_interval", "render"]

ORDER = (
    "lesson",
    "block-map",
    "fragmentation",
    "block-size",
    "memory-pressure",
    "rate-latency",
    "preemption",
)
"""Known experiments come first, in the order a reader meets the story; others follow by name."""
MAX_RAW_ROWS = 500
"""Raw rows shown per experiment (the CSV beside results.json has them all)."""
MIME = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif"}
STYLE = """
body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;
color:#222;line-height:1.45;overflow-wrap:break-word}
h1{border-bottom:2px solid #444}h2{border-bottom:1px solid #bbb;margin-top:2.2em}
table{border-collapse:collapse;margin:.8em 0;font-size:.88em}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f0f0f0}td.num{text-align:right;font-variant-numeric:tabular-nums}
.question{font-style:italic}figure{margin:1em 0}figcaption{font-size:.88em;color:#444}
img{max-width:100%;height:auto;border:1px solid #ddd}.note{color:#a40}
tr.ok td.verdict{background:#dff3df}tr.bad td.verdict{background:#f8dcdc}
tr.mixed td.verdict{background:#fbf0cf}tr.other td.verdict{background:#eee}
tr.beyond td.verdict{background:#d8ebf8}
details{margin:.6em 0}.scroll{overflow-x:auto}code{background:#f4f4f4;padding:0 .2em;
overflow-wrap:anywhere}
.quick{background:#fff4c2;border:1px solid #d9b300;border-left:6px solid #d9b300;
padding:.4em .7em;margin:.6em 0}
"""
SCRIPT = """
window.addEventListener("load", function () {
  var imgs = document.images, ok = 0;
  for (var i = 0; i < imgs.length; i++) {
    var good = imgs[i].complete && imgs[i].naturalWidth > 0;
    imgs[i].setAttribute("data-decoded", good ? "yes" : "no");
    if (good) { ok++; }
  }
  document.body.setAttribute("data-images-decoded", ok + "/" + imgs.length);
  // for a layout test: a page wider than its window scrolls sideways
  document.body.setAttribute("data-scroll-width", document.documentElement.scrollWidth);
  document.body.setAttribute("data-viewport-width", window.innerWidth);
});
"""


RESULTS_SHAPE: JsonShape = {
    "experiment": (str, None),
    "title": (str, None),
    "question": (str, None),
    "setup": (dict, None),
    "columns": (list, str),
    "rows": (list, dict),
    "summary_columns": (list, str),
    "summary": (list, dict),
    "plots": (list, dict),
    "findings": (list, None),
}
"""What the report reads of a results.json, each key optional (the experiments' schema)."""
CLAIMS_SHAPE: JsonShape = {"claims": (list, dict)}


def load_json(path: Path, root: Path, shape: JsonShape | None = None) -> dict[str, Any]:
    """The JSON object of ``path``, its keys of ``shape`` (default: ``RESULTS_SHAPE``) of the
    right types; one error naming the file otherwise."""
    where = str(path.relative_to(root))
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise PagedKVError(f"{where}: cannot be read as JSON ({e})") from None
    check_json_shape(where, data, RESULTS_SHAPE if shape is None else shape, required=False)
    return dict(data)


def within(path: Path, root: Path) -> bool:
    """Does ``path``, links followed, stay inside ``root``? (What the report reads must: a link
    out of the results directory would put any file the user can read into the page.)"""
    try:
        return path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):  # a loop of links
        return False


def find_experiments(results_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    """(directory, results) of every directory under ``results_dir`` with a results.json
    (none reached through a link that leads out of it)."""
    found = [
        (p.parent, load_json(p, results_dir))
        for p in results_dir.rglob("results.json")
        if within(p, results_dir)
    ]

    def key(item: tuple[Path, dict[str, Any]]) -> tuple[int, str]:
        name = str(item[1].get("experiment", item[0].name))
        rank = ORDER.index(name) if name in ORDER else len(ORDER)
        return rank, item[0].relative_to(results_dir).as_posix()

    return sorted(found, key=key)


def summary_table(results: Mapping[str, Any]) -> str:
    """Configuration columns, then one 'mean [ci_low, ci_high]' column per metric, then n;
    where n is below ``MIN_N`` and there is no interval, a note says so (means only)."""
    summary = results.get("summary") or []
    quick = is_quick(results)
    if not summary:
        return '<p class="note">No summary table.</p>'
    columns = list(results.get("summary_columns") or summary[0])
    metrics = [c[: -len("_mean")] for c in columns if c.endswith("_mean")]
    derived = {f"{m}_{s}" for m in metrics for s in ("mean", "ci_low", "ci_high")}
    config = [c for c in columns if c not in derived and c != "n"]

    def bare(s: Mapping[str, Any]) -> bool:  # a mean without its interval
        return any(s.get(f"{m}_mean") is not None and s.get(f"{m}_ci_low") is None for m in metrics)

    small = sorted(
        {s["n"] for s in summary if isinstance(s.get("n"), int) and s["n"] < MIN_N and bare(s)}
    )
    some = any(s.get(f"{m}_ci_low") is not None for s in summary for m in metrics)
    what = "mean [95% CI]" if some or not small else "mean"
    header = [esc(c) for c in config] + [esc(m) + f" <small>{what}</small>" for m in metrics]
    header += ["n"] if "n" in columns else []
    rows = []
    for s in summary:
        row = [cell(s.get(c)) for c in config]
        for m in metrics:
            text = fmt_interval(s.get(f"{m}_mean"), s.get(f"{m}_ci_low"), s.get(f"{m}_ci_high"))
            row.append(f'<td class="num">{esc(text)}</td>')
        row += [cell(s.get("n"))] if "n" in columns else []
        rows.append(row)
    note = (
        f'<p class="note">n = {esc(", ".join(map(str, small)))}: n too small for an interval '
        f"(it needs {MIN_N} seeds or more), so those rows show means only.</p>"
        if small
        else ""
    )
    return note + table(header, rows, quick=quick, setup=results.get("setup"))


def raw_table(results: Mapping[str, Any]) -> str:
    rows = results.get("rows") or []
    if not rows:
        return ""
    columns = list(results.get("columns") or rows[0])
    shown = rows[:MAX_RAW_ROWS]
    more = f", the first {len(shown)} shown (all in results.csv)" if len(rows) > len(shown) else ""
    body = table(
        [esc(c) for c in columns],
        ([cell(r.get(c)) for c in columns] for r in shown),
        quick=is_quick(results),
        setup=results.get("setup"),
    )
    return f"<details><summary>Raw rows ({len(rows)}{more})</summary>{body}</details>"


def embed(directory: Path, name: str) -> str | None:
    """A data URI of the image ``name`` in ``directory``, or None if it cannot be embedded
    (not an image by its suffix, not a file, or a link that leads out of ``directory``)."""
    path = directory / name
    mime = MIME.get(path.suffix.lower())
    if mime is None or Path(name).is_absolute() or ".." in Path(name).parts or not path.is_file():
        return None
    if not within(path, directory):
        return None
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def figures(directory: Path, plots: Sequence[Mapping[str, Any]]) -> str:
    out = []
    for plot in plots:
        name, caption = str(plot.get("file", "")), str(plot.get("caption", ""))
        uri = embed(directory, name)
        if uri is None:
            out.append(f'<p class="note">Plot {esc(name)} is missing or not an image.</p>')
            continue
        out.append(
            f'<figure><img src="{uri}" alt="{esc(caption or name)}">'
            f"<figcaption>{esc(caption)}</figcaption></figure>"
        )
    return "\n".join(out)


def experiment_section(where: str, directory: Path, e: overview.Entry) -> str:
    results = e.results
    title = results.get("title") or results.get("experiment") or directory.name
    setup = results.get("setup") or {}
    quick = is_quick(results)
    parts = [
        f'<section id="{e.anchor}"><h2>{esc(title)}</h2>',
        f"<p><code>{esc(where)}</code>: <code>{esc(overview.command(e))}</code></p>",
        f'<p class="question">{esc(results.get("question", ""))}</p>',
        "<h3>Setup</h3>",
        table(
            ["setting", "value"],
            ([cell(k), plain(setup[k])] for k in sorted(setup)),
            quick=quick,
            setup=setup,
        ),
        "<h3>Summary</h3>",
        summary_table(results),
        raw_table(results),
    ]
    findings = results.get("findings") or []
    if findings:
        items = "".join(f"<li>{esc(f)}</li>" for f in findings)
        parts.append(f"<h3>Findings</h3><ul>{items}</ul>")
    plots = results.get("plots") or []
    if plots:
        parts += ["<h3>Plots</h3>", figures(directory, plots)]
    parts.append("</section>")
    return "\n".join(p for p in parts if p)


def claims_section(
    claims: Sequence[Mapping[str, Any]], anchors: Mapping[str, str], *, quick: bool = False
) -> str:
    header = [
        "id",
        "source",
        "statement",
        "claimed range",
        "source states it",
        "measured under",
        "time model",
        "metric",
        "measured [95% CI]",
        "verdict",
        "each measurement",
        "evidence",
    ]
    rows, classes = [], []
    for c in claims:
        measured = fmt_interval(c.get("measured"), c.get("ci_low"), c.get("ci_high"))
        unit = (c.get("unit") or "") if c.get("measured") is not None else ""
        evidence = str(c.get("evidence") or "")
        link = (
            f'<a href="#{anchors[evidence]}">{esc(evidence)}</a>'
            if evidence in anchors
            else esc(evidence)
        )
        verdict = str(c.get("verdict", ""))
        classes.append(VERDICT_CLASS.get(verdict, "other"))
        rows.append(
            [
                cell(c.get("id")),
                cell(c.get("source")),
                cell(c.get("statement")),
                cell(c.get("claimed") or "-"),
                cell(c.get("citation") or "-"),
                cell(c.get("condition") or "-"),
                cell(c.get("time_model") or "none"),
                cell(c.get("metric")),
                f'<td class="num">{esc(measured)}{" " + esc(unit) if unit else ""}</td>',
                f'<td class="verdict">{esc(verdict)}</td>',
                cell(c.get("judged") or "-"),
                f"<td>{link}</td>",
            ]
        )
    ids = [anchor("claim", str(c.get("id"))) for c in claims]
    return (
        '<section id="claims"><h2>Claims</h2>'
        + (quick_banner() if quick else "")
        + f"<p>{overview.tally(claims)}. Each verdict is computed from the measured values "
        "and their intervals, never typed by hand: <strong>supported</strong> (the interval "
        "inside the claimed range), <strong>exceeds</strong> (beyond it in the claim's "
        "favour), <strong>inconclusive</strong> (it straddles a bound; the seeds that would "
        "decide it are estimated), <strong>contradicted</strong> (outside it against the "
        "claim), <strong>not measured</strong> (no data). A claim measured under several "
        "conditions takes the least favourable.</p>"
        + table(header, rows, classes, ids=ids, quick=quick)
        + "</section>"
    )


def load_timings(results_dir: Path) -> dict[str, Any] | None:
    """timings.json of ``results_dir`` (``overview.TIMINGS``), or None where there is none."""
    path = overview.timings_path(results_dir)
    if not path.is_file() or not within(path, results_dir):
        return None
    return load_json(path, results_dir, overview.TIMINGS_SHAPE)


def render(results_dir: Path) -> str:
    """The page's text (raises ``PagedKVError`` when there is nothing to report)."""
    experiments = find_experiments(results_dir)
    claims_path = results_dir / "claims" / "claims.json"
    if not within(claims_path, results_dir):
        raise PagedKVError(f"{claims_path}: a link out of {results_dir}: refused")
    claims = (
        load_json(claims_path, results_dir, CLAIMS_SHAPE).get("claims", [])
        if claims_path.is_file()
        else []
    )
    if not experiments and not claims_path.is_file():
        raise PagedKVError(
            f"no results in {results_dir}: no results.json below it and no claims/claims.json "
            "(run `pagedkv reproduce` or `pagedkv experiment NAME` first)"
        )
    anchors: dict[str, str] = {}
    entries: list[overview.Entry] = []
    sections, index = [], ['<li><a href="#summary">Summary</a></li>']
    for directory, results in experiments:
        name = str(results.get("experiment") or directory.name)
        tag = anchor("exp", name)
        while tag in anchors.values():  # the same experiment in two directories
            tag += "-2"
        anchors.setdefault(name, tag)
        where = directory.relative_to(results_dir).as_posix()
        entry = overview.Entry(name, results, tag, where)
        entries.append(entry)
        title = results.get("title") or name
        index.append(f'<li><a href="#{tag}">{esc(title)}</a> <small>({esc(where)})</small></li>')
        sections.append(experiment_section(where, directory, entry))
    quick = {e.name: is_quick(e.results) for e in entries}
    claims_quick = any(quick.get(str(c.get("evidence")), False) for c in claims)
    if claims_path.is_file():
        index.append('<li><a href="#claims">Claims</a></li>')
        sections.append(claims_section(claims, anchors, quick=claims_quick))
    first = overview.summary_section(
        entries,
        claims if claims_path.is_file() else None,
        anchors,
        load_timings(results_dir),
        claims_quick=claims_quick,
    )
    banner = quick_banner("this page") if any(quick.values()) or claims_quick else ""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>pagedkv results</title>\n<style>{STYLE}</style></head>\n<body>\n"
        f"<h1>pagedkv results</h1>\n{banner}\n{first}\n<p>Written by pagedkv "
        f"{esc(__version__)}. Every figure is a mean over seeds with its 95% percentile-bootstrap "
        f"interval where there are {MIN_N} seeds or more.</p>\n"
        f"<nav><h2>Contents</h2><ul>{''.join(index)}</ul></nav>\n"
        + "\n".join(sections)
        + f"\n<script>{SCRIPT}</script>\n</body></html>\n"
    )


def build_report(results_dir: Path, out: Path | None = None) -> Path:
    """Write the page (default ``results_dir / "report.html"``, atomically); return its path."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise PagedKVError(f"no results in {results_dir}: it is not a directory")
    path = Path(out) if out is not None else results_dir / "report.html"
    return atomic_write_text(path, render(results_dir))

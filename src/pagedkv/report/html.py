"""One self-contained HTML page of every experiment's results and the claims table.

It reads results directories only (the schema every experiment writes: ``results.json``, PNGs
beside it; ``claims/claims.json``), never engine state. The page works offline and alone: images
are embedded as base64 data URIs, the style is inline, nothing is fetched. The same inputs give
byte-identical output (sorted order, no clock, no absolute paths). A small inline script marks
each image as decoded or not once the page has loaded (``data-decoded``), for a browser test.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pagedkv import __version__
from pagedkv.errors import PagedKVError
from pagedkv.io import atomic_write_text
from pagedkv.validation import JsonShape, check_json_shape

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
VERDICT_CLASS = {
    "supported": "ok",
    "exceeds": "beyond",
    "inconclusive": "mixed",
    "contradicted": "bad",
    "not measured": "other",
}
"""The five verdicts of ``pagedkv.experiments.verdict``, by row class (the report reads
claims.json, never the engine, so the names are repeated here)."""

STYLE = """
body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;
color:#222;line-height:1.45}
h1{border-bottom:2px solid #444}h2{border-bottom:1px solid #bbb;margin-top:2.2em}
table{border-collapse:collapse;margin:.8em 0;font-size:.88em}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f0f0f0}td.num{text-align:right;font-variant-numeric:tabular-nums}
.question{font-style:italic}figure{margin:1em 0}figcaption{font-size:.88em;color:#444}
img{max-width:100%;height:auto;border:1px solid #ddd}.note{color:#a40}
tr.ok td.verdict{background:#dff3df}tr.bad td.verdict{background:#f8dcdc}
tr.mixed td.verdict{background:#fbf0cf}tr.other td.verdict{background:#eee}
tr.beyond td.verdict{background:#d8ebf8}
details{margin:.6em 0}.scroll{overflow-x:auto}code{background:#f4f4f4;padding:0 .2em}
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
});
"""


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


def table(header: Sequence[str], rows: Iterable[Sequence[str]], cls: Sequence[str] = ()) -> str:
    """An HTML table of already escaped cells; ``cls`` gives each row's class."""
    head = "".join(f"<th>{h}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        attr = f' class="{cls[i]}"' if i < len(cls) and cls[i] else ""
        body.append(f"<tr{attr}>" + "".join(row) + "</tr>")
    rows_html = "\n".join(body)
    # a wide table scrolls inside its box instead of widening the whole page
    return (
        f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>\n{rows_html}'
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


def summary_table(results: Mapping[str, Any]) -> str:
    """Configuration columns, then one 'mean [ci_low, ci_high]' column per metric, then n."""
    summary = results.get("summary") or []
    if not summary:
        return '<p class="note">No summary table.</p>'
    columns = list(results.get("summary_columns") or summary[0])
    metrics = [c[: -len("_mean")] for c in columns if c.endswith("_mean")]
    derived = {f"{m}_{s}" for m in metrics for s in ("mean", "ci_low", "ci_high")}
    config = [c for c in columns if c not in derived and c != "n"]
    header = [esc(c) for c in config] + [esc(m) + " <small>mean [95% CI]</small>" for m in metrics]
    header += ["n"] if "n" in columns else []
    rows = []
    for s in summary:
        row = [cell(s.get(c)) for c in config]
        for m in metrics:
            text = fmt_interval(s.get(f"{m}_mean"), s.get(f"{m}_ci_low"), s.get(f"{m}_ci_high"))
            row.append(f'<td class="num">{esc(text)}</td>')
        row += [cell(s.get("n"))] if "n" in columns else []
        rows.append(row)
    return table(header, rows)


def raw_table(results: Mapping[str, Any]) -> str:
    rows = results.get("rows") or []
    if not rows:
        return ""
    columns = list(results.get("columns") or rows[0])
    shown = rows[:MAX_RAW_ROWS]
    more = f", the first {len(shown)} shown (all in results.csv)" if len(rows) > len(shown) else ""
    body = table([esc(c) for c in columns], ([cell(r.get(c)) for c in columns] for r in shown))
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


def experiment_section(anchor: str, directory: Path, where: str, results: dict[str, Any]) -> str:
    title = results.get("title") or results.get("experiment") or directory.name
    setup = results.get("setup") or {}
    parts = [
        f'<section id="{anchor}"><h2>{esc(title)}</h2>',
        f"<p><code>{esc(where)}</code></p>",
        f'<p class="question">{esc(results.get("question", ""))}</p>',
        "<h3>Setup</h3>",
        table(["setting", "value"], ([cell(k), plain(setup[k])] for k in sorted(setup))),
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
    return "\n".join(parts)


def claims_section(claims: Sequence[Mapping[str, Any]], anchors: Mapping[str, str]) -> str:
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
    known = [v for v in VERDICT_CLASS if any(c.get("verdict") == v for c in claims)]
    others = sorted({str(c.get("verdict")) for c in claims} - set(VERDICT_CLASS))
    tally = ", ".join(
        f"{sum(c.get('verdict') == v for c in claims)} {esc(v)}" for v in known + others
    )
    return (
        '<section id="claims"><h2>Claims</h2>'
        f"<p>{len(claims)} claims: {tally}. Each verdict is computed from the measured values "
        "and their intervals, never typed by hand: <strong>supported</strong> (the interval "
        "inside the claimed range), <strong>exceeds</strong> (beyond it in the claim's "
        "favour), <strong>inconclusive</strong> (it straddles a bound; the seeds that would "
        "decide it are estimated), <strong>contradicted</strong> (outside it against the "
        "claim), <strong>not measured</strong> (no data). A claim measured under several "
        "conditions takes the least favourable.</p>" + table(header, rows, classes) + "</section>"
    )


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
    sections, index = [], []
    for directory, results in experiments:
        name = str(results.get("experiment") or directory.name)
        anchor = "exp-" + "".join(ch if ch.isalnum() else "-" for ch in name.lower())
        while anchor in anchors.values():  # the same experiment in two directories
            anchor += "-2"
        anchors.setdefault(name, anchor)
        where = directory.relative_to(results_dir).as_posix()
        title = results.get("title") or name
        index.append(f'<li><a href="#{anchor}">{esc(title)}</a> <small>({esc(where)})</small></li>')
        sections.append(experiment_section(anchor, directory, where, results))
    if claims_path.is_file():
        index.append('<li><a href="#claims">Claims</a></li>')
        sections.append(claims_section(claims, anchors))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>pagedkv results</title>\n<style>{STYLE}</style></head>\n<body>\n"
        f"<h1>pagedkv results</h1>\n<p>Written by pagedkv {esc(__version__)}. Every figure is a "
        "mean with its 95% confidence interval over seeds where there are several.</p>\n"
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

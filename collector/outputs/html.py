"""The report as one self-contained HTML page (report.html): no request leaves it (inline CSS and script, the
plots embedded as data: URIs, a Content-Security-Policy that forbids anything else). It reads like report.md: the
environment per host, then every section of report.md (collector.outputs.markdown) in its order and with its
tables, each as a table of its own that fits the window; then the history of this run's cells, the full tables
(every column, sortable by any), the plots, the failures with their log tails, and the problems met while reading
the results."""
from __future__ import annotations

import base64
import re
from html import escape
from pathlib import Path
from typing import Any, Iterable, Optional

import pandas as pd

from agent.bounded import BoundError, open_regular

from .. import crossover
from ..environment import environment
from ..results import ConfigResult, Run
from ..vocab import cell_words
from ..vocab import na as _na
from . import markdown

LOG_LINES = 40  # the end of a failed config's server.log shown
LOG_BYTES = 64 << 10  # read from the end of server.log for those lines (the whole log may be large)
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #1a1a1a; }
h1 { font-size: 1.5em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; } h3 { font-size: 1.05em; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 12px; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
thead th { background: #f2f2f2; position: sticky; top: 0; }
table.sortable th { cursor: pointer; user-select: none; white-space: nowrap; }
th[aria-sort=ascending]::after { content: " \\25B2"; } th[aria-sort=descending]::after { content: " \\25BC"; }
.scroll, .fit { overflow-x: auto; }
th.num { text-align: right; }
#full-table td, #pays-table td { white-space: nowrap; }
p, ul { max-width: 80em; }
nav a { margin-right: 1em; }
.bad { color: #a40000; }
dl.env { display: grid; grid-template-columns: max-content auto; gap: 2px 1em; }
dl.env dt { font-weight: 600; } dl.env dd { margin: 0; }
figure { margin: 1em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
pre { background: #f7f7f7; padding: 0.5em; overflow-x: auto; max-width: 100ch; font-size: 11px; }
pre.lines { max-width: none; white-space: pre-wrap; }
summary { cursor: pointer; }
"""

# Click a header to sort by its column (again: the other way); numeric columns compare as numbers, empty cells
# go last either way.
SCRIPT = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  var heads = table.tHead.rows[0].cells;
  Array.prototype.forEach.call(heads, function (th, col) {
    th.addEventListener("click", function () {
      var dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
      var numeric = th.dataset.type === "num";
      Array.prototype.forEach.call(heads, function (h) { h.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", dir === 1 ? "ascending" : "descending");
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      function key(row) {
        var cell = row.cells[col];
        return numeric ? cell.dataset.v : cell.textContent;
      }
      rows.sort(function (a, b) {
        var x = key(a), y = key(b);
        if (x === "" || x === undefined) { return (y === "" || y === undefined) ? 0 : 1; }
        if (y === "" || y === undefined) { return -1; }
        return dir * (numeric ? Number(x) - Number(y) : x.localeCompare(y));
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
"""


def _e(v: Any) -> str:
    return escape(str(v), quote=True)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _shown(v: Any) -> str:
    """A value as the page shows it: floats to four significant digits, empty for none."""
    if _na(v):
        return ""
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _cell(header: str, text: str, right: bool = False) -> str:
    """A cell of text: right-aligned (a number), and marked bad where it says the config failed or was skipped."""
    bad = text.startswith(("failed", "skipped")) or (header == "status" and text not in ("", "ok"))
    classes = " ".join(c for c, on in (("num", right), ("bad", bad)) if on)
    return f'<td class="{classes}">{_e(text)}</td>' if classes else f"<td>{_e(text)}</td>"


def _table(frame: pd.DataFrame, table_id: str = "", sortable: bool = False) -> str:
    """A frame as an HTML table; a column whose values are all numbers is right-aligned and, in a sortable table,
    sorted by value (each cell carries it in data-v)."""
    records = [dict(zip(frame.columns, (v.item() if hasattr(v, "item") else v for v in values)))
               for values in frame.values]
    numeric = {c: all(_number(r[c]) for r in records if not _na(r[c])) and any(not _na(r[c]) for r in records)
               for c in frame.columns}
    kind = {True: ' data-type="num"', False: ""}
    head = "".join(f'<th scope="col"{kind[numeric[c]]}>{_e(c)}</th>' for c in frame.columns)
    body = []
    for r in records:
        cells = []
        for c in frame.columns:
            v = r[c]
            if numeric[c]:
                cells.append(f'<td class="num" data-v="{"" if _na(v) else _e(repr(float(v)))}">{_e(_shown(v))}</td>')
            else:
                cells.append(_cell(str(c), _shown(v)))
        body.append("<tr>" + "".join(cells) + "</tr>")
    attrs = (f' id="{_e(table_id)}"' if table_id else "") + (' class="sortable"' if sortable else "")
    return (f'<div class="scroll"><table{attrs}><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div>")


def _inline(text: str) -> str:
    """A line of report.md's text as HTML: escaped, its `code` spans and *emphasis* marked up."""
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", _e(text))
    return re.sub(r"(?<![\w*])\*(\S(?:[^*]*\S)?)\*(?![\w*])", r"<em>\1</em>", out)


NUM = {True: ' class="num"', False: ""}


def _pipe_table(lines: list[str]) -> str:
    """A pipe table of report.md (tabulate's layout) as an HTML table of the same header and cells, its right-aligned
    columns (numbers) right-aligned; one whose lines do not split into its header's cells (a `|` inside a cell) as
    the text it is."""
    rows = [[c.strip() for c in line.strip()[1:-1].split("|")] for line in lines]
    if (len(rows) < 2 or any(len(r) != len(rows[0]) for r in rows)
            or not all(re.fullmatch(r":?-+:?", c) for c in rows[1])):
        return "<pre>" + _e("\n".join(lines)) + "</pre>"
    head, right = rows[0], [c.endswith(":") and not c.startswith(":") for c in rows[1]]
    ths = "".join(f'<th scope="col"{NUM[r]}>{_e(h)}</th>' for h, r in zip(head, right))
    body = "".join("<tr>" + "".join(_cell(h, t, r) for h, t, r in zip(head, row, right)) + "</tr>"
                   for row in rows[2:])
    return f'<div class="fit"><table class="md"><thead><tr>{ths}</tr></thead><tbody>{body}</tbody></table></div>'


def from_markdown(lines: list[str]) -> list[str]:
    """The lines under a heading of report.md (what collector.outputs.markdown writes) as HTML: `### ` headings,
    paragraphs and list items (their lines, wrapped to fit a terminal, joined again: the page wraps them), pipe
    tables as tables (each of report.md's tables as it is there, those split by columns to fit 120 columns too)
    and code blocks."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
        elif line.startswith("```"):
            j = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), len(lines))
            out.append("<pre>" + _e("\n".join(lines[i + 1:j])) + "</pre>")
            i = j + 1
        elif line.startswith("### "):
            out.append(f"<h3>{_inline(line[4:])}</h3>")
            i += 1
        elif line.startswith("|"):
            j = next((j for j in range(i, len(lines)) if not lines[j].startswith("|")), len(lines))
            out.append(_pipe_table(lines[i:j]))
            i = j
        elif line.startswith("- "):
            items: list[str] = []
            while i < len(lines) and (lines[i].startswith("- ") or (lines[i].startswith(" ") and lines[i].strip())):
                if lines[i].startswith("- "):
                    items.append(lines[i][2:])
                else:  # a list item's line wrapped
                    items[-1] += " " + lines[i].strip()
                i += 1
            out.append("<ul>" + "".join(f"<li>{_inline(t)}</li>" for t in items) + "</ul>")
        else:
            j = next((j for j in range(i + 1, len(lines)) if not lines[j].strip()
                      or lines[j].startswith(("|", "- ", "### ", "```"))), len(lines))
            out.append("<p>" + _inline(" ".join(x.strip() for x in lines[i:j])) + "</p>")
            i = j
    return out


def markdown_sections(text: str) -> list[tuple[str, list[str]]]:
    """report.md's `## ` sections in order, each (its heading, the lines under it); what comes before the first,
    the run's name, is left out."""
    sections: list[tuple[str, list[str]]] = []
    fenced = False
    for line in text.splitlines():
        if not fenced and line.startswith("## "):
            sections.append((line[3:], []))
            continue
        if line.startswith("```"):
            fenced = not fenced
        if sections:
            sections[-1][1].append(line)
    return sections


# report.md's sections that the page shows its own way: the environment as a list of facts per host, the problems
# each as an item of a list (report.md keeps them in a code block, each whole on its line)
OWN = ("Environment", "Problems in the results (skipped)")
# a section's id and its link's words, by how its heading starts; any other: its heading, made an id
NAMED = (("Speedup vs", "by-workload", "by workload"), ("Checks that did not pass", "checks", "checks"),
         ("Where speculation pays", "pays", "where it pays"), ("Baseline alone vs packed", "pack-check", "pack check"),
         ("Across hosts", "across-hosts", "across hosts and engines"),
         ("DDTree budgets", "ddtree-vs-dflash", "DDTree vs DFlash"),
         ("Acceptance per config", "acceptance", "acceptance per config"),
         ("Time per config", "timing", "time per config"))


def _named(heading: str) -> tuple[str, str]:
    for start, sid, label in NAMED:
        if heading.startswith(start):
            return sid, label
    return "md-" + (re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-") or "section"), heading


def _section(sid: str, heading: str, parts: list[str]) -> list[str]:
    return ["<section>", f'<h2 id="{_e(sid)}">{_inline(heading)}</h2>', *parts, "</section>"]


def _header(run: Run) -> list[str]:
    meta = run.meta
    about = [(k, meta.get(k)) for k in ("suite", "started_at", "finished_at", "project_version")]
    return [f"<h1>Run {_e(meta.get('run_id', run.root.name))}</h1>",
            "<p>" + "; ".join(f"{_e(k)}: {_e(v)}" for k, v in about if not _na(v) and v != "") + "</p>"]


def _environment(run: Run, df: pd.DataFrame) -> list[str]:
    """Per host, what it was measured on; then, as report.md has it, each config's cells one line each."""
    out = []
    for host, pairs in environment(run).items():
        out.append(f"<h3>{_e(host)}</h3>")
        out.append('<dl class="env">' + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in pairs) + "</dl>"
                   if pairs else "<p>no host facts recorded</p>")
    lines = markdown.hand_run_lines(df)
    if lines:
        out.append('<details open><summary>Each config, a line per cell (as the hand-run printed)</summary>'
                   f'<pre class="lines">{_e(chr(10).join(lines))}</pre></details>')
    return _section("environment", "Environment", out)


def _full(df: pd.DataFrame) -> list[str]:
    """The tables whole, sortable: the speedup table (report.csv's columns) and where speculation pays
    (collector.crossover), which report.md and the sections above show in words."""
    out = ["<p>Every column of report.csv, a row per config and cell. Click a column's header to sort by it; again "
           "to reverse.</p>", _table(df, "full-table", sortable=True)]
    pays = crossover.table(df)
    if not pays.empty:
        out += ['<h3 id="pays-full">Where speculation pays, every column</h3>',
                "<p>A row per config and cell swept over loads (collector.crossover): the numbers behind the section "
                "above.</p>", _table(pays, "pays-table", sortable=True)]
    return _section("full", "Full table", out)


def _plots(plots: Iterable[Path]) -> list[str]:
    out = []
    pngs = [p for p in plots if p.suffix == ".png"]
    for p in pngs:
        data = base64.b64encode(p.read_bytes()).decode("ascii")
        out.append(f'<figure><img src="data:image/png;base64,{data}" alt="{_e(p.stem)}">'
                   f"<figcaption>{_e(p.stem)} (also {_e(p.stem)}.svg)</figcaption></figure>")
    return _section("plots", "Plots", out if pngs else ["<p>No plots.</p>"])


def log_tail(c: ConfigResult, root: Path) -> str:
    """The last LOG_LINES lines of the config's server.log as the results folder holds it (its last LOG_BYTES);
    status.json's log_tail when the folder has no server.log, and when what is there is not a regular file (a FIFO
    is never waited on, a device never read without end), after a line that names it."""
    path = root / c.host / c.config_id / "server.log"
    kept = str(c.status.get("log_tail") or "")
    try:
        with open_regular(path) as f:
            f.seek(max(f.seek(0, 2) - LOG_BYTES, 0))
            text = f.read(LOG_BYTES).decode("utf-8", errors="replace")
    except BoundError as exc:
        return f"{exc}: not read; the tail status.json keeps:\n{kept}".rstrip()
    except OSError:
        return kept
    return "\n".join(text.splitlines()[-LOG_LINES:])


def _failures(run: Run) -> list[str]:
    bad = [c for c in run.configs if c.status.get("status") != "ok"]
    if not bad:
        return _section("failures", "Failed and skipped configs", ["<p>None: every config ended ok.</p>"])
    rows = []
    for c in bad:
        tail = log_tail(c, run.root)
        log = (f"<details><summary>server.log, last lines</summary><pre>{_e(tail)}</pre></details>"
               if tail else "no log")
        rows.append(f'<tr class="failure" data-config="{_e(c.config_id)}"><td>{_e(c.host)}</td>'
                    f"<td>{_e(c.config_id)}</td><td class=\"bad\">{_e(c.status.get('status'))}</td>"
                    f"<td class=\"bad reason\">{_e(c.status.get('reason') or '')}</td>"
                    f"<td>{_e(c.status.get('detail') or '')}</td><td>{log}</td></tr>")
    head = "".join(f"<th>{h}</th>" for h in ("host", "config", "status", "reason", "detail", "log tail"))
    return _section("failures", "Failed and skipped configs",
                    [f'<div class="scroll"><table id="failures-table"><thead><tr>{head}</tr></thead>'
                     f"<tbody>{''.join(rows)}</tbody></table></div>"])


def _problems(problems: list[str]) -> list[str]:
    if not problems:
        return []
    return _section("problems", "Problems in the results (skipped)",
                    ["<ul>", *[f"<li>{_e(p)}</li>" for p in problems], "</ul>"])


def _history(run: Run, history: list[dict[str, Any]]) -> list[str]:
    """Per cell of this run that has earlier runs in the history store: this run's tok/s against the previous
    run's, whether it is outside the previous runs' spread, and what changed since."""
    run_id = str(run.meta.get("run_id") or run.root.name)
    count: dict[tuple[Any, ...], int] = {}
    before: dict[tuple[Any, ...], dict[str, Any]] = {}
    rows = []
    for p in history:
        key = (p["host"], p["engine"], p["config_id"], cell_words(p))  # its series (collector.history.SERIES)
        count[key] = count.get(key, 0) + 1
        if p["run_id"] != run_id:
            before[key] = p
            continue
        if key not in before:
            continue
        prev = before[key]
        rows.append({"host": p["host"], "config": p["config_id"], "cell": key[3], "runs": count[key],
                     "previous run": prev["run_id"], "previous tok/s": prev["tok_s_mean"],
                     "tok/s": p["tok_s_mean"], "speedup": p["speedup"],
                     "outside the previous runs' spread": ", ".join(p["outside"]),
                     "changed since the previous run": "; ".join(p["changes"])})
    if not rows:
        return _section("history", "History", [
            "<p>No earlier run of this run's cells in the history store (<code>specfleet db</code> builds it from the "
            "results folder; <code>bench.yml</code> updates it at the end of every run).</p>"])
    frame = pd.DataFrame(rows)
    return _section("history", "History", [
            f"<p>{len(rows)} cells of this run were measured by earlier runs (the history store, "
            "<code>specfleet history</code>): this run against the previous one, whether its interval lies "
            "outside the spread of the previous runs, and what changed on the host or in the config since. The "
            "trend plots below draw each cell over the runs.</p>", _table(frame, "history-table", sortable=True)])


def render(run: Run, df: pd.DataFrame, plots: list[Path], history: Optional[list[dict[str, Any]]] = None) -> str:
    """The page: `df` is tables.table(run), `plots` the files plots.write wrote (their PNGs are embedded),
    `history` its cells' earlier runs (collector.history.for_run)."""
    name = f"specfleet run {run.meta.get('run_id', run.root.name)}"
    sections = [("environment", "environment", _environment(run, df))]
    for heading, lines in markdown_sections(markdown.render(run, df)):
        if heading not in OWN:
            sid, label = _named(heading)
            sections.append((sid, label, _section(sid, heading, from_markdown(lines) or ["<p>No rows.</p>"])))
    sections += [("history", "history", _history(run, history or [])), ("full", "full table", _full(df)),
                 ("plots", "plots", _plots(plots)), ("failures", "failures", _failures(run))]
    if run.problems:
        sections.append(("problems", "problems", _problems(run.problems)))
    nav = "<nav>" + "".join(f'<a href="#{_e(sid)}">{_e(label)}</a>' for sid, label, _ in sections) + "</nav>"
    body = [*_header(run), nav, *(part for _, _, parts in sections for part in parts)]
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">', '<link rel="icon" href="data:,">',
        f"<title>{_e(name)}</title>", f"<style>{STYLE}</style>", "</head>", "<body>", *body,
        f"<script>{SCRIPT}</script>", "</body>", "</html>", ""])

"""The report as one self-contained HTML page (report.html): no request leaves it (inline CSS and script, the
plots embedded as data: URIs, a Content-Security-Policy that forbids anything else). It holds the environment per
host, the speedup tables with the methods as columns, the full table sortable by any column, the plots, the
failures with their log tails, and the problems met while reading the results."""
from __future__ import annotations

import base64
from html import escape
from pathlib import Path
from typing import Any, Iterable, Optional

import pandas as pd

from agent.bounded import BoundError, open_regular

from .. import crossover
from ..environment import environment
from ..load import ConfigResult, Run
from ..views import KEYS, by_workload, outcomes
from ..views import na as _na

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
.scroll { overflow-x: auto; }
#full-table td { white-space: nowrap; }
nav a { margin-right: 1em; }
.bad { color: #a40000; }
dl.env { display: grid; grid-template-columns: max-content auto; gap: 2px 1em; }
dl.env dt { font-weight: 600; } dl.env dd { margin: 0; }
figure { margin: 1em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
pre { background: #f7f7f7; padding: 0.5em; overflow-x: auto; max-width: 100ch; font-size: 11px; }
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
                text = _shown(v)
                bad = text.startswith(("failed", "skipped")) or (c == "status" and text not in ("", "ok"))
                cells.append(f'<td class="bad">{_e(text)}</td>' if bad else f"<td>{_e(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    attrs = (f' id="{_e(table_id)}"' if table_id else "") + (' class="sortable"' if sortable else "")
    return (f'<div class="scroll"><table{attrs}><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div>")


def _header(run: Run) -> list[str]:
    meta = run.meta
    about = [(k, meta.get(k)) for k in ("suite", "started_at", "finished_at", "project_version")]
    out = [f"<h1>Run {_e(meta.get('run_id', run.root.name))}</h1>",
           "<p>" + "; ".join(f"{_e(k)}: {_e(v)}" for k, v in about if not _na(v) and v != "") + "</p>"]
    out.append('<nav><a href="#environment">environment</a><a href="#by-workload">by workload</a>'
               '<a href="#pays">where it pays</a><a href="#history">history</a><a href="#full">full table</a>'
               '<a href="#plots">plots</a>'
               '<a href="#failures">failures</a></nav>')
    out.append('<h2 id="environment">Environment</h2>')
    for host, pairs in environment(run).items():
        out.append(f"<h3>{_e(host)}</h3>")
        out.append('<dl class="env">' + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in pairs) + "</dl>"
                   if pairs else "<p>no host facts recorded</p>")
    return out


def _by_workload(run: Run, df: pd.DataFrame) -> list[str]:
    """Per host and tp, a row per cell and a column per method: tok/s (speedup), or why there is none."""
    view = by_workload(df, outcomes(run))
    out = ['<h2 id="by-workload">Speedup by workload</h2>',
           "<p>Per cell: each method's mean output tok/s per request and, in brackets, its speedup over the "
           "autoregressive baseline (AR).</p>"]
    if view.empty:
        return out + ["<p>No rows.</p>"]
    for (host, tp), group in view.groupby(["host", "tp"], sort=False, dropna=False):
        methods = [c for c in group.columns if c not in KEYS and group[c].astype(bool).any()]
        load = ["request_rate"] if group["request_rate"].notna().any() else []
        shown = group[["workload", "max_tokens", "context_tokens", "concurrency", *load, *methods]]
        out += [f"<h3>{_e(host)} tp{_e(_shown(tp))}</h3>", _table(shown)]
    return out


def _pays(df: pd.DataFrame) -> list[str]:
    """Where speculation pays (collector.crossover): a row per config and cell swept over loads; nothing without
    a sweep."""
    pays = crossover.table(df)
    if pays.empty:
        return []
    shown = pays.drop(columns=["engine", "model", "method_params"])
    return ['<h2 id="pays">Where speculation pays</h2>',
            "<p>Per cell swept over loads: each config's best throughput ratio to the baseline and where, the loads "
            "where it is above 1, and the crossover (the load where the ratio falls below 1, interpolated between "
            "the measured loads around it, with its interval); with latency limits, the same for goodput and the "
            "highest load within them. The throughput-latency plots below mark the crossovers.</p>",
            _table(shown, "pays-table", sortable=True)]


def _plots(plots: Iterable[Path]) -> list[str]:
    out = ['<h2 id="plots">Plots</h2>']
    pngs = [p for p in plots if p.suffix == ".png"]
    for p in pngs:
        data = base64.b64encode(p.read_bytes()).decode("ascii")
        out.append(f'<figure><img src="data:image/png;base64,{data}" alt="{_e(p.stem)}">'
                   f"<figcaption>{_e(p.stem)} (also {_e(p.stem)}.svg)</figcaption></figure>")
    return out if pngs else out + ["<p>No plots.</p>"]


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
    out = ['<h2 id="failures">Failed and skipped configs</h2>']
    if not bad:
        return out + ["<p>None: every config ended ok.</p>"]
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
    return out + [f'<div class="scroll"><table id="failures-table"><thead><tr>{head}</tr></thead>'
                  f"<tbody>{''.join(rows)}</tbody></table></div>"]


def _problems(problems: list[str]) -> list[str]:
    if not problems:
        return []
    return ["<h2>Problems in the results (skipped)</h2>", "<ul>", *[f"<li>{_e(p)}</li>" for p in problems], "</ul>"]


def _history(run: Run, history: list[dict[str, Any]]) -> list[str]:
    """Per cell of this run that has earlier runs in the history store: this run's tok/s against the previous
    run's, whether it is outside the previous runs' spread, and what changed since."""
    from ..history import cell_words

    run_id = str(run.meta.get("run_id") or run.root.name)
    count: dict[tuple[Any, ...], int] = {}
    before: dict[tuple[Any, ...], dict[str, Any]] = {}
    rows = []
    for p in history:
        key = (p["host"], p["config_id"], cell_words(p))
        count[key] = count.get(key, 0) + 1
        if p["run_id"] != run_id:
            before[key] = p
            continue
        if key not in before:
            continue
        prev = before[key]
        rows.append({"host": p["host"], "config": p["config_id"], "cell": key[2], "runs": count[key],
                     "previous run": prev["run_id"], "previous tok/s": prev["tok_s_mean"],
                     "tok/s": p["tok_s_mean"], "speedup": p["speedup"],
                     "outside the previous runs' spread": ", ".join(p["outside"]),
                     "changed since the previous run": "; ".join(p["changes"])})
    if not rows:
        return ['<h2 id="history">History</h2>', "<p>No earlier run of this run's cells in the history store "
                "(<code>specfleet db</code> builds it from the results folder; <code>bench.yml</code> updates it at "
                "the end of every run).</p>"]
    frame = pd.DataFrame(rows)
    return ['<h2 id="history">History</h2>',
            f"<p>{len(rows)} cells of this run were measured by earlier runs (the history store, "
            "<code>specfleet history</code>): this run against the previous one, whether its interval lies "
            "outside the spread of the previous runs, and what changed on the host or in the config since. The "
            "trend plots below draw each cell over the runs.</p>", _table(frame, "history-table", sortable=True)]


def render(run: Run, df: pd.DataFrame, plots: list[Path], history: Optional[list[dict[str, Any]]] = None) -> str:
    """The page: `df` is tables.table(run), `plots` the files plots.write wrote (their PNGs are embedded),
    `history` its cells' earlier runs (collector.history.for_run)."""
    name = f"specfleet run {run.meta.get('run_id', run.root.name)}"
    body = [*_header(run), *_by_workload(run, df), *_pays(df), *_history(run, history or []),
            '<h2 id="full">Full table</h2>', "<p>Click a column's header to sort by it; again to reverse.</p>",
            _table(df, "full-table", sortable=True), *_plots(plots), *_failures(run), *_problems(run.problems)]
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">', '<link rel="icon" href="data:,">',
        f"<title>{_e(name)}</title>", f"<style>{STYLE}</style>", "</head>", "<body>", *body,
        f"<script>{SCRIPT}</script>", "</body>", "</html>", ""])

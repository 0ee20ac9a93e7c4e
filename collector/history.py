"""`specfleet history` and `specfleet db --sql`: the history store's answers (collector.store keeps the database).

Per cell (host, engine, config, workload, max_tokens, context, load: a host that changes engine starts a new series
of its cells) its figures over the runs in the store: tok/s, speedup and acceptance length, each with its run's 95%
interval; what changed since the cell's previous run (the host's environment: engine build, driver, GPUs,
specfleet; the config: its server arguments, environment, method parameters); and which figures fell outside the
spread of the previous runs. Worked out in one SQL query (DuckDB's window functions), without pandas, so that it
answers at once.

The spread of the previous N runs of a cell is the band from the lowest to the highest of their 95% intervals (their
means, where a run has no interval); a figure is outside when its own interval lies wholly below or above that band.
A cell needs MIN_PREVIOUS earlier measured runs before any of its figures is judged.

`answer` gives any query's rows as a markdown table, CSV or JSON."""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Optional

from .mdtable import plain_rows
from .store import Busy, Unusable, connect
from .vocab import CELL, cell_words, finite

WINDOW = 5  # the previous runs whose spread a run is judged against
MIN_PREVIOUS = 2
LAST = 10  # runs shown per cell, the newest
SERIES = ["host", "engine", "config_id", *CELL]  # a cell's series: its runs are judged against each other
# (name, what the table calls it, its interval's columns)
FIGURES = [("tok_s", "tok_s_mean", "tok_s_ci_low", "tok_s_ci_high", "tok/s"),
           ("speedup", "speedup", "speedup_ci_low", "speedup_ci_high", "speedup"),
           ("accept_length", "accept_length_mean", "accept_length_ci_low", "accept_length_ci_high", "acceptance")]
FORMATS = ("md", "csv", "json")

_SPREAD = ",\n".join(
    f"count({mean}) OVER prev AS {name}_prev_n, least(min({lo}) OVER prev, min({mean}) OVER prev) AS {name}_band_low, "
    f"greatest(max({hi}) OVER prev, max({mean}) OVER prev) AS {name}_band_high"
    for name, mean, lo, hi, _ in FIGURES)

QUERY = """
WITH points AS (
    SELECT c.host, c.engine, c.config_id, c.workload, c.max_tokens, c.context_tokens, c.concurrency, c.request_rate,
           c.run_id, coalesce(f.finished_at, r.finished_at, r.started_at) AS measured_at, c.status, c.method,
           c.tp, c.n, c.config_digest,
           c.tok_s_mean, c.tok_s_ci_low, c.tok_s_ci_high, c.speedup, c.speedup_ci_low, c.speedup_ci_high,
           c.accept_length_mean, c.accept_length_ci_low, c.accept_length_ci_high,
           h.environment, f.server_args, f.env, f.method_params
    FROM cells c JOIN runs r USING (run_id)
    LEFT JOIN hosts h ON h.run_id = c.run_id AND h.host = c.host
    LEFT JOIN configs f ON f.run_id = c.run_id AND f.host = c.host AND f.config_id = c.config_id
    WHERE {where}
), judged AS (
    SELECT *, row_number() OVER cell AS k, count(*) OVER (PARTITION BY {series}) AS runs,
           lag(run_id) OVER cell AS previous_run, lag(environment) OVER cell AS previous_environment,
           lag(config_digest) OVER cell AS previous_digest, lag(server_args) OVER cell AS previous_server_args,
           lag(env) OVER cell AS previous_env, lag(method_params) OVER cell AS previous_method_params,
           {spread}
    FROM points
    WINDOW cell AS (PARTITION BY {series} ORDER BY measured_at NULLS FIRST, run_id),
           prev AS (cell ROWS BETWEEN {window} PRECEDING AND 1 PRECEDING)
), marked AS (
    SELECT *, {upto} AS upto FROM judged
)
SELECT * EXCLUDE (upto) FROM marked WHERE {shown}
ORDER BY host, engine, config_id, workload, max_tokens, context_tokens, request_rate NULLS FIRST, concurrency,
         measured_at NULLS FIRST, run_id
"""


@dataclass
class Filters:
    host: Optional[str] = None  # glob patterns (an exact name is one)
    config: Optional[str] = None
    workload: Optional[str] = None
    since: Optional[datetime] = None
    last: int = LAST  # 0: every run
    run_id: Optional[str] = None  # only the cells this run measured, up to this run
    window: int = WINDOW


def since(text: str) -> datetime:
    """A --since value: a date (2026-11-06) or a date and time, UTC unless it says otherwise: cells measured from
    then on."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--since {text!r}: not a date (YYYY-MM-DD) or ISO date and time") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def query(con: Any, f: Filters) -> list[dict[str, Any]]:
    """Every shown point of every matching cell, oldest first per cell, with its spread and previous run."""
    where, params, series = ["TRUE"], {}, ", ".join(SERIES)
    for column, name, pattern in (("c.host", "host", f.host), ("c.config_id", "config", f.config),
                                  ("c.workload", "workload", f.workload)):
        if pattern:
            where.append(f"{column} GLOB ${name}")
            params[name] = pattern
    upto = "NULL"
    if f.run_id:  # the cells this run measured, up to this run
        where.append(f"({', '.join('c.' + k for k in SERIES)}) IN (SELECT ({series}) FROM cells WHERE run_id = $run)")
        upto = f"max(CASE WHEN run_id = $run THEN k END) OVER (PARTITION BY {series})"
        params["run"] = f.run_id
    shown = ["k <= coalesce(upto, runs)"]
    if f.since is not None:
        shown.append("measured_at >= $since")
        params["since"] = f.since
    if f.last:
        shown.append(f"coalesce(upto, runs) - k < {int(f.last)}")
    text = QUERY.format(where=" AND ".join(where), series=series, spread=_SPREAD, window=max(int(f.window), 1),
                        upto=upto, shown=" AND ".join(shown))
    cur = con.execute(text, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


# ---------------------------------------------------------------------------------------------------------------
# What a point says: figures outside the spread, and what changed since the previous run
# ---------------------------------------------------------------------------------------------------------------

def outside(p: dict[str, Any]) -> list[str]:
    """`tok/s below`, `speedup above`: each figure whose interval lies wholly outside the spread of the previous
    runs (at least MIN_PREVIOUS measured ones)."""
    out = []
    for name, mean, lo, hi, label in FIGURES:
        m = p[mean]
        if not finite(m) or (p[f"{name}_prev_n"] or 0) < MIN_PREVIOUS:
            continue
        low = p[lo] if finite(p[lo]) else m
        high = p[hi] if finite(p[hi]) else m
        if high < p[f"{name}_band_low"]:
            out.append(f"{label} below")
        elif low > p[f"{name}_band_high"]:
            out.append(f"{label} above")
    return out


def _loads(text: Any) -> Any:
    try:
        return json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None


def _flags(args: Any) -> dict[str, str]:
    """Server arguments as flag -> value (`--enforce-eager` -> ``): a flag's value is the words up to the next
    flag."""
    out: dict[str, str] = {}
    flag = None
    for word in args if isinstance(args, list) else []:
        word = str(word)
        if word.startswith("-") and not _number_text(word):
            flag, value = (word.split("=", 1) + [""])[:2] if word.startswith("--") and "=" in word else (word, "")
            out[flag] = value
        elif flag is not None:
            out[flag] = f"{out[flag]} {word}".strip()
        else:
            out[word] = ""
    return out


def _number_text(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _dict_changes(what: str, a: dict[str, str], b: dict[str, str], sep: str) -> list[str]:
    """`server args: added --max-num-seqs 8`, `env: removed FOO`, `server args: --max-num-seqs 8 → 16`."""
    out = []
    for k in dict.fromkeys([*a, *b]):
        if k not in a:
            out.append(f"{what}: added {k}{sep}{b[k]}" if b[k] != "" else f"{what}: added {k}")
        elif k not in b:
            out.append(f"{what}: removed {k}")
        elif a[k] != b[k]:
            out.append(f"{what}: {k} {a[k] or '(no value)'} → {b[k] or '(no value)'}")
    return out


def environment_changes(before: Any, after: Any) -> list[str]:
    """`sglang a1b2c3 → d4e5f6`, `driver 580.65 → 580.82`: each label of the host's environment
    (collector.environment) whose value differs between two runs."""
    a, b = _loads(before) or {}, _loads(after) or {}
    out = []
    for label in dict.fromkeys([*a, *b]):
        va, vb = a.get(label, "-"), b.get(label, "-")
        if va == vb:
            continue
        if label == "engine commit":  # named by its engine: `sglang a1b2c3 → d4e5f6`
            label = str(b.get("engine") or a.get("engine") or "engine").split()[0] or "engine"
        out.append(f"{label} {va} → {vb}")
    return out


def config_changes(p: dict[str, Any]) -> list[str]:
    """What changed in the config since its previous run: server arguments, environment, method parameters; its
    digest when nothing of those explains the change (the launch command, the cells, the model)."""
    if p["previous_digest"] == p["config_digest"]:
        return []
    out = _dict_changes("server args", _flags(_loads(p["previous_server_args"])), _flags(_loads(p["server_args"])),
                        " ")
    out += _dict_changes("env", {k: str(v) for k, v in (_loads(p["previous_env"]) or {}).items()},
                         {k: str(v) for k, v in (_loads(p["env"]) or {}).items()}, "=")
    if p["previous_method_params"] != p["method_params"]:
        out.append(f"params {p['previous_method_params']} → {p['method_params']}")
    if not out:
        out.append(f"config {str(p['previous_digest'])[:8]} → {str(p['config_digest'])[:8]}")
    return out


def changes(p: dict[str, Any]) -> list[str]:
    """Everything that changed since the cell's previous run; nothing for its first."""
    if p["previous_run"] is None:
        return []
    return [*environment_changes(p["previous_environment"], p["environment"]), *config_changes(p)]


# ---------------------------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------------------------

def _with_interval(p: dict[str, Any], mean: str, lo: str, hi: str, digits: int, suffix: str = "") -> str:
    if not finite(p[mean]):
        return ""
    text = f"{p[mean]:.{digits}f}{suffix}"
    if finite(p[lo]) and finite(p[hi]):
        text += f" ({p[lo]:.{digits}f}–{p[hi]:.{digits}f})"
    return text


def points(con: Any, f: Filters) -> list[dict[str, Any]]:
    """The shown points, each with `outside` and `changes` worked out."""
    got = query(con, f)
    for p in got:
        p["outside"], p["changes"] = outside(p), changes(p)
    return got


def _series(p: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(p[k] for k in SERIES)


def render_md(pts: list[dict[str, Any]], f: Filters) -> str:
    if not pts:
        return "No cell of the history store matches.\n"
    out = []
    by: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for p in pts:
        by.setdefault(_series(p), []).append(p)
    for rows in by.values():
        first = rows[0]
        out.append(f"### {first['host']} ({first['engine'] or '?'}) · {first['config_id']} · {cell_words(first)}\n")
        table = [{"run": str(p["run_id"]), "measured": _when(p["measured_at"]),
                  "status": str(p["status"] or ""), "n": "" if p["n"] is None else str(p["n"]),
                  "tok/s (95% CI)": _with_interval(p, "tok_s_mean", "tok_s_ci_low", "tok_s_ci_high", 1),
                  "speedup (95% CI)": ("" if p["method"] == "autoregressive" else
                                       _with_interval(p, "speedup", "speedup_ci_low", "speedup_ci_high", 2, "x")),
                  "acceptance (95% CI)": _with_interval(p, "accept_length_mean", "accept_length_ci_low",
                                                        "accept_length_ci_high", 2),
                  "outside spread": ", ".join(p["outside"]),
                  "changed since the previous run": "; ".join(p["changes"])} for p in rows]
        out.append(plain_rows(table) + "\n")
    out.append(f"Outside the spread: the run's 95% interval lies wholly below or above every interval of the "
               f"previous {f.window} runs of the cell (judged from {MIN_PREVIOUS} earlier runs on).\n")
    return "\n".join(out)


def _when(v: Any) -> str:
    if isinstance(v, datetime):
        return v.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M")
    return "" if v is None else str(v)


RECORD = [*SERIES, "method", "tp", "run_id", "measured_at", "status", "n", "config_digest",
          *(c for _, mean, lo, hi, _ in FIGURES for c in (mean, lo, hi)), "outside", "changes", "previous_run"]


def record(p: dict[str, Any]) -> dict[str, Any]:
    """One point as csv and json give it."""
    out = {}
    for k in RECORD:
        v = p[k]
        if isinstance(v, datetime):
            v = v.astimezone(timezone.utc).isoformat()
        elif isinstance(v, float) and not math.isfinite(v):
            v = "inf" if v == math.inf else None
        out[k] = v
    return out


def render(pts: list[dict[str, Any]], fmt: str, f: Filters) -> str:
    if fmt == "md":
        return render_md(pts, f)
    rows = [record(p) for p in pts]
    if fmt == "json":
        return json.dumps({"window": f.window, "min_previous": MIN_PREVIOUS, "points": rows}, indent=1) + "\n"
    return _csv(RECORD, ([*(r[k] for k in RECORD[:-3]), "; ".join(r["outside"]), "; ".join(r["changes"]),
                          r["previous_run"]] for r in rows))


def for_run(db: Path, run_id: str, window: int = WINDOW) -> list[dict[str, Any]]:
    """The points of every cell the run measured, up to and including the run (for its report); empty when the
    store is missing or busy."""
    if not db.is_file():
        return []
    try:
        con = connect(db, read_only=True, wait_s=10)
    except (Busy, Unusable):
        return []
    try:
        return points(con, Filters(run_id=run_id, last=0, window=window))
    finally:
        con.close()


def _csv(names: list[str], rows: Iterable[Iterable[Any]]) -> str:
    """A header and rows as CSV, None as an empty field."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(names)
    w.writerows(["" if v is None else v for v in r] for r in rows)
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------------------------
# Any query's answer
# ---------------------------------------------------------------------------------------------------------------

def _shown(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _plain(v: Any) -> Any:
    """A value as JSON takes it: a non-finite float as null, "inf" or "-inf", what is no JSON scalar as its text."""
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v if v is None or isinstance(v, (bool, int, float, str)) else str(v)


def answer(db: Path, query: str, fmt: str = "md") -> str:
    """The answer to `query` from the store (opened read-only), as a markdown table, CSV or JSON. ValueError: the
    query failed (DuckDB's message)."""
    import duckdb

    con = connect(db, read_only=True)
    try:
        cur = con.execute(query)
        names = [d[0] for d in cur.description] if cur.description else []
        rows = cur.fetchall() if names else []
    except duckdb.Error as exc:
        raise ValueError(str(exc).strip()) from None
    finally:
        con.close()
    if fmt == "json":
        return json.dumps([{n: _plain(v) for n, v in zip(names, r)} for r in rows], indent=1) + "\n"
    if fmt == "csv":
        return _csv(names, rows)
    if not names:
        return "(no rows)\n"
    return plain_rows([dict(zip(names, map(_shown, r))) for r in rows] or [dict.fromkeys(names, "")]) + "\n"

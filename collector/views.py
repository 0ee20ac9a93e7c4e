"""The speedup table as people read it: methods in one order (the baseline, DFlash, DDTree by budget as a number,
the rest), one row per cell with a column per method, and text laid out to fit a terminal."""
from __future__ import annotations

import json
import numbers
import re
import textwrap
from typing import Any, Mapping, Optional

import pandas as pd

from .mdtable import pipe_rows
from .results import ConfigResult, Run
from .vocab import CELL, na

AR = "AR"  # the baseline's column
KEYS = ["host", "tp", *CELL]  # by_workload's row
_RANK = {"autoregressive": 0, "dflash": 1, "ddtree": 2}  # every other method after these
WIDTH = 120  # a terminal's columns


def _params(method_params: str | Mapping[str, Any]) -> dict[str, Any]:
    """method_params as the table holds it (JSON text) or as config.json does (an object)."""
    if isinstance(method_params, Mapping):
        return dict(method_params)
    try:
        got = json.loads(method_params)
    except (TypeError, ValueError):
        return {}
    return got if isinstance(got, dict) else {}


def budget(method_params: str | Mapping[str, Any]) -> int | None:
    """A DDTree config's budget, None when its params name no integer budget."""
    got = _params(method_params).get("budget")
    return got if isinstance(got, int) and not isinstance(got, bool) else None


def budget_key(method: str, method_params: str | Mapping[str, Any]) -> tuple[int, bool, int, str, str]:
    """A sort key: the autoregressive baseline, then DFlash variants, then DDTree by budget as a number (b8 < b12
    < b16 < b64; no budget last), then the other methods by name; the params (as sorted JSON) break ties."""
    rank = _RANK.get(method, len(_RANK))
    b = budget(method_params) if method == "ddtree" else None
    params = json.dumps(_params(method_params), sort_keys=True)
    return rank, method == "ddtree" and b is None, b or 0, method if rank == len(_RANK) else "", params


def config_order(tp: Any, method: Any, method_params: Any, config_id: str) -> tuple[Any, ...]:
    """Where a config goes among a host's: by tp, then budget_key (DDTree budgets by number), then its id."""
    tp = int(tp) if isinstance(tp, numbers.Integral) and not isinstance(tp, bool) else None
    return tp is None, tp or 0, budget_key(str(method), method_params), config_id


def config_result_order(c: ConfigResult) -> tuple[Any, ...]:
    """config_order of a config's result."""
    ident = c.identity()
    return config_order(ident["tp"], ident["method"], ident["method_params"], c.config_id)


def by_budget(df: pd.DataFrame) -> pd.DataFrame:
    """The table's rows with each cell's configs in budget_key's order (DDTree budgets by number), the cells in
    the table's order."""
    if df.empty:
        return df
    cell = df.groupby(["host", "tp", *CELL], sort=False, dropna=False).ngroup().tolist()
    keys = [budget_key(m, p) for m, p in zip(df["method"], df["method_params"])]
    cids = df["config_id"].tolist()
    return df.iloc[sorted(range(len(df)), key=lambda i: (cell[i], keys[i], cids[i]))].reset_index(drop=True)


def method_label(row: Mapping[str, Any]) -> str:
    """A table row's method as its column is named: `AR` for the baseline, else the matrix's label of the config
    (its config_id without the `tp<N>-` of its phase: `dflash`, `dflash-nooverlap`, `ddtree-b8`), else the
    config_id itself."""
    if row["method"] == "autoregressive":
        return AR
    cid, tp = str(row["config_id"]), row["tp"]
    prefix = f"tp{tp}-"
    return cid[len(prefix):] if not na(tp) and cid.startswith(prefix) and len(cid) > len(prefix) else cid


def outcomes(run: Run) -> dict[tuple[str, str], str]:
    """(host, config_id) -> ok, failed or skipped, from each config's status.json."""
    return {(c.host, c.config_id): str(c.status.get("status")) for c in run.configs}


def cell_text(r: Mapping[str, Any], outcome: Optional[str] = None) -> str:
    """One method's cell: `26.4 (1.52x)` (tok/s and speedup; tok/s alone without a baseline), else why there is
    no number: `failed: oom`, `skipped: baseline_failed`, `no data`, `no ok request`. `outcome` is the config's
    status; without it, baseline_failed is taken for a skip and every other reason for a failure."""
    status = r["status"]
    if status == "ok":
        if na(r["tok_s_mean"]):
            return "no ok request"
        return f"{r['tok_s_mean']:.1f}" + ("" if na(r["speedup"]) else f" ({r['speedup']:.2f}x)")
    if status == "no_data":
        return "no data"
    if status in ("failed", "skipped"):
        return str(status)
    outcome = outcome or ("skipped" if status == "baseline_failed" else "failed")
    return f"{outcome}: {status}"


def by_workload(df: pd.DataFrame, outcomes: Optional[Mapping[tuple[str, str], str]] = None) -> pd.DataFrame:
    """The hand-run's view of `tables.speedup.table(run)`: one row per host, tp and cell (KEYS), in the table's
    order, and one column per method label, ordered by budget_key, each cell's `cell_text` (empty where the method
    does not measure the cell). `outcomes` (views.outcomes(run)) names failed and skipped configs as their
    status.json does."""
    if df.empty:
        return pd.DataFrame(columns=KEYS)
    columns = list(df.columns)
    rows: dict[tuple[Any, ...], dict[str, str]] = {}
    order: dict[str, tuple[Any, ...]] = {}
    for values in df.values:
        r = dict(zip(columns, values))
        label = method_label(r)
        if label not in order:
            order[label] = budget_key(r["method"], r["method_params"])
        got = rows.setdefault(tuple(r[k] for k in KEYS), {})
        if label not in got:  # a second config of one label in one cell: the first one's
            got[label] = cell_text(r, (outcomes or {}).get((r["host"], r["config_id"])))
    labels = sorted(order, key=lambda lab: (order[lab], lab))
    out = pd.DataFrame([[*key, *(got.get(lab, "") for lab in labels)] for key, got in rows.items()],
                       columns=KEYS + labels)
    for col in ("tp", "max_tokens", "context_tokens", "concurrency"):
        out[col] = out[col].astype("Int64")
    return out


# ---------------------------------------------------------------------------------------------------------------
# Text that fits a terminal
# ---------------------------------------------------------------------------------------------------------------

def wrap(text: str, width: int = WIDTH, indent: str = "  ") -> list[str]:
    """`text` in lines of at most `width` characters: its leading blanks and list mark (`- `) start the first,
    the lines after it are aligned under its text and indented by `indent` more. A word longer than a line (a
    path) is kept whole on a line of its own."""
    if len(text) <= width:
        return [text]
    lead = re.match(r" *(?:- )?", text)
    prefix = lead.group(0) if lead else ""
    return textwrap.wrap(text[len(prefix):], width, initial_indent=prefix,
                         subsequent_indent=" " * len(prefix) + indent, break_long_words=False,
                         break_on_hyphens=False) or [""]


def fit_rows(rows: list[dict[str, str]], keys: list[str], width: int = WIDTH) -> list[str]:
    """`pipe_rows(rows)` split by columns into as few tables as fit `width`, each repeating the `keys` columns,
    the other columns in their order; a blank line between tables. A column too wide for a table of its own beside
    the keys gets one all the same."""
    if not rows:
        return []
    whole = pipe_rows(rows).splitlines()
    if len(whole[0]) <= width:
        return whole
    # pipe_rows lays out each column on its own, and a line of a table (`| a | b |`) is one character and, per
    # column, its width and three: the line `| a |` of the column alone, less one
    wide = {c: len(pipe_rows([{c: r[c]} for r in rows]).split("\n", 1)[0]) - 1 for c in rows[0]}
    used = sum(wide[c] for c in keys) + 1
    tables: list[list[str]] = []
    for c in (c for c in rows[0] if c not in keys):
        if tables and used + sum(wide[t] for t in tables[-1]) + wide[c] <= width:
            tables[-1].append(c)
        else:
            tables.append([c])
    out: list[str] = []
    for cols in tables or [[]]:
        out += ([""] if out else []) + pipe_rows([{c: r[c] for c in keys + cols} for r in rows]).splitlines()
    return out

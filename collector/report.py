"""The speedup table: one row per (host, engine, model, tp, workload, max_tokens, context_tokens,
concurrency, method + params), each spec row paired with its autoregressive baseline."""
from __future__ import annotations

import json
from typing import Any

import pandas as pd

from agent import records

from .load import ConfigResult, Run
from .stats import mean_std, ratio_ci

CELL = ["host", "engine", "model", "tp", *records.CELL]  # a row of the table; a spec row pairs with the baseline's
COLUMNS = CELL + ["config_id", "method", "method_params", "n", "errors", "tok_s_mean", "tok_s_std", "speedup",
                  "speedup_ci_low", "speedup_ci_high", "significant", "accept_length_mean", "ttft_mean_s",
                  "status"]


def _identity(c: ConfigResult) -> dict[str, Any]:
    ident = c.identity()
    return {**ident, "method_params": json.dumps(ident["method_params"], sort_keys=True)}


def _samples(run: Run) -> list[dict[str, Any]]:
    """One entry per (config, cell): its ok tok/s samples, or its failure reason."""
    out = []
    for c in run.configs:
        ident = _identity(c)
        st = c.status.get("status")
        if st != "ok":
            cells = c.config.get("cells") or [{}]
            for cell in cells:
                out.append({**ident, **{k: cell.get(k) for k in records.CELL}, "tok": [], "acc": [], "ttft": [],
                            "errors": 0, "n_total": 0, "status": c.status.get("reason") or st})
            continue
        cells: dict[tuple[Any, ...], dict[str, Any]] = {}
        for r in c.requests:
            key = records.cell_key(r)
            e = cells.setdefault(key, {**ident, **dict(zip(records.CELL, key)), "tok": [], "acc": [], "ttft": [],
                                       "errors": 0, "n_total": 0, "status": "ok"})
            e["n_total"] += 1
            if not r["ok"]:
                e["errors"] += 1
                continue
            e["tok"].append(float(r["output_tok_s"]))
            if r.get("accept_length") is not None:
                e["acc"].append(float(r["accept_length"]))
            if r.get("ttft_s") is not None:
                e["ttft"].append(float(r["ttft_s"]))
        for cell in c.config.get("cells") or []:
            key = records.cell_key(cell)
            if key not in cells:  # listed in the config, but no valid request line for it
                cells[key] = {**ident, **dict(zip(records.CELL, key)), "tok": [], "acc": [], "ttft": [], "errors": 0,
                              "n_total": 0, "status": "no_data"}
        out.extend(cells.values())
    return out


def table(run: Run) -> pd.DataFrame:
    samples = _samples(run)
    base = {tuple(s[k] for k in CELL): s["tok"] for s in samples
            if s["method"] == "autoregressive" and s["status"] == "ok" and s["tok"]}
    rows = []
    for s in samples:
        m, sd = mean_std(s["tok"])
        b = base.get(tuple(s[k] for k in CELL))
        speedup = lo = hi = None
        if m is not None and b:
            bm = sum(b) / len(b)
            speedup = m / bm
            lo, hi = (speedup, speedup) if s["method"] == "autoregressive" else ratio_ci(s["tok"], b)
        sig = ""
        if s["method"] != "autoregressive" and lo is not None and hi is not None:
            sig = "faster" if lo > 1 else ("slower" if hi < 1 else "no")
        acc = mean_std(s["acc"])[0]
        rows.append({**{k: s[k] for k in CELL}, "config_id": s["config_id"], "method": s["method"],
                     "method_params": s["method_params"], "n": len(s["tok"]), "errors": s["errors"],
                     "tok_s_mean": m, "tok_s_std": sd, "speedup": speedup, "speedup_ci_low": lo,
                     "speedup_ci_high": hi, "significant": sig, "accept_length_mean": acc,
                     "ttft_mean_s": mean_std(s["ttft"])[0], "status": s["status"]})
    df = pd.DataFrame(rows, columns=COLUMNS)
    if df.empty:
        return df
    for col in ("tp", "max_tokens", "context_tokens", "concurrency", "n", "errors"):
        df[col] = df[col].astype("Int64")  # integers stay integers beside empty cells
    df["_spec"] = df["method"] != "autoregressive"
    df = df.sort_values(["host", "tp", "workload", "max_tokens", "context_tokens", "concurrency", "_spec",
                         "config_id"], na_position="last", kind="stable").drop(columns="_spec")
    return df.reset_index(drop=True)


def cross_host(df: pd.DataFrame) -> pd.DataFrame:
    """Per config and cell: tok/s and speedup on each host side by side, and their spread
    (max/min - 1 of tok/s across the hosts that have the cell)."""
    ok = df[df["status"] == "ok"]
    if ok.empty or ok["host"].nunique() < 2:
        return pd.DataFrame()
    keys = ["config_id", "workload", "max_tokens", "context_tokens", "concurrency"]
    tok = ok.pivot_table(index=keys, columns="host", values="tok_s_mean", aggfunc="first")
    spd = ok.pivot_table(index=keys, columns="host", values="speedup", aggfunc="first")
    out = pd.concat({"tok_s": tok, "speedup": spd}, axis=1)
    out.columns = [f"{host} {metric}" for metric, host in out.columns]
    out["tok_s_spread"] = tok.max(axis=1) / tok.min(axis=1) - 1
    return out.reset_index()


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return ""
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def hand_run_lines(df: pd.DataFrame) -> list[str]:
    """Per config, one `fib: 26.4 ± 0.1 tok/s` line per cell, as the original hand-run printed."""
    lines = []
    for (host, cid), g in df.groupby(["host", "config_id"], sort=False):
        lines.append(f"{host} {cid}:")
        for _, r in g.iterrows():
            qual = []
            if len(set(df["max_tokens"].dropna())) > 1:
                qual.append(f"{r['max_tokens']} tok")
            if not pd.isna(r["context_tokens"]) and r["context_tokens"]:
                qual.append(f"ctx {r['context_tokens']}")
            if not pd.isna(r["concurrency"]) and r["concurrency"] != 1:
                qual.append(f"c{r['concurrency']}")
            workload = r["workload"] if isinstance(r["workload"], str) else "(unknown cell)"
            name = workload + (f" ({', '.join(qual)})" if qual else "")
            if r["status"] != "ok" or r["tok_s_mean"] is None or pd.isna(r["tok_s_mean"]):
                lines.append(f"  {name}: {r['status']}")
                continue
            std = r["tok_s_std"]
            text = f"  {name}: {r['tok_s_mean']:.1f} ± {0.0 if pd.isna(std) else std:.1f} tok/s"
            extra = [f"n={r['n']}"]
            if r["errors"]:
                extra.append(f"{r['errors']} errors")
            if r["method"] != "autoregressive" and not pd.isna(r["speedup"]):
                extra.append(f"{r['speedup']:.2f}x [{_fmt(r['speedup_ci_low'])}, {_fmt(r['speedup_ci_high'])}]")
            if not pd.isna(r["accept_length_mean"]):
                extra.append(f"accept {r['accept_length_mean']:.2f}")
            lines.append(f"{text}  ({', '.join(extra)})")
    return lines


def timing(run: Run) -> pd.DataFrame:
    """Per config: engine startup (ready_s), wall time, time in timed requests, and the overhead."""
    rows = []
    for c in run.configs:
        st = c.status
        wall, timed = st.get("wall_s"), st.get("timed_s")
        rows.append({"host": c.host, "config_id": c.config_id, "status": st.get("reason") or st.get("status"),
                     "ready_s": st.get("ready_s"), "wall_s": wall, "timed_s": timed,
                     "overhead_s": (wall - timed) if wall is not None and timed is not None else None})
    return pd.DataFrame(rows, columns=["host", "config_id", "status", "ready_s", "wall_s", "timed_s", "overhead_s"])


def render(run: Run, fmt: str) -> str:
    df = table(run)
    if fmt == "csv":
        return df.to_csv(index=False, float_format="%.4f")
    if fmt == "json":
        records = json.loads(df.to_json(orient="records", double_precision=6))
        hosts = json.loads(cross_host(df).to_json(orient="records", double_precision=6))
        return json.dumps({"run": run.meta, "rows": records, "cross_host": hosts, "problems": run.problems},
                          indent=2) + "\n"
    md = [f"# Run {run.meta.get('run_id', run.root.name)}", ""]
    md += ["```", *hand_run_lines(df), "```", "", "## Speedup vs the autoregressive baseline", ""]
    shown = df.copy()
    for col in ("tok_s_mean", "tok_s_std", "speedup", "speedup_ci_low", "speedup_ci_high", "accept_length_mean"):
        shown[col] = shown[col].map(_fmt)
    shown["ttft_mean_s"] = shown["ttft_mean_s"].map(lambda v: _fmt(v, 3))
    md.append(shown.drop(columns=["engine", "model", "method", "method_params"]).to_markdown(index=False))
    hosts = cross_host(df)
    if not hosts.empty:
        md += ["", "## Across hosts", "", hosts.to_markdown(index=False, floatfmt=".2f")]
    t = timing(run)
    if not t.empty:
        md += ["", "## Time per config (seconds)", "",
               t.to_markdown(index=False, floatfmt=".1f")]
    if run.problems:
        md += ["", "## Problems in the results (skipped)", "", *[f"- {p}" for p in run.problems]]
    return "\n".join(md) + "\n"

"""The speedup table: one row per (host, engine, model, tp, workload, max_tokens, context_tokens,
concurrency, method + params), each spec row paired with its autoregressive baseline; and, where a table
group holds both, every DDTree budget against every DFlash config."""
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
                  "status", "cv", "tpot_mean_s", "burst_tok_s_mean", "burst_speedup", "burst_speedup_ci_low",
                  "burst_speedup_ci_high", "flags", "checks"]
NOISY_CV = 0.05  # a cell whose tok/s varies more than this (std / mean) is flagged `noisy`
DDTREE, DFLASH = "ddtree", "dflash"
# SGLang runs speculative decoding with overlap scheduling only under spec v2 (SGLANG_ENABLE_SPEC_V2 true) and
# without --disable-overlap-schedule; DDTree's patch forces overlap off whatever the config says.
NO_OVERLAP_FLAG, SPEC_V2 = "--disable-overlap-schedule", "SGLANG_ENABLE_SPEC_V2"
VS_FILE = "report-ddtree-vs-dflash.csv"  # the comparison's CSV beside report.csv, written only when it has rows
VS_COLUMNS = CELL + ["ddtree_config_id", "budget", "ddtree_n", "ddtree_tok_s_mean", "ddtree_tok_s_std", "speedup",
                     "speedup_ci_low", "speedup_ci_high", "ddtree_status", "dflash_config_id", "dflash_scheduling",
                     "same_path_as_ddtree", "dflash_n", "dflash_tok_s_mean", "dflash_tok_s_std", "dflash_status",
                     "ddtree_over_dflash", "ddtree_over_dflash_ci_low", "ddtree_over_dflash_ci_high",
                     "ddtree_over_dflash_significant"]


def _identity(c: ConfigResult) -> dict[str, Any]:
    ident = c.identity()
    return {**ident, "method_params": json.dumps(ident["method_params"], sort_keys=True)}


def config_flags(status: dict[str, Any]) -> tuple[list[str], str]:
    """What the agent's checks say of a config: `suspect` when the server's counters disagree with the rows,
    `throttled` when a GPU throttled (thermal, power cap, HW slowdown) during the timed requests, `cold_start` when
    the first timed request was an outlier; and the figures, in words."""
    flags, words = [], []
    counters = status.get("counters") or {}
    if counters.get("verdict") == "suspect":
        flags.append("suspect")
        words.append(f"counters: {counters.get('why')}")
    throttled = (status.get("gpu_state") or {}).get("throttled") or []
    if throttled:
        flags.append("throttled")
        words.append("GPU " + ", ".join(f"{t.get('gpu')} {t.get('kind')} ({t.get('reason')}) in {t.get('samples')} of "
                                        f"{t.get('of')} samples" for t in throttled))
    cold = status.get("cold_start") or {}
    if cold.get("outlier"):
        flags.append("cold_start")
        words.append(f"first TTFT {cold.get('first_ttft_s')} s vs cell median {cold.get('cell_median_ttft_s')} s")
    return flags, "; ".join(words)


def bursts(rows: list[dict[str, Any]]) -> list[float]:
    """Aggregate output tok/s of each burst of concurrent requests (one per repetition): its completion tokens over
    the time from its first send to its last finish. Empty when the rows carry no send and finish times."""
    by_rep: dict[Any, list[dict[str, Any]]] = {}
    for r in rows:
        by_rep.setdefault(r.get("rep"), []).append(r)
    out = []
    for group in by_rep.values():
        if not all(r["ok"] and r.get("sent_s") is not None and r.get("done_s") is not None for r in group):
            continue
        span = max(r["done_s"] for r in group) - min(r["sent_s"] for r in group)
        if span > 0:
            out.append(sum(int(r["completion_tokens"] or 0) for r in group) / span)
    return out


def _samples(run: Run) -> list[dict[str, Any]]:
    """One entry per (config, cell): its ok tok/s samples, or its failure reason."""
    out = []
    for c in run.configs:
        ident = _identity(c)
        st = c.status.get("status")
        flags, checks = config_flags(c.status)
        if st != "ok":
            cells = c.config.get("cells") or [{}]
            for cell in cells:
                out.append({**ident, **{k: cell.get(k) for k in records.CELL}, "tok": [], "acc": [], "ttft": [],
                            "tpot": [], "rows": [], "errors": 0, "n_total": 0, "status": c.status.get("reason") or st,
                            "flags": [], "checks": ""})
            continue
        cells: dict[tuple[Any, ...], dict[str, Any]] = {}
        for r in c.requests:
            key = records.cell_key(r)
            e = cells.setdefault(key, {**ident, **dict(zip(records.CELL, key)), "tok": [], "acc": [], "ttft": [],
                                       "tpot": [], "rows": [], "errors": 0, "n_total": 0, "status": "ok",
                                       "flags": list(flags), "checks": checks})
            e["n_total"] += 1
            e["rows"].append(r)
            if not r["ok"]:
                e["errors"] += 1
                continue
            e["tok"].append(float(r["output_tok_s"]))
            if r.get("tpot_s") is not None:
                e["tpot"].append(float(r["tpot_s"]))
            if r.get("accept_length") is not None:
                e["acc"].append(float(r["accept_length"]))
            if r.get("ttft_s") is not None:
                e["ttft"].append(float(r["ttft_s"]))
        for cell in c.config.get("cells") or []:
            key = records.cell_key(cell)
            if key not in cells:  # listed in the config, but no valid request line for it
                cells[key] = {**ident, **dict(zip(records.CELL, key)), "tok": [], "acc": [], "ttft": [], "tpot": [],
                              "rows": [], "errors": 0, "n_total": 0, "status": "no_data", "flags": [], "checks": ""}
        out.extend(cells.values())
    return out


def _significant(lo: float | None, hi: float | None) -> str:
    """Whether a ratio's interval lies above 1 (faster), below (slower) or spans it (no); blank without one."""
    if lo is None or hi is None:
        return ""
    return "faster" if lo > 1 else ("slower" if hi < 1 else "no")


def table(run: Run) -> pd.DataFrame:
    samples = _samples(run)
    base = {tuple(s[k] for k in CELL): s["tok"] for s in samples
            if s["method"] == "autoregressive" and s["status"] == "ok" and s["tok"]}
    base_burst = {tuple(s[k] for k in CELL): bursts(s["rows"]) for s in samples
                  if s["method"] == "autoregressive" and s["status"] == "ok" and (s["concurrency"] or 1) > 1}
    rows = []
    for s in samples:
        m, sd = mean_std(s["tok"])
        b = base.get(tuple(s[k] for k in CELL))
        speedup = lo = hi = None
        if m is not None and b:
            bm = sum(b) / len(b)
            speedup = m / bm
            lo, hi = (speedup, speedup) if s["method"] == "autoregressive" else ratio_ci(s["tok"], b)
        sig = _significant(lo, hi) if s["method"] != "autoregressive" else ""
        acc = mean_std(s["acc"])[0]
        cv = sd / m if m and sd is not None else None
        flags = s["flags"] + (["noisy"] if cv is not None and cv > NOISY_CV else [])
        burst = bursts(s["rows"]) if (s["concurrency"] or 1) > 1 else []
        bb = base_burst.get(tuple(s[k] for k in CELL)) or []
        bm_, bsp = mean_std(burst)[0], None
        blo = bhi = None
        if bm_ is not None and bb:
            bsp = bm_ / (sum(bb) / len(bb))
            blo, bhi = (bsp, bsp) if s["method"] == "autoregressive" else ratio_ci(burst, bb)
        rows.append({**{k: s[k] for k in CELL}, "config_id": s["config_id"], "method": s["method"],
                     "method_params": s["method_params"], "n": len(s["tok"]), "errors": s["errors"],
                     "tok_s_mean": m, "tok_s_std": sd, "speedup": speedup, "speedup_ci_low": lo,
                     "speedup_ci_high": hi, "significant": sig, "accept_length_mean": acc,
                     "ttft_mean_s": mean_std(s["ttft"])[0], "status": s["status"], "cv": cv,
                     "tpot_mean_s": mean_std(s["tpot"])[0], "burst_tok_s_mean": bm_, "burst_speedup": bsp,
                     "burst_speedup_ci_low": blo, "burst_speedup_ci_high": bhi, "flags": ",".join(flags),
                     "checks": s["checks"]})
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


def scheduling(c: ConfigResult) -> str | None:
    """The SGLang scheduling path of a speculative config, from what its config.json records: `no_overlap` when
    its server arguments carry --disable-overlap-schedule or its environment does not turn SGLANG_ENABLE_SPEC_V2
    on (`1` or `true`, as SGLang reads it), else `overlap`. None when it cannot be told: another engine, or
    config.json lost."""
    cfg = c.config
    args, env = cfg.get("server_args"), cfg.get("environment")
    if c.identity()["engine"] != "sglang" or not isinstance(args, list) or not isinstance(env, dict):
        return None
    if NO_OVERLAP_FLAG in args or NO_OVERLAP_FLAG in (cfg.get("command") or []):
        return "no_overlap"
    return "overlap" if str(env.get(SPEC_V2, "")).strip().lower() in ("1", "true") else "no_overlap"


def _budget(method_params: str) -> int | None:
    try:
        budget = json.loads(method_params).get("budget")
    except (TypeError, ValueError, AttributeError):
        return None
    return budget if isinstance(budget, int) and not isinstance(budget, bool) else None


def ddtree_vs_dflash(run: Run, df: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every DDTree config against every DFlash config of the same table group (host, engine, model, tp and
    cell), one row per pair: the DDTree row's tok/s and speedup as in the table, the DFlash config's tok/s and
    scheduling path (`same_path_as_ddtree`: overlap off, as DDTree runs), and DDTree ÷ DFlash tok/s with the
    table's interval for a ratio of means. Failed or skipped configs keep their rows with the reason and no
    ratio. Empty when no group holds both methods."""
    df = table(run) if df is None else df
    rows: list[dict[str, Any]] = []
    if df.empty:
        return pd.DataFrame(rows, columns=VS_COLUMNS)
    tok = {(s["host"], s["config_id"], *records.cell_key(s)): s["tok"] for s in _samples(run)}
    paths = {(c.host, c.config_id): scheduling(c) for c in run.configs}
    for _, g in df.groupby(CELL, sort=False, dropna=False):
        trees, flashes = g[g["method"] == DDTREE], g[g["method"] == DFLASH]
        if trees.empty or flashes.empty:
            continue
        trees = trees.assign(budget=[_budget(p) for p in trees["method_params"]])
        trees = trees.sort_values(["budget", "config_id"], na_position="last", kind="stable")
        for _, t in trees.iterrows():
            a = tok.get((t["host"], t["config_id"], *(t[k] for k in records.CELL)), [])
            for _, f in flashes.sort_values("config_id", kind="stable").iterrows():
                b = tok.get((f["host"], f["config_id"], *(f[k] for k in records.CELL)), [])
                ratio = lo = hi = None
                if a and b:
                    ratio = (sum(a) / len(a)) / (sum(b) / len(b))
                    lo, hi = ratio_ci(a, b)
                path = paths.get((f["host"], f["config_id"]))
                rows.append({**{k: t[k] for k in CELL}, "ddtree_config_id": t["config_id"], "budget": t["budget"],
                             "ddtree_n": t["n"], "ddtree_tok_s_mean": t["tok_s_mean"],
                             "ddtree_tok_s_std": t["tok_s_std"], "speedup": t["speedup"],
                             "speedup_ci_low": t["speedup_ci_low"], "speedup_ci_high": t["speedup_ci_high"],
                             "ddtree_status": t["status"], "dflash_config_id": f["config_id"],
                             "dflash_scheduling": path,
                             "same_path_as_ddtree": None if path is None else path == "no_overlap",
                             "dflash_n": f["n"], "dflash_tok_s_mean": f["tok_s_mean"],
                             "dflash_tok_s_std": f["tok_s_std"], "dflash_status": f["status"],
                             "ddtree_over_dflash": ratio, "ddtree_over_dflash_ci_low": lo,
                             "ddtree_over_dflash_ci_high": hi, "ddtree_over_dflash_significant": _significant(lo, hi)})
    out = pd.DataFrame(rows, columns=VS_COLUMNS)
    for col in ("tp", "max_tokens", "context_tokens", "concurrency", "budget", "ddtree_n", "dflash_n"):
        out[col] = out[col].astype("Int64")
    return out


def ddtree_vs_dflash_csv(run: Run) -> str | None:
    """The comparison as CSV (the file VS_FILE), or None when the run has no group with both methods."""
    vs = ddtree_vs_dflash(run)
    return None if vs.empty else vs.to_csv(index=False, float_format="%.4f")


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
            if not _na(r["burst_tok_s_mean"]):
                extra.append(f"burst {r['burst_tok_s_mean']:.1f} tok/s")
            if r["flags"]:
                extra.append(f"[{r['flags']}]")
            lines.append(f"{text}  ({', '.join(extra)})")
    return lines


def _na(v: Any) -> bool:
    return v is None or bool(pd.isna(v))


def _tok_text(mean: Any, std: Any, n: Any, unit: str = "") -> str:
    if _na(mean):
        return ""
    return f"{mean:.1f}{'' if _na(std) else f' ± {std:.1f}'}{unit} (n={n})"


def _ratio_text(ratio: Any, lo: Any, hi: Any) -> str:
    if _na(ratio):
        return ""
    return f"{ratio:.2f}" + ("" if _na(lo) or _na(hi) else f" [{lo:.2f}, {hi:.2f}]")


def vs_markdown(run: Run, vs: pd.DataFrame) -> list[str]:
    """The DDTree-against-DFlash view in markdown: per table group one table, a row per DDTree config and a
    ratio column per DFlash config; nothing at all when the run has no such group."""
    if vs.empty:
        return []
    outcomes = {(c.host, c.config_id): c.status.get("status") for c in run.configs}

    def status_text(host: str, cid: str, status: Any) -> str:
        outcome = outcomes.get((host, cid))
        return str(status) if outcome in (None, "ok", status) else f"{outcome}: {status}"

    several = len(vs[["engine", "model"]].drop_duplicates()) > 1
    md = ["## DDTree budgets against DFlash", "",
          "Per host, tp and cell: each DDTree config's tok/s (mean ± sample std), its speedup over the baseline and "
          "DDTree ÷ DFlash tok/s for every DFlash config, each ratio with its 95% interval (as for the speedup). "
          "DDTree runs without overlap scheduling; *same path* marks the DFlash config that does too "
          f"(`{NO_OVERLAP_FLAG}` in its server arguments, or no `{SPEC_V2}` in its environment)."]
    for key, g in vs.groupby(CELL, sort=False, dropna=False):
        k = dict(zip(CELL, key))
        cell = [f"{k['workload'] if isinstance(k['workload'], str) else '(unknown cell)'}"]
        if not _na(k["max_tokens"]):
            cell.append(f"{k['max_tokens']} tok")
        if not _na(k["context_tokens"]) and k["context_tokens"]:
            cell.append(f"ctx {k['context_tokens']}")
        if not _na(k["concurrency"]) and k["concurrency"] != 1:
            cell.append(f"c{k['concurrency']}")
        where = f" ({k['engine']}, {k['model']})" if several else ""
        md += ["", f"### {k['host']} tp{k['tp']}: {', '.join(cell)}{where}", ""]
        flashes = g.drop_duplicates("dflash_config_id")
        columns = {}
        for _, f in flashes.iterrows():
            same = f["same_path_as_ddtree"]
            path = ("scheduling path unknown" if _na(same) else
                    "overlap off: same path as DDTree" if same else "overlap on")
            shown = _tok_text(f["dflash_tok_s_mean"], f["dflash_tok_s_std"], f["dflash_n"], " tok/s")
            shown = shown or status_text(f["host"], f["dflash_config_id"], f["dflash_status"])
            md.append(f"- DFlash `{f['dflash_config_id']}`: {shown}; {path}")
            columns[f["dflash_config_id"]] = f"÷ {f['dflash_config_id']}" + (" (same path)" if same is True else "")
        rows = []
        for tid, t in g.groupby("ddtree_config_id", sort=False):
            first = t.iloc[0]
            row = {"budget": "" if _na(first["budget"]) else str(first["budget"]), "config_id": tid,
                   "tok/s": _tok_text(first["ddtree_tok_s_mean"], first["ddtree_tok_s_std"], first["ddtree_n"]),
                   "speedup": _ratio_text(first["speedup"], first["speedup_ci_low"], first["speedup_ci_high"])}
            for _, pair in t.iterrows():
                row[columns[pair["dflash_config_id"]]] = _ratio_text(
                    pair["ddtree_over_dflash"], pair["ddtree_over_dflash_ci_low"], pair["ddtree_over_dflash_ci_high"])
            row["status"] = status_text(first["host"], tid, first["ddtree_status"])
            rows.append(row)
        md += ["", pd.DataFrame(rows).to_markdown(index=False)]
    return md


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
        vs = json.loads(ddtree_vs_dflash(run, df).to_json(orient="records", double_precision=6))
        return json.dumps({"run": run.meta, "rows": records, "cross_host": hosts, "ddtree_vs_dflash": vs,
                           "problems": run.problems}, indent=2) + "\n"
    md = [f"# Run {run.meta.get('run_id', run.root.name)}", ""]
    md += ["```", *hand_run_lines(df), "```", "", "## Speedup vs the autoregressive baseline", ""]
    shown = df.copy()
    for col in ("tok_s_mean", "tok_s_std", "speedup", "speedup_ci_low", "speedup_ci_high", "accept_length_mean",
                "cv", "burst_tok_s_mean", "burst_speedup", "burst_speedup_ci_low", "burst_speedup_ci_high"):
        shown[col] = shown[col].map(_fmt)
    for col in ("ttft_mean_s", "tpot_mean_s"):
        shown[col] = shown[col].map(lambda v: _fmt(v, 3))
    md.append(shown.drop(columns=["engine", "model", "method", "method_params", "checks"]).to_markdown(index=False))
    checked = df[df["checks"].astype(bool)].drop_duplicates(["host", "config_id"])
    if not checked.empty:
        md += ["", "## Checks that did not pass", "",
               *[f"- {r['host']} {r['config_id']} [{r['flags']}]: {r['checks']}" for _, r in checked.iterrows()]]
    hosts = cross_host(df)
    if not hosts.empty:
        md += ["", "## Across hosts", "", hosts.to_markdown(index=False, floatfmt=".2f")]
    vs = vs_markdown(run, ddtree_vs_dflash(run, df))
    if vs:
        md += ["", *vs]
    t = timing(run)
    if not t.empty:
        md += ["", "## Time per config (seconds)", "",
               t.to_markdown(index=False, floatfmt=".1f")]
    if run.problems:
        md += ["", "## Problems in the results (skipped)", "", *[f"- {p}" for p in run.problems]]
    return "\n".join(md) + "\n"

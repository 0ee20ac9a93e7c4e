"""The speedup table: one row per (host, engine, model, tp, workload, max_tokens, context_tokens,
concurrency, method + params), each spec row paired with its autoregressive baseline; where a table
group holds both, every DDTree budget against every DFlash config; and, for a packed phase, its baseline
measured alone against the same baseline measured again while the phase's other configs ran beside it (the pack
check, which is never a baseline nor a row of the table)."""
from __future__ import annotations

import json
import numbers
from typing import Any

import numpy as np
import pandas as pd
import scipy.special  # noqa: F401  (stats' t quantile: loaded with the report, while request lines are read)

from agent import records
from agent.pack import PACK_SUFFIX

from . import PACK_FILE as PACK_FILE  # re-exported: the names the tests and the CLI know them by
from . import VS_FILE as VS_FILE
from .environment import environment
from .load import NONE, ConfigResult, Run, Summary
from .mdtable import pipe_rows, pipe_table
from .stats import ratio_ci_of
from .views import AR, KEYS, WIDTH, budget, budget_key, by_workload, fit_rows, outcomes, wrap
from .views import na as _na

CELL = ["host", "engine", "model", "tp", *records.CELL]  # a row of the table; a spec row pairs with the baseline's
COLUMNS = CELL + ["config_id", "method", "method_params", "n", "errors", "tok_s_mean", "tok_s_std", "speedup",
                  "speedup_ci_low", "speedup_ci_high", "significant", "accept_length_mean", "ttft_mean_s",
                  "status", "cv", "tpot_mean_s", "burst_tok_s_mean", "burst_speedup", "burst_speedup_ci_low",
                  "burst_speedup_ci_high", "flags", "checks"]
NOISY_CV = 0.05  # a cell whose tok/s varies more than this (std / mean) is flagged `noisy`
DDTREE, DFLASH = "ddtree", "dflash"
# SGLang runs DFlash overlapped from 0.5.14 unless --disable-overlap-schedule is given; up to 0.5.13 it forces
# overlap off for DFlash (the host's probe records it: engine.features.dflash_overlap). SGLANG_ENABLE_SPEC_V2 never
# applied to DFlash. DDTree's patch forces overlap off whatever the config says.
NO_OVERLAP_FLAG = "--disable-overlap-schedule"
PACK_COLUMNS = CELL + ["baseline_config_id", "pack_check_config_id", "alone_n", "alone_tok_s_mean", "alone_tok_s_std",
                       "alone_status", "packed_n", "packed_tok_s_mean", "packed_tok_s_std", "packed_status",
                       "packed_over_alone", "packed_over_alone_ci_low", "packed_over_alone_ci_high",
                       "packed_over_alone_significant", "beside"]
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
    the first timed request was an outlier, `foreign_load` when another engine, another run's server or a GPU
    process not this run's was on the host; and the figures, in words."""
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
    alien = status.get("foreign")
    if isinstance(alien, list) and alien:
        flags.append("foreign_load")
        words.append("not this run's, on the host: " + ", ".join(
            f"pid {a.get('pid')} {a.get('why')} {str(a.get('cmd'))[:60]!r} ({'/'.join(a.get('when') or [])})"
            for a in alien[:4] if isinstance(a, dict)) + (f" and {len(alien) - 4} more" if len(alien) > 4 else ""))
    near = status.get("neighbours")
    if isinstance(near, list) and near:
        flags.append("packed")
        words.append(f"packed{_slot_text(status.get('slot'))} beside "
                     + ", ".join(_neighbour_text(n) for n in near))
    return flags, "; ".join(words)


def _slot_text(slot: Any) -> str:
    """` on slot 1 (GPUs 2,3; CPUs 8-15)`, from status.json's slot; empty when it had the whole host."""
    if not isinstance(slot, dict):
        return ""
    where = []
    gpus = slot.get("gpus")
    if isinstance(gpus, list) and gpus:
        where.append(("GPU " if len(gpus) == 1 else "GPUs ") + ",".join(str(g) for g in gpus))
    if slot.get("cpus"):
        where.append(f"CPUs {slot['cpus']}")
    return f" on slot {slot.get('index')}" + (f" ({'; '.join(where)})" if where else "")


def _seconds(v: Any) -> str:
    return f"{v:.1f} s" if isinstance(v, (int, float)) and not isinstance(v, bool) else "? s"


def _neighbour_text(n: Any) -> str:
    """`tp1-dflash (slot 1: 95.0 s up together, 80.0 s measuring together)`, from one entry of neighbours."""
    if not isinstance(n, dict):
        return str(n)
    return (f"{n.get('config_id')} (slot {n.get('slot')}: {_seconds(n.get('overlap_s'))} up together, "
            f"{_seconds(n.get('timed_overlap_s'))} measuring together)")


def pack_checks(run: Run) -> dict[tuple[str, str], str]:
    """(host, config_id) of each pack check -> the baseline it measures again while its phase's other configs run
    beside it (config.json's pack_check_of). With config.json lost, an autoregressive config named
    `<baseline>-packed` beside that baseline is taken for its pack check, so that it never stands in for the
    baseline. Worked out once per run."""
    if "pack_checks" not in run.memo:
        names = {(c.host, c.config_id) for c in run.configs}
        found = {}
        for c in run.configs:
            of = c.config.get("pack_check_of")
            base = c.config_id[:-len(PACK_SUFFIX)] if c.config_id.endswith(PACK_SUFFIX) else None
            if isinstance(of, str) and of:
                found[(c.host, c.config_id)] = of
            elif (not c.config and base and (c.host, base) in names
                  and c.identity()["method"] == "autoregressive"):
                found[(c.host, c.config_id)] = base
        run.memo["pack_checks"] = found
    return run.memo["pack_checks"]


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
    """One entry per (config, cell): its ok tok/s samples, or its failure reason. Worked out once per run."""
    if "samples" not in run.memo:
        run.memo["samples"] = _cell_samples(run)
    return run.memo["samples"]


def _cell_samples(run: Run) -> list[dict[str, Any]]:
    out = []
    none = {"tok": NONE, "bursts": NONE, "acc_mean": None, "ttft_mean": None, "tpot_mean": None, "errors": 0,
            "n_total": 0}
    checks_of = pack_checks(run)
    for c in run.configs:
        ident = {**_identity(c), "pack_check_of": checks_of.get((c.host, c.config_id))}
        st = c.status.get("status")
        flags, checks = config_flags(c.status)
        if st != "ok":
            for cell in c.config.get("cells") or [{}]:
                out.append({**ident, **{k: cell.get(k) for k in records.CELL}, **none,
                            "status": c.status.get("reason") or st, "flags": [], "checks": ""})
            continue
        cells: dict[tuple[Any, ...], dict[str, Any]] = {}
        for rows in c.cells:  # the valid request lines, by cell, summed up (load.CellRows)
            cells[rows.key] = {**ident, **dict(zip(records.CELL, rows.key)), "tok": rows.tok, "bursts": rows.bursts,
                               "acc_mean": rows.acc_mean, "ttft_mean": rows.ttft_mean, "tpot_mean": rows.tpot_mean,
                               "errors": rows.errors, "n_total": rows.n_total, "status": "ok", "flags": list(flags),
                               "checks": checks}
        for cell in c.config.get("cells") or []:
            key = records.cell_key(cell)
            if key not in cells:  # listed in the config, but no valid request line for it
                cells[key] = {**ident, **dict(zip(records.CELL, key)), **none, "status": "no_data", "flags": [],
                              "checks": ""}
        out.extend(cells.values())
    return out


def _significant(lo: float | None, hi: float | None) -> str:
    """Whether a ratio's interval lies above 1 (faster), below (slower) or spans it (no); blank without one."""
    if lo is None or hi is None:
        return ""
    return "faster" if lo > 1 else ("slower" if hi < 1 else "no")


def _ratio(a: Summary, b: Summary) -> tuple[float | None, float | None]:
    """ratio_ci of two samples, from their summaries."""
    return ratio_ci_of(a[1:], a[0], b[1:], b[0])


def table(run: Run) -> pd.DataFrame:
    samples = [s for s in _samples(run) if s["pack_check_of"] is None]  # a pack check is no row and no baseline
    base = {tuple(s[k] for k in CELL): s["tok"] for s in samples
            if s["method"] == "autoregressive" and s["status"] == "ok" and s["tok"][0]}
    base_burst = {tuple(s[k] for k in CELL): s["bursts"] for s in samples
                  if s["method"] == "autoregressive" and s["status"] == "ok" and (s["concurrency"] or 1) > 1}
    rows = []
    for s in samples:
        n, m, sd = s["tok"]
        b = base.get(tuple(s[k] for k in CELL))
        speedup = lo = hi = None
        if m is not None and b:
            speedup = m / b[1]
            lo, hi = (speedup, speedup) if s["method"] == "autoregressive" else _ratio(s["tok"], b)
        sig = _significant(lo, hi) if s["method"] != "autoregressive" else ""
        cv = sd / m if m and sd is not None else None
        flags = s["flags"] + (["noisy"] if cv is not None and cv > NOISY_CV else [])
        burst = s["bursts"] if (s["concurrency"] or 1) > 1 else NONE
        bb = base_burst.get(tuple(s[k] for k in CELL)) or NONE
        bm_, bsp = burst[1], None
        blo = bhi = None
        if bm_ is not None and bb[0]:
            bsp = bm_ / bb[1]
            blo, bhi = (bsp, bsp) if s["method"] == "autoregressive" else _ratio(burst, bb)
        rows.append({**{k: s[k] for k in CELL}, "config_id": s["config_id"], "method": s["method"],
                     "method_params": s["method_params"], "n": n, "errors": s["errors"],
                     "tok_s_mean": m, "tok_s_std": sd, "speedup": speedup, "speedup_ci_low": lo,
                     "speedup_ci_high": hi, "significant": sig, "accept_length_mean": s["acc_mean"],
                     "ttft_mean_s": s["ttft_mean"], "status": s["status"], "cv": cv,
                     "tpot_mean_s": s["tpot_mean"], "burst_tok_s_mean": bm_, "burst_speedup": bsp,
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


def scheduling(c: ConfigResult, host: dict[str, Any] | None = None) -> str | None:
    """The SGLang scheduling path of a speculative config, from what its config.json records: `no_overlap` when
    its server arguments carry --disable-overlap-schedule or its host's build forces DFlash off overlap
    (`host.json` engine.features.dflash_overlap false: SGLang up to 0.5.13), else `overlap`. None when it cannot
    be told: another engine, or config.json lost."""
    cfg = c.config
    args = cfg.get("server_args")
    if c.identity()["engine"] != "sglang" or not isinstance(args, list):
        return None
    if NO_OVERLAP_FLAG in args or NO_OVERLAP_FLAG in (cfg.get("command") or []):
        return "no_overlap"
    features = ((host or {}).get("engine") or {}).get("features") or {}
    return "no_overlap" if features.get("dflash_overlap") is False else "overlap"


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The frame's rows as dicts, each value as iterrows() gives it (it reads the same df.values)."""
    columns = list(df.columns)
    return [dict(zip(columns, values)) for values in df.values]


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
    samples = {(s["host"], s["config_id"], *records.cell_key(s)): s["tok"] for s in _samples(run)}
    paths = {(c.host, c.config_id): scheduling(c, run.hosts.get(c.host)) for c in run.configs}
    method = df["method"].to_numpy()
    group = df.groupby(CELL, sort=False, dropna=False).ngroup().to_numpy()  # numbered as they first appear
    members: dict[int, list[int]] = {}
    for i in np.flatnonzero((method == DDTREE) | (method == DFLASH)).tolist():
        members.setdefault(int(group[i]), []).append(i)
    values, columns = df.values, list(df.columns)
    for g in sorted(members):
        found = [dict(zip(columns, values[i])) for i in members[g]]
        trees = [r for r in found if r["method"] == DDTREE]
        flashes = sorted((r for r in found if r["method"] == DFLASH), key=lambda r: r["config_id"])
        if not trees or not flashes:
            continue
        for t in trees:
            t["budget"] = budget(t["method_params"])
        trees.sort(key=lambda r: (r["budget"] is None, r["budget"] or 0, r["config_id"]))
        for t in trees:
            a = samples.get((t["host"], t["config_id"], *(t[k] for k in records.CELL)), NONE)
            for f in flashes:
                b = samples.get((f["host"], f["config_id"], *(f[k] for k in records.CELL)), NONE)
                ratio = lo = hi = None
                if a[0] and b[0]:
                    ratio = a[1] / b[1]
                    lo, hi = _ratio(a, b)
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


def beside(status: dict[str, Any]) -> str:
    """The configs that were in their timed requests while this one was (neighbours with timed_overlap_s > 0),
    with those seconds: `tp1-dflash (slot 1): 80.0 s; tp1-ngram (slot 2): 12.5 s`."""
    near = status.get("neighbours")
    found = [n for n in near if isinstance(n, dict) and isinstance(n.get("timed_overlap_s"), (int, float))
             and n["timed_overlap_s"] > 0] if isinstance(near, list) else []
    return "; ".join(f"{n.get('config_id')} (slot {n.get('slot')}): {_seconds(n['timed_overlap_s'])}" for n in found)


def _side(name: str, s: dict[str, Any] | None) -> dict[str, Any]:
    """One side of a pack check's row: n, mean, std and status of a sample, `missing` without one."""
    n, mean, std = s["tok"] if s else NONE
    return {f"{name}_n": n, f"{name}_tok_s_mean": mean, f"{name}_tok_s_std": std,
            f"{name}_status": s["status"] if s else "missing"}


def pack_check(run: Run) -> pd.DataFrame:
    """Each pack check against its baseline, one row per cell of either: the baseline's tok/s measured alone and
    measured again beside the phase's other configs (mean, sample std, n, or the reason there is none),
    packed ÷ alone with the speedup's interval for a ratio of means, and the configs that were measuring beside
    the pack check (with the seconds they were). Empty when the run has no pack check."""
    samples = _samples(run)
    by_config: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for s in samples:
        by_config.setdefault((s["host"], s["config_id"]), []).append(s)
    status = {(c.host, c.config_id): c.status for c in run.configs}
    rows = []
    for (host, cid), base_id in pack_checks(run).items():
        packed = {records.cell_key(s): s for s in by_config.get((host, cid), [])}
        alone = {records.cell_key(s): s for s in by_config.get((host, base_id), [])}
        near = beside(status[(host, cid)])
        for key in dict.fromkeys([*alone, *packed]):
            a, p = alone.get(key), packed.get(key)
            first = a or p
            assert first is not None
            ratio = lo = hi = None
            if a and p and a["tok"][0] and p["tok"][0]:
                ratio = p["tok"][1] / a["tok"][1]
                lo, hi = _ratio(p["tok"], a["tok"])
            rows.append({**{k: first[k] for k in CELL}, "baseline_config_id": base_id, "pack_check_config_id": cid,
                         **_side("alone", a), **_side("packed", p), "packed_over_alone": ratio,
                         "packed_over_alone_ci_low": lo, "packed_over_alone_ci_high": hi,
                         "packed_over_alone_significant": _significant(lo, hi), "beside": near})
    out = pd.DataFrame(rows, columns=PACK_COLUMNS)
    for col in ("tp", "max_tokens", "context_tokens", "concurrency", "alone_n", "packed_n"):
        out[col] = out[col].astype("Int64")
    out = out.sort_values(["host", "tp", "workload", "max_tokens", "context_tokens", "concurrency",
                           "baseline_config_id"], na_position="last", kind="stable")
    return out.reset_index(drop=True)


def pack_check_csv(run: Run) -> str | None:
    """The pack checks as CSV (the file PACK_FILE), or None when the run has none."""
    checked = pack_check(run)
    return None if checked.empty else checked.to_csv(index=False, float_format="%.4f")


def _cell_text(k: dict[str, Any]) -> str:
    """`fib, 128 tok, ctx 512, c4`: a cell in words."""
    cell = [f"{k['workload'] if isinstance(k['workload'], str) else '(unknown cell)'}"]
    if not _na(k["max_tokens"]):
        cell.append(f"{k['max_tokens']} tok")
    if not _na(k["context_tokens"]) and k["context_tokens"]:
        cell.append(f"ctx {k['context_tokens']}")
    if not _na(k["concurrency"]) and k["concurrency"] != 1:
        cell.append(f"c{k['concurrency']}")
    return ", ".join(cell)


def _text(text: str, wide: bool, indent: str = "") -> list[str]:
    """A paragraph or list item: one line when wide, else wrapped to WIDTH (views.wrap)."""
    return [text] if wide else wrap(text, WIDTH, indent)


def _table(rows: list[dict[str, str]], keys: list[str], wide: bool) -> list[str]:
    """A pipe table of the rows: whole when wide, else split by columns to fit WIDTH, `keys` in every part."""
    return pipe_rows(rows).splitlines() if wide else fit_rows(rows, keys, WIDTH)


def pack_markdown(checked: pd.DataFrame, wide: bool = True) -> list[str]:
    """The pack checks in markdown: what each one measured beside, then one row per cell; nothing at all when the
    run has none. Not `wide`: fits WIDTH columns."""
    if checked.empty:
        return []
    md = ["## Baseline alone vs packed", "",
          *_text("Each packed phase's baseline is measured alone, then again (the pack check) while the phase's other "
                 "configs run beside it on the other slots. Per cell: its tok/s alone and packed (mean ± sample std, "
                 "n) and packed ÷ alone with its 95% interval (as for the speedup). Below 1, running beside the others "
                 "slowed the baseline; the table's speedups are against the baseline measured alone.", wide), ""]
    records_ = _records(checked)
    for r in {(r["host"], r["pack_check_config_id"]): r for r in records_}.values():
        near = r["beside"] or "no other config was in its timed requests at the same time"
        md += _text(f"- {r['host']} `{r['pack_check_config_id']}` (`{r['baseline_config_id']}` measured again), "
                    f"measuring beside: {near}", wide)
    rows = []
    for r in records_:
        rows.append({"host": str(r["host"]), "tp": "" if _na(r["tp"]) else str(r["tp"]), "cell": _cell_text(r),
                     "baseline": str(r["baseline_config_id"]),
                     "alone tok/s": _tok_text(r["alone_tok_s_mean"], r["alone_tok_s_std"], r["alone_n"])
                     or str(r["alone_status"]),
                     "packed tok/s": _tok_text(r["packed_tok_s_mean"], r["packed_tok_s_std"], r["packed_n"])
                     or str(r["packed_status"]),
                     "packed ÷ alone": _ratio_text(r["packed_over_alone"], r["packed_over_alone_ci_low"],
                                                   r["packed_over_alone_ci_high"]),
                     "significant": str(r["packed_over_alone_significant"])})
    return md + ["", *_table(rows, ["host", "tp", "cell"], wide)]


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return ""
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def hand_run_lines(df: pd.DataFrame) -> list[str]:
    """Per config, one `fib: 26.4 ± 0.1 tok/s` line per cell, as the original hand-run printed; per host, configs
    by tp, then in budget_key's order."""
    lines = []
    several_lengths = len(set(df["max_tokens"].dropna())) > 1
    groups: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for r in _records(df):
        if not _na(r["host"]) and not _na(r["config_id"]):  # as groupby() leaves them out
            groups.setdefault((r["host"], r["config_id"]), []).append(r)
    hosts = {h: i for i, h in enumerate(dict.fromkeys(h for h, _ in groups))}
    first = {key: g[0] for key, g in groups.items()}
    for host, cid in sorted(groups, key=lambda k: (hosts[k[0]], _order(first[k]["tp"], first[k]["method"],
                                                                       first[k]["method_params"], k[1]))):
        g = groups[(host, cid)]
        lines.append(f"{host} {cid}:")
        for r in g:
            qual = []
            if several_lengths:
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


def _tok_text(mean: Any, std: Any, n: Any, unit: str = "") -> str:
    if _na(mean):
        return ""
    return f"{mean:.1f}{'' if _na(std) else f' ± {std:.1f}'}{unit} (n={n})"


def _ratio_text(ratio: Any, lo: Any, hi: Any) -> str:
    if _na(ratio):
        return ""
    return f"{ratio:.2f}" + ("" if _na(lo) or _na(hi) else f" [{lo:.2f}, {hi:.2f}]")


def vs_markdown(run: Run, vs: pd.DataFrame, wide: bool = True) -> list[str]:
    """The DDTree-against-DFlash view in markdown: per table group one table, a row per DDTree config and a
    ratio column per DFlash config; nothing at all when the run has no such group. Not `wide`: fits WIDTH
    columns."""
    if vs.empty:
        return []
    outcome_of = outcomes(run)

    def status_text(host: str, cid: str, status: Any) -> str:
        outcome = outcome_of.get((host, cid))
        return str(status) if outcome in (None, "ok", status) else f"{outcome}: {status}"

    several = len(vs[["engine", "model"]].drop_duplicates()) > 1
    md = ["## DDTree budgets against DFlash", "",
          *_text("Per host, tp and cell: each DDTree config's tok/s (mean ± sample std), its speedup over the baseline "
                 "and DDTree ÷ DFlash tok/s for every DFlash config, each ratio with its 95% interval (as for the "
                 "speedup). DDTree runs without overlap scheduling; *same path* marks the DFlash config that does too "
                 f"(`{NO_OVERLAP_FLAG}` in its server arguments, or an SGLang build up to 0.5.13, which runs "
                 "DFlash without overlap always).", wide)]
    groups: dict[int, list[dict[str, Any]]] = {}
    for g, r in zip(vs.groupby(CELL, sort=False, dropna=False).ngroup().tolist(), _records(vs)):
        groups.setdefault(g, []).append(r)  # numbered as they first appear
    for g in sorted(groups):
        k = groups[g][0]
        where = f" ({k['engine']}, {k['model']})" if several else ""
        md += ["", f"### {k['host']} tp{k['tp']}: {_cell_text(k)}{where}", ""]
        columns = {}
        for f in groups[g]:
            if f["dflash_config_id"] in columns:
                continue
            same = f["same_path_as_ddtree"]
            path = ("scheduling path unknown" if _na(same) else
                    "overlap off: same path as DDTree" if same else "overlap on")
            shown = _tok_text(f["dflash_tok_s_mean"], f["dflash_tok_s_std"], f["dflash_n"], " tok/s")
            shown = shown or status_text(f["host"], f["dflash_config_id"], f["dflash_status"])
            md += _text(f"- DFlash `{f['dflash_config_id']}`: {shown}; {path}", wide)
            columns[f["dflash_config_id"]] = f"÷ {f['dflash_config_id']}" + (" (same path)" if same is True else "")
        trees: dict[Any, list[dict[str, Any]]] = {}
        for pair in groups[g]:
            trees.setdefault(pair["ddtree_config_id"], []).append(pair)
        rows = []
        for tid, pairs in trees.items():
            first = pairs[0]
            row = {"budget": "" if _na(first["budget"]) else str(first["budget"]), "config_id": tid,
                   "tok/s": _tok_text(first["ddtree_tok_s_mean"], first["ddtree_tok_s_std"], first["ddtree_n"]),
                   "speedup": _ratio_text(first["speedup"], first["speedup_ci_low"], first["speedup_ci_high"])}
            for pair in pairs:
                row[columns[pair["dflash_config_id"]]] = _ratio_text(
                    pair["ddtree_over_dflash"], pair["ddtree_over_dflash_ci_low"], pair["ddtree_over_dflash_ci_high"])
            row["status"] = status_text(first["host"], tid, first["ddtree_status"])
            rows.append(row)
        md += ["", *_table(rows, ["budget", "config_id"], wide)]
    return md


STARTUP_PHASES = ("weights", "compile", "kv_cache", "graphs")  # status.json `startup`, in the order they happen


def timing(run: Run) -> pd.DataFrame:
    """Per config (per host, in _order): engine startup (ready_s) and, where its log told, the seconds from launch
    at which its weights were loaded, its model compiled, its KV cache allocated and its graphs captured (a column
    only where some config has it); wall time, time in timed requests, and the overhead."""
    rows = []
    for c in sorted(run.configs, key=lambda c: (c.host, _config_order(c))):
        st = c.status
        wall, timed = st.get("wall_s"), st.get("timed_s")
        marks = st.get("startup") if isinstance(st.get("startup"), dict) else {}
        rows.append({"host": c.host, "config_id": c.config_id, "status": st.get("reason") or st.get("status"),
                     **{f"{k}_s": marks.get(k) for k in STARTUP_PHASES}, "ready_s": st.get("ready_s"),
                     "wall_s": wall, "timed_s": timed,
                     "overhead_s": (wall - timed) if wall is not None and timed is not None else None})
    found = [f"{k}_s" for k in STARTUP_PHASES if any(r[f"{k}_s"] is not None for r in rows)]
    return pd.DataFrame([{k: v for k, v in r.items() if not k.endswith(tuple(f"{p}_s" for p in STARTUP_PHASES))
                          or k in found} for r in rows],
                        columns=["host", "config_id", "status", *found, "ready_s", "wall_s", "timed_s", "overhead_s"])


_SCALARS = (str, int, float, bool, type(None))


def dumps_indented(doc: dict[str, Any]) -> str:
    """json.dumps(doc, indent=2), the same text, sooner: Python's json writes an indented document in Python
    code, so each list of flat objects (the table's rows, thousands of them) is written by the C encoder, one
    object at a time, with separators that lay it out as the indented form would."""
    if not doc:
        return "{}"
    parts = []
    for key, value in doc.items():
        if (isinstance(value, list) and value
                and all(isinstance(v, dict) and v and all(isinstance(x, _SCALARS) for x in v.values()) for v in value)):
            item = json.dumps  # "{" item, item "}" -> "{\n      " item ",\n      " item "\n    }"
            objects = ("{\n      " + item(v, separators=(",\n      ", ": "))[1:-1] + "\n    }" for v in value)
            text = "[\n    " + ",\n    ".join(objects) + "\n  ]"
        else:
            text = json.dumps(value, indent=2).replace("\n", "\n  ")  # one level in: every line after the first
        parts.append(f"  {json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(parts) + "\n}"


def _order(tp: Any, method: Any, method_params: Any, config_id: str) -> tuple[Any, ...]:
    """Where a config goes among a host's: by tp, then budget_key (DDTree budgets by number), then its id."""
    tp = int(tp) if isinstance(tp, numbers.Integral) and not isinstance(tp, bool) else None
    return tp is None, tp or 0, budget_key(str(method), method_params), config_id


def _config_order(c: ConfigResult) -> tuple[Any, ...]:
    ident = c.identity()
    return _order(ident["tp"], ident["method"], ident["method_params"], c.config_id)


def by_budget(df: pd.DataFrame) -> pd.DataFrame:
    """The table's rows with each cell's configs in budget_key's order (DDTree budgets by number), the cells in
    the table's order."""
    if df.empty:
        return df
    cell = df.groupby(["host", "tp", *records.CELL], sort=False, dropna=False).ngroup().tolist()
    keys = [budget_key(m, p) for m, p in zip(df["method"], df["method_params"])]
    cids = df["config_id"].tolist()
    return df.iloc[sorted(range(len(df)), key=lambda i: (cell[i], keys[i], cids[i]))].reset_index(drop=True)


def environment_markdown(run: Run, wide: bool) -> list[str]:
    """Per host, what it was measured on (environment.environment), as one list item; nothing when nothing is
    known. Not `wide`: an item is wrapped between its facts where it can be."""
    env = {host: pairs for host, pairs in environment(run).items() if pairs}
    if not env:
        return []
    md = ["## Environment", ""]
    for host, pairs in env.items():
        facts = [f"{label} {value}" for label, value in pairs]
        if wide or any(len(f) > WIDTH // 2 for f in facts):
            md += _text(f"- {host}: " + "; ".join(facts), wide)
            continue
        glued = [f.replace(" ", "\N{NO-BREAK SPACE}") for f in facts]  # a line breaks between facts only
        md += [line.replace("\N{NO-BREAK SPACE}", " ") for line in wrap(f"- {host}: " + "; ".join(glued), WIDTH, "")]
    return md + [""]


def methods_markdown(run: Run, df: pd.DataFrame, wide: bool) -> list[str]:
    """The main table (views.by_workload): per host and tp, a row per cell and a column per config that measures
    any of its cells. Not `wide`: each split by columns to fit WIDTH, the cell in every part."""
    view = by_workload(df, outcomes(run))
    labels = [c for c in view.columns if c not in KEYS]
    groups: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for r in _records(view):
        groups.setdefault((r["host"], r["tp"]), []).append(r)
    if not groups:
        return []
    md = [*_text("Per host and tp, a row per cell and a column per config: tok/s (the mean over ok requests) and "
                 f"its speedup over the autoregressive baseline ({AR}), or why there is no number.", wide)]
    for (host, tp), recs in groups.items():
        shown = [lab for lab in labels if any(r[lab] for r in recs)]
        rows = [{"cell": _cell_text(r), **{lab: r[lab] for lab in shown}} for r in recs]
        md += ["", f"### {host} tp{'?' if _na(tp) else tp}", "", *_table(rows, ["cell"], wide)]
    return md


def full_markdown(df: pd.DataFrame) -> list[str]:
    """Every column of the table but the engine, model, method, params and checks, its configs in budget order."""
    shown = by_budget(df)
    for col in ("tok_s_mean", "tok_s_std", "speedup", "speedup_ci_low", "speedup_ci_high", "accept_length_mean",
                "cv", "burst_tok_s_mean", "burst_speedup", "burst_speedup_ci_low", "burst_speedup_ci_high"):
        shown[col] = shown[col].map(_fmt)
    for col in ("ttft_mean_s", "tpot_mean_s"):
        shown[col] = shown[col].map(lambda v: _fmt(v, 3))
    return [pipe_table(shown.drop(columns=["engine", "model", "method", "method_params", "checks"]))]


def cross_host_markdown(df: pd.DataFrame, wide: bool) -> list[str]:
    """cross_host(df), its configs in budget order; nothing with fewer than two hosts. Not `wide`: the cell in one
    column, split by columns to fit WIDTH."""
    hosts = cross_host(df)
    if hosts.empty:
        return []
    first = df.drop_duplicates("config_id").set_index("config_id")
    order = {cid: _order(r["tp"], r["method"], r["method_params"], str(cid)) for cid, r in first.iterrows()}
    position = sorted(range(len(hosts)), key=lambda i: (order[hosts["config_id"].iat[i]], i))
    hosts = hosts.iloc[position].reset_index(drop=True)
    md = ["## Across hosts", ""]
    if wide:
        return md + [pipe_table(hosts, floatfmt=".2f")]
    rows = [{"config_id": str(r["config_id"]), "cell": _cell_text(r),
             **{k: _fmt(v) for k, v in r.items() if k not in ("config_id", *records.CELL)}} for r in _records(hosts)]
    return md + _table(rows, ["config_id", "cell"], wide)


def timing_markdown(run: Run, wide: bool) -> list[str]:
    """timing(run) in markdown; nothing for a run without configs. Not `wide`: split by columns to fit WIDTH."""
    t = timing(run)
    if t.empty:
        return []
    md = ["## Time per config (seconds)", ""]
    if any(c.endswith("_s") and c.split("_s")[0] in STARTUP_PHASES for c in t.columns):
        md += _text("Startup, from each server's log: the seconds from launch at which its weights were loaded "
                    "(weights_s), its model compiled (compile_s), its KV cache allocated (kv_cache_s) and its graphs "
                    "captured (graphs_s); ready_s when it first answered its health check.", wide) + [""]
    if wide:
        return md + [pipe_table(t, floatfmt=".1f")]
    rows = [{k: _fmt(v, 1) for k, v in r.items()} for r in _records(t)]
    return md + _table(rows, ["host", "config_id"], wide)


def render(run: Run, fmt: str, wide: bool = False) -> str:
    """The report as csv, json or md. The md fits WIDTH columns, its main table the methods as columns per cell;
    `wide` adds the full table and lays every table out whole."""
    df = table(run)
    if fmt == "csv":
        return df.to_csv(index=False, float_format="%.4f")
    if fmt == "json":
        records = json.loads(df.to_json(orient="records", double_precision=6))
        hosts = json.loads(cross_host(df).to_json(orient="records", double_precision=6))
        vs = json.loads(ddtree_vs_dflash(run, df).to_json(orient="records", double_precision=6))
        packed = json.loads(pack_check(run).to_json(orient="records", double_precision=6))
        return dumps_indented({"run": run.meta, "rows": records, "cross_host": hosts, "ddtree_vs_dflash": vs,
                               "baseline_alone_vs_packed": packed, "problems": run.problems}) + "\n"
    seed = hand_run_lines(df)
    md = [f"# Run {run.meta.get('run_id', run.root.name)}", "", *environment_markdown(run, wide)]
    md += ["```", *(seed if wide else [part for line in seed for part in wrap(line, WIDTH)]), "```", ""]
    md += ["## Speedup vs the autoregressive baseline", "", *methods_markdown(run, df, wide)]
    if wide:
        md += ["", "## Every column", "", *full_markdown(df)]
    checked = _records(df[df["checks"].astype(bool)].drop_duplicates(["host", "config_id"]))
    if checked:
        packed = any("packed" in r["flags"].split(",") for r in checked)
        md += ["", "## Checks that did not pass" + (", and packing" if packed else ""), ""]
        for r in sorted(checked, key=lambda r: (r["host"], _order(r["tp"], r["method"], r["method_params"],
                                                                  r["config_id"]))):
            md += _text(f"- {r['host']} {r['config_id']} [{r['flags']}]: {r['checks']}", wide)
    for section in (pack_markdown(pack_check(run), wide), cross_host_markdown(df, wide),
                    vs_markdown(run, ddtree_vs_dflash(run, df), wide), timing_markdown(run, wide)):
        if section:
            md += ["", *section]
    if run.problems:  # each whole on its line, for the file (and line) it names
        md += ["", "## Problems in the results (skipped)", "", "```", *[f"- {p}" for p in run.problems], "```"]
    return "\n".join(md) + "\n"

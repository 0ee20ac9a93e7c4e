"""DDTree against DFlash: where a table group (host, engine, model, tp and cell) holds both methods, every DDTree
budget against every DFlash config, with the DFlash config's SGLang scheduling path; and the DFlash configs with no
DDTree config beside them."""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from agent.records import cell_key

from ..results import ConfigResult, Run
from ..stats import NONE, significant, summary_ratio_ci
from ..views import budget
from ..vocab import CELL
from . import PAIR
from .speedup import samples, table

DDTREE, DFLASH = "ddtree", "dflash"

# SGLang runs DFlash overlapped from 0.5.14 unless --disable-overlap-schedule is given; up to 0.5.13 it forces
# overlap off for DFlash (the host's probe records it: engine.features.dflash_overlap). SGLANG_ENABLE_SPEC_V2 never
# applied to DFlash. DDTree's patch forces overlap off whatever the config says.
NO_OVERLAP_FLAG = "--disable-overlap-schedule"

VS_COLUMNS = PAIR + ["ddtree_config_id", "budget", "ddtree_n", "ddtree_tok_s_mean", "ddtree_tok_s_std", "speedup",
                     "speedup_ci_low", "speedup_ci_high", "ddtree_status", "dflash_config_id", "dflash_scheduling",
                     "same_path_as_ddtree", "dflash_n", "dflash_tok_s_mean", "dflash_tok_s_std", "dflash_status",
                     "ddtree_over_dflash", "ddtree_over_dflash_ci_low", "ddtree_over_dflash_ci_high",
                     "ddtree_over_dflash_significant"]


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
    tok = {(s["host"], s["config_id"], *cell_key(s)): s["tok"] for s in samples(run)}
    paths = {(c.host, c.config_id): scheduling(c, run.hosts.get(c.host)) for c in run.configs}
    method = df["method"].to_numpy()
    group = df.groupby(PAIR, sort=False, dropna=False).ngroup().to_numpy()  # numbered as they first appear
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
            a = tok.get((t["host"], t["config_id"], *(t[k] for k in CELL)), NONE)
            for f in flashes:
                b = tok.get((f["host"], f["config_id"], *(f[k] for k in CELL)), NONE)
                ratio = lo = hi = None
                if a[0] and b[0]:
                    ratio = a[1] / b[1]
                    lo, hi = summary_ratio_ci(a, b)
                path = paths.get((f["host"], f["config_id"]))
                rows.append({**{k: t[k] for k in PAIR}, "ddtree_config_id": t["config_id"], "budget": t["budget"],
                             "ddtree_n": t["n"], "ddtree_tok_s_mean": t["tok_s_mean"],
                             "ddtree_tok_s_std": t["tok_s_std"], "speedup": t["speedup"],
                             "speedup_ci_low": t["speedup_ci_low"], "speedup_ci_high": t["speedup_ci_high"],
                             "ddtree_status": t["status"], "dflash_config_id": f["config_id"],
                             "dflash_scheduling": path,
                             "same_path_as_ddtree": None if path is None else path == "no_overlap",
                             "dflash_n": f["n"], "dflash_tok_s_mean": f["tok_s_mean"],
                             "dflash_tok_s_std": f["tok_s_std"], "dflash_status": f["status"],
                             "ddtree_over_dflash": ratio, "ddtree_over_dflash_ci_low": lo,
                             "ddtree_over_dflash_ci_high": hi, "ddtree_over_dflash_significant": significant(lo, hi)})
    out = pd.DataFrame(rows, columns=VS_COLUMNS)
    for col in ("tp", "max_tokens", "context_tokens", "concurrency", "budget", "ddtree_n", "dflash_n"):
        out[col] = out[col].astype("Int64")
    return out


def dflash_alone(run: Run, df: pd.DataFrame | None = None) -> list[dict[str, Any]]:
    """The DFlash configs with no DDTree config to set against them (none on their host, engine, model and tp), each
    once: host, config_id, its tp, and the engine that measured it with the version host.json names (DDTree runs
    on SGLang with its patch; a run of another engine has DFlash rows only)."""
    df = table(run) if df is None else df
    if df.empty:
        return []
    with_tree = set(df.loc[df["method"] == DDTREE, ["host", "engine", "model", "tp"]].itertuples(index=False))
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in df.loc[df["method"] == DFLASH].itertuples(index=False):
        if (r.host, r.engine, r.model, r.tp) in with_tree or (r.host, r.config_id) in out:
            continue
        version = ((run.hosts.get(r.host) or {}).get("engine") or {}).get("version")
        out[(r.host, r.config_id)] = {"host": r.host, "config_id": r.config_id, "tp": int(r.tp),
                                      "engine": r.engine, "engine_version": version}
    return list(out.values())

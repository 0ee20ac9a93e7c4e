"""The report's tables, computed once and rendered by `collector.outputs`: the speedup table, one row per (host,
engine, model, tp, workload, max_tokens, context_tokens, concurrency, method + params), each spec row paired with
its autoregressive baseline; where a table group holds both, every DDTree budget against every DFlash config; for a
packed phase, its baseline measured alone against the same baseline measured again while the phase's other configs
ran beside it (the pack check, which is never a baseline nor a row of the table); the time per config; the spread
across hosts. (Just past 400 lines: each table beside the pairing of rows it is computed from.)"""
from __future__ import annotations

import json
import numbers
from typing import Any

import numpy as np
import pandas as pd
import scipy.special  # noqa: F401  (stats' t quantile: loaded with the report, while request lines are read)

from agent import records
from agent.pack import PACK_SUFFIX

from . import serving
from .load import NONE, ConfigResult, Run, Summary
from .stats import ratio_ci_of
from .views import budget, budget_key

CELL = ["host", "engine", "model", "tp", *records.CELL]  # a row of the table; a spec row pairs with the baseline's


# Per cell, its latency percentiles, requests/s, for an open-loop cell the rate its client achieved and how late it
# sent (p99), and where latency limits are set (`slo`, JSON) the share of its requests within them, whether that
# share reaches the limits' attainment, and goodput (collector.serving), with goodput ÷ the baseline's.
SERVING_COLUMNS = [f"{m}_p{q}_s" for m in serving.LATENCIES for q in serving.PCTS] + [
    "req_s_mean", "achieved_rate", "send_lag_p99_s", "slo", "slo_met", "within_slo", "goodput_req_s",
    "goodput_tok_s", "goodput_speedup", "goodput_speedup_ci_low", "goodput_speedup_ci_high"]


COLUMNS = CELL + ["config_id", "method", "method_params", "n", "errors", "tok_s_mean", "tok_s_std", "speedup",
                  "speedup_ci_low", "speedup_ci_high", "significant", "accept_length_mean", "ttft_mean_s",
                  "status", "cv", "tpot_mean_s", "burst_tok_s_mean", "burst_speedup", "burst_speedup_ci_low",
                  "burst_speedup_ci_high", "flags", "checks"] + SERVING_COLUMNS


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
            "n_total": 0, "serving": None}
    checks_of = pack_checks(run)
    for c in run.configs:
        ident = {**_identity(c), "pack_check_of": checks_of.get((c.host, c.config_id))}
        st = c.status.get("status")
        flags, checks = config_flags(c.status)
        limits = _limits(c)
        if st != "ok":
            for cell in c.config.get("cells") or [{}]:
                key = records.cell_key(cell) if isinstance(cell, dict) else (None,) * len(records.CELL)
                out.append({**ident, **dict(zip(records.CELL, key)), **none, "slo": limits.get(key),
                            "status": c.status.get("reason") or st, "flags": [], "checks": ""})
            continue
        cells: dict[tuple[Any, ...], dict[str, Any]] = {}
        for rows in c.cells:  # the valid request lines, by cell, summed up (load.CellRows)
            cells[rows.key] = {**ident, **dict(zip(records.CELL, rows.key)), "tok": rows.tok, "bursts": rows.bursts,
                               "acc_mean": rows.acc_mean, "ttft_mean": rows.ttft_mean, "tpot_mean": rows.tpot_mean,
                               "errors": rows.errors, "n_total": rows.n_total, "status": "ok", "flags": list(flags),
                               "checks": checks, "serving": rows.serving, "slo": limits.get(rows.key)}
        for cell in c.config.get("cells") or []:
            key = records.cell_key(cell) if isinstance(cell, dict) else None
            if key is not None and key not in cells:  # listed in the config, but no valid request line for it
                cells[key] = {**ident, **dict(zip(records.CELL, key)), **none, "status": "no_data", "flags": [],
                              "checks": "", "slo": limits.get(key)}
        out.extend(cells.values())
    return out


def _limits(c: ConfigResult) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The latency limits of each of a config's cells (config.json's cells[].slo), by cell key."""
    cells = c.config.get("cells")
    return {records.cell_key(x): x["slo"] for x in cells if isinstance(x, dict) and isinstance(x.get("slo"), dict)
            and x["slo"]} if isinstance(cells, list) else {}


def aggregate(s: dict[str, Any]) -> bool:
    """Whether a cell's throughput is its bursts' (several requests at once, or an open-loop schedule) rather than
    its requests' own tok/s."""
    return (s["concurrency"] or 1) > 1 or s["request_rate"] is not None


def _serving(s: dict[str, Any], base: dict[str, Any] | None) -> dict[str, Any]:
    """A row's SERVING_COLUMNS, from its sample (and its baseline's, for goodput ÷ the baseline's)."""
    out: dict[str, Any] = dict.fromkeys(SERVING_COLUMNS)
    got: serving.Serving | None = s.get("serving")
    if got is None:
        return out
    for m in serving.LATENCIES:
        out.update(zip((f"{m}_p{q}_s" for q in serving.PCTS), got.percentiles(m)))
    out["req_s_mean"] = got.req_s()[1]
    if got.achieved:
        out["achieved_rate"] = sum(got.achieved) / len(got.achieved)
    out["send_lag_p99_s"] = got.late()
    slo = s.get("slo")
    if not slo:
        return out
    out["slo"] = json.dumps(slo, sort_keys=True)
    out["slo_met"] = got.share(slo)
    out["within_slo"] = None if out["slo_met"] is None else out["slo_met"] >= serving.attainment(slo)
    req, tok = got.goodput(slo)
    out["goodput_req_s"], out["goodput_tok_s"] = req[1], tok[1]
    theirs = base.get("serving") if base else None
    if theirs is not None and tok[1] is not None:
        _, btok = theirs.goodput(slo)
        if btok[1]:
            out["goodput_speedup"] = tok[1] / btok[1]
            lo, hi = (out["goodput_speedup"],) * 2 if s["method"] == "autoregressive" else _ratio(tok, btok)
            out["goodput_speedup_ci_low"], out["goodput_speedup_ci_high"] = lo, hi
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
                  if s["method"] == "autoregressive" and s["status"] == "ok" and aggregate(s)}
    base_sample = {tuple(s[k] for k in CELL): s for s in samples if s["method"] == "autoregressive"
                   and s["status"] == "ok"}
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
        served = _serving(s, base_sample.get(tuple(s[k] for k in CELL)))
        if served["send_lag_p99_s"] is not None and served["send_lag_p99_s"] > serving.LATE_S:
            flags.append("behind_schedule")
        burst = s["bursts"] if aggregate(s) else NONE
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
                     "checks": s["checks"], **served})
    df = pd.DataFrame(rows, columns=COLUMNS)
    if df.empty:
        return df
    for col in ("tp", "max_tokens", "context_tokens", "concurrency", "n", "errors"):
        df[col] = df[col].astype("Int64")  # integers stay integers beside empty cells
    df["request_rate"] = rates(df["request_rate"])
    df["_spec"] = df["method"] != "autoregressive"
    df["_rate"] = df["request_rate"].astype(float)
    df["_open"] = df["_rate"].notna()
    df = df.sort_values(["host", "tp", "workload", "max_tokens", "context_tokens", "_open", "concurrency",
                         "_rate", "_spec", "config_id"], na_position="last", kind="stable")
    return df.drop(columns=["_spec", "_open", "_rate"]).reset_index(drop=True)


def rates(column: pd.Series) -> pd.Series:
    """A request_rate column as records.rate gives it (a float, inf: every request at once), None (not NaN, so
    that a row's cell matches its sample's key) for a closed-loop cell."""
    def one(v: Any) -> Any:
        return None if v is None or (isinstance(v, float) and v != v) else records.rate(v)
    return pd.Series([one(v) for v in column], index=column.index, dtype=object)


def cross_host(df: pd.DataFrame) -> pd.DataFrame:
    """Per config and cell: tok/s and speedup on each host side by side, and their spread
    (max/min - 1 of tok/s across the hosts that have the cell)."""
    ok = df[df["status"] == "ok"]
    if ok.empty or ok["host"].nunique() < 2:
        return pd.DataFrame()
    keys = ["config_id", "workload", "max_tokens", "context_tokens", "concurrency", "request_rate"]
    ok = ok.assign(request_rate=ok["request_rate"].map(lambda v: -1.0 if v is None else v))  # pivots drop NA keys
    tok = ok.pivot_table(index=keys, columns="host", values="tok_s_mean", aggfunc="first")
    spd = ok.pivot_table(index=keys, columns="host", values="speedup", aggfunc="first")
    out = pd.concat({"tok_s": tok, "speedup": spd}, axis=1)
    out.columns = [f"{host} {metric}" for metric, host in out.columns]
    out["tok_s_spread"] = tok.max(axis=1) / tok.min(axis=1) - 1
    out = out.reset_index()
    out["request_rate"] = rates(out["request_rate"].map(lambda v: None if v == -1.0 else v))
    return out


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

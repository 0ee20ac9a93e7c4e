"""The speedup table: one row per host, engine, model, tp, cell (workload, max_tokens, context_tokens, load) and
config (method + params), each spec row paired with its autoregressive baseline of the same cell: tok/s, speedup
with its 95% interval, acceptance, latency, serving figures, and the checks that did not pass. A packed phase's pack
check (its baseline measured again beside the phase's other configs) is never a row nor a baseline."""
from __future__ import annotations

import json
from typing import Any

import pandas as pd
import scipy.special  # noqa: F401  (stats' t quantile: loaded with the report, while request lines are read)

from agent import records
from agent.pack import PACK_SUFFIX
from agent.records import cell_key

from .. import serving
from ..results import ConfigResult, Run
from ..stats import NONE, significant, summary_ratio_ci
from ..vocab import CELL, seconds_words
from . import COLUMNS, PAIR, SERVING_COLUMNS

NOISY_CV = 0.05  # a cell whose tok/s varies more than this (std / mean) is flagged `noisy`


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


def _neighbour_text(n: Any) -> str:
    """`tp1-dflash (slot 1: 95.0 s up together, 80.0 s measuring together)`, from one entry of neighbours."""
    if not isinstance(n, dict):
        return str(n)
    return (f"{n.get('config_id')} (slot {n.get('slot')}: {seconds_words(n.get('overlap_s'))} up together, "
            f"{seconds_words(n.get('timed_overlap_s'))} measuring together)")


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


def samples(run: Run) -> list[dict[str, Any]]:
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
                key = cell_key(cell) if isinstance(cell, dict) else (None,) * len(CELL)
                out.append({**ident, **dict(zip(CELL, key)), **none, "slo": limits.get(key),
                            "status": c.status.get("reason") or st, "flags": [], "checks": ""})
            continue
        cells: dict[tuple[Any, ...], dict[str, Any]] = {}
        for rows in c.cells:  # the valid request lines, by cell, summed up (results.CellRows)
            cells[rows.key] = {**ident, **dict(zip(CELL, rows.key)), "tok": rows.tok, "bursts": rows.bursts,
                               "acc_mean": rows.acc_mean, "ttft_mean": rows.ttft_mean, "tpot_mean": rows.tpot_mean,
                               "errors": rows.errors, "n_total": rows.n_total, "status": "ok", "flags": list(flags),
                               "checks": checks, "serving": rows.serving, "slo": limits.get(rows.key)}
        for cell in c.config.get("cells") or []:
            key = cell_key(cell) if isinstance(cell, dict) else None
            if key is not None and key not in cells:  # listed in the config, but no valid request line for it
                cells[key] = {**ident, **dict(zip(CELL, key)), **none, "status": "no_data", "flags": [],
                              "checks": "", "slo": limits.get(key)}
        out.extend(cells.values())
    return out


def _limits(c: ConfigResult) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The latency limits of each of a config's cells (config.json's cells[].slo), by cell key."""
    cells = c.config.get("cells")
    return {cell_key(x): x["slo"] for x in cells if isinstance(x, dict) and isinstance(x.get("slo"), dict)
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
            lo, hi = (out["goodput_speedup"],) * 2 if s["method"] == "autoregressive" else summary_ratio_ci(tok, btok)
            out["goodput_speedup_ci_low"], out["goodput_speedup_ci_high"] = lo, hi
    return out


def table(run: Run) -> pd.DataFrame:
    rowed = [s for s in samples(run) if s["pack_check_of"] is None]  # a pack check is no row and no baseline
    base = {tuple(s[k] for k in PAIR): s["tok"] for s in rowed
            if s["method"] == "autoregressive" and s["status"] == "ok" and s["tok"][0]}
    base_burst = {tuple(s[k] for k in PAIR): s["bursts"] for s in rowed
                  if s["method"] == "autoregressive" and s["status"] == "ok" and aggregate(s)}
    base_sample = {tuple(s[k] for k in PAIR): s for s in rowed if s["method"] == "autoregressive"
                   and s["status"] == "ok"}
    rows = []
    for s in rowed:
        n, m, sd = s["tok"]
        b = base.get(tuple(s[k] for k in PAIR))
        speedup = lo = hi = None
        if m is not None and b:
            speedup = m / b[1]
            lo, hi = (speedup, speedup) if s["method"] == "autoregressive" else summary_ratio_ci(s["tok"], b)
        sig = significant(lo, hi) if s["method"] != "autoregressive" else ""
        cv = sd / m if m and sd is not None else None
        flags = s["flags"] + (["noisy"] if cv is not None and cv > NOISY_CV else [])
        served = _serving(s, base_sample.get(tuple(s[k] for k in PAIR)))
        if served["send_lag_p99_s"] is not None and served["send_lag_p99_s"] > serving.LATE_S:
            flags.append("behind_schedule")
        burst = s["bursts"] if aggregate(s) else NONE
        bb = base_burst.get(tuple(s[k] for k in PAIR)) or NONE
        bm_, bsp = burst[1], None
        blo = bhi = None
        if bm_ is not None and bb[0]:
            bsp = bm_ / bb[1]
            blo, bhi = (bsp, bsp) if s["method"] == "autoregressive" else summary_ratio_ci(burst, bb)
        rows.append({**{k: s[k] for k in PAIR}, "config_id": s["config_id"], "method": s["method"],
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

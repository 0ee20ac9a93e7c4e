"""A run as the history store's rows (collector.store's tables): the run, its hosts' environments, its configs'
statuses, its cells (the speedup table, each with its tok/s interval and its acceptance length's spread and
interval) and its valid request lines."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

import numpy as np
import pandas as pd
from scipy import special

from .environment import host_environment
from .load import load_run
from .request_lines import ROW_KEYS
from .results import Run
from .store import ENV_COLUMNS, schema
from .tables.speedup import table


@dataclass
class Extract:
    """One run as the store's rows: per table, its columns (name -> list or array)."""

    run_id: str
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _text(v: Any) -> Optional[str]:
    return v if isinstance(v, str) and v else None


def _number(v: Any) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _json(v: Any) -> Optional[str]:
    return None if v is None else json.dumps(v, sort_keys=True)


def _columns(rows: list[dict[str, Any]], names: Iterable[str]) -> dict[str, list[Any]]:
    return {n: [r.get(n) for r in rows] for n in names}


def _host_rows(run: Run, run_id: str) -> list[dict[str, Any]]:
    out = []
    for host, info in run.hosts.items():
        pairs = host_environment(info, run.meta)
        labels = dict(pairs)
        gpus = info.get("gpus") if isinstance(info.get("gpus"), dict) else {}
        count = gpus.get("count") if isinstance(gpus.get("count"), int) else (
            len(gpus["devices"]) if isinstance(gpus.get("devices"), list) else None)
        out.append({"run_id": run_id, "host": host, **{col: labels.get(label) for label, col in ENV_COLUMNS.items()},
                    "gpu_count": count, "environment": json.dumps(dict(pairs))})
    return out


def _config_rows(run: Run, run_id: str) -> list[dict[str, Any]]:
    out = []
    for c in run.configs:
        ident, cfg, st = c.identity(), c.config, c.status
        out.append({"run_id": run_id, "host": c.host, "config_id": c.config_id,
                    "config_digest": _text(st.get("config_digest")), "phase": _text(cfg.get("phase")),
                    "engine": ident["engine"] or None, "model": ident["model"] or None,
                    "tp": ident["tp"] if isinstance(ident["tp"], int) else None, "method": ident["method"] or None,
                    "method_params": _json(ident["method_params"]), "server_args": _json(cfg.get("server_args")),
                    "env": _json(cfg.get("environment")), "status": _text(st.get("status")),
                    "reason": _text(st.get("reason")), "detail": _text(st.get("detail")),
                    "ready_s": _number(st.get("ready_s")), "wall_s": _number(st.get("wall_s")),
                    "requests": c.count, "requests_ok": st.get("requests_ok") if isinstance(
                        st.get("requests_ok"), int) else None,
                    "started_at": _text(st.get("started_at")), "finished_at": _text(st.get("finished_at"))})
    return out


def _request_columns(run: Run, run_id: str, digests: dict[tuple[str, str], Optional[str]]) -> dict[str, Any]:
    parts: dict[str, list[Any]] = {n: [] for n, _ in schema()["requests"]}
    for c in run.configs:
        rows = c.rows
        if not rows or not len(rows["ok"]):
            continue
        m = len(rows["ok"])
        parts["run_id"].append(np.full(m, run_id, dtype=object))
        parts["host"].append(np.full(m, c.host, dtype=object))
        parts["config_id"].append(np.full(m, c.config_id, dtype=object))
        parts["config_digest"].append(np.full(m, digests.get((c.host, c.config_id)), dtype=object))
        parts["line"].append(np.arange(m, dtype=np.int64))
        for k, v in rows.items():
            parts[k].append(v)
    return {k: (np.concatenate(v) if v else np.zeros(0)) for k, v in parts.items()}


def _t975(k: np.ndarray) -> np.ndarray:
    """t(0.975, k - 1) for each sample size k (NaN below 2), as stats.t_quantile gives it, in one call."""
    with np.errstate(invalid="ignore"):
        return np.where(k >= 2, special.stdtrit(np.maximum(k - 1, 1), 0.975), np.nan)


def _accept_spread(run: Run) -> dict[tuple[Any, ...], tuple[int, float]]:
    """(host, config_id, *cell) -> how many ok requests report an acceptance length, and its sample std."""
    out: dict[tuple[Any, ...], tuple[int, float]] = {}
    for c in run.configs:
        rows = c.rows
        if not rows or not len(rows["ok"]):
            continue
        acc = rows["accept_length"]
        use = rows["ok"] & ~np.isnan(acc)
        if not use.any():
            continue
        cols = [rows[k][use].tolist() for k in ROW_KEYS[:-1]]
        cols[-1] = [None if r != r else r for r in cols[-1]]  # request_rate: NaN (closed loop) as None
        keys = list(zip(*cols))
        group: dict[tuple[Any, ...], int] = {}
        ids = np.fromiter((group.setdefault(k, len(group)) for k in keys), dtype=np.int64, count=len(keys))
        vals = acc[use]
        n = np.bincount(ids)
        mean = np.bincount(ids, vals) / n
        with np.errstate(invalid="ignore", divide="ignore"):
            std = np.sqrt(np.bincount(ids, (vals - mean[ids]) ** 2) / (n - 1))
        for key, i in group.items():
            out[(c.host, c.config_id, *key)] = (int(n[i]), float(std[i]) if n[i] > 1 else math.nan)
    return out


def _cell_extras(df: Any, run: Run) -> None:
    """The table's cells get their tok/s interval (mean ± t·std/√n, 95%) and their acceptance length's spread and
    interval over the ok requests that report it."""
    def col(name: str) -> np.ndarray:
        return pd.to_numeric(df[name], errors="coerce").astype(float).to_numpy()

    n, mean, std = col("n"), col("tok_s_mean"), col("tok_s_std")
    half = _t975(n) * std / np.sqrt(np.where(n > 0, n, np.nan))
    df["tok_s_ci_low"], df["tok_s_ci_high"] = mean - half, mean + half
    spread = _accept_spread(run)
    rate = col("request_rate")
    got = [spread.get((h, c, w, m, x, k, r if r == r else None), (0, math.nan)) for h, c, w, m, x, k, r in zip(
        df["host"], df["config_id"], df["workload"], df["max_tokens"], df["context_tokens"], df["concurrency"], rate)]
    k = np.array([g[0] for g in got], dtype=float)
    s = np.array([g[1] for g in got], dtype=float)
    acc = col("accept_length_mean")
    half = _t975(k) * s / np.sqrt(np.where(k > 0, k, np.nan))
    df["accept_length_std"] = s
    df["accept_length_ci_low"], df["accept_length_ci_high"] = acc - half, acc + half


def extract(item: tuple[str, str]) -> Extract:
    """One run folder read as the store's rows (run in a worker process for most runs)."""
    run_id, folder = item
    return extract_run(run_id, load_run(Path(folder), keep_rows=True, parallel=False))


def extract_run(run_id: str, run: Run) -> Extract:
    """A run already read (with its request rows kept: load_run's keep_rows) as the store's rows."""
    df = table(run)
    digests = {(c.host, c.config_id): _text(c.status.get("config_digest")) for c in run.configs}
    requests = _request_columns(run, run_id, digests)
    df = df.assign(run_id=run_id, config_digest=[digests.get((h, c)) for h, c in zip(df["host"], df["config_id"])])
    if not df.empty:
        _cell_extras(df, run)
    cols = [n for n, _ in schema()["cells"]]
    for n in cols:
        if n not in df:
            df[n] = None
    out = Extract(run_id, problems=list(run.problems))
    meta = run.meta
    out.tables["runs"] = _columns([{
        "run_id": run_id, "suite": _text(meta.get("suite")), "started_at": _text(meta.get("started_at")),
        "finished_at": _text(meta.get("finished_at")), "specfleet_commit": _text(meta.get("project_version")),
        "schema_version": meta.get("schema_version") if isinstance(meta.get("schema_version"), int) else None,
        "hosts": len(run.hosts), "configs": len(run.configs), "requests": int(len(requests["ok"])),
        "problems": len(run.problems)}], [n for n, _ in schema()["runs"] if n not in ("fingerprint", "stored_at")])
    out.tables["hosts"] = _columns(_host_rows(run, run_id), [n for n, _ in schema()["hosts"]])
    out.tables["configs"] = _columns(_config_rows(run, run_id), [n for n, _ in schema()["configs"]])
    out.tables["cells"] = {n: _cell_column(df[n], t) for n, t in schema()["cells"]}
    out.tables["requests"] = requests
    out.tables["problems"] = {"run_id": [run_id] * len(run.problems), "problem": list(run.problems)}
    return out


def _cell_column(col: Any, sql_type: str) -> list[Any]:
    """A column of the report's table as plain Python values of its SQL type (None for every empty value)."""
    values = col.tolist()
    out: list[Any] = []
    for v in values:
        if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
            out.append(None)
        elif sql_type == "INTEGER":
            out.append(int(v))
        elif sql_type == "DOUBLE":
            out.append(math.inf if v == "inf" else float(v))
        elif sql_type == "BOOLEAN":
            out.append(bool(v))
        else:
            out.append(v if isinstance(v, str) else json.dumps(v, sort_keys=True))
    return out

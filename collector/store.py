"""The history store: every run under a results folder in one DuckDB file (`results/specfleet.duckdb` by default),
kept up to date incrementally, for `specfleet history` and for SQL.

One DuckDB file rather than a Parquet dataset: a run is replaced in one transaction (an update cut short leaves the
store as it was, never half a run), a changed run is deleted and inserted again without rewriting files, one file
is what a user copies or opens with the DuckDB CLI, and a thousand runs do not become thousands of small files.

A run is read again only when one of the files the store reads of it changed (name, size or modification time):
its fingerprint. The store mirrors the results folder: a run folder that is gone is dropped. A damaged file is
skipped and named with its line, as the report does (`problems`, and the store's own `problems` table). The store's
tables are `SCHEMA`; when they change, the next update rebuilds the store.

specfleet writes only to a store it made: one whose `meta` table holds its schema digest (a new store is made with
it, under a temporary name, then linked into place). Any other file at the store's path (not a database, damaged,
or a DuckDB database without the marker) is refused, named, and never written to, `--rebuild` included; so is
anything there, or at the write-ahead log's path beside it, that is not a regular file (judged before DuckDB opens
it, which would wait forever on a FIFO)."""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import multiprocessing
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import numpy as np

from agent.bounded import kind

from .environment import host_environment
from .load import NUMBERS, PARALLEL_BYTES, ROW_KEYS, Run, load_run

DB_FILE = "specfleet.duckdb"  # in the results folder
WAIT_S = 120.0  # how long an update waits for another process's update of the same store to end
BATCH_RUNS = 64  # runs read (by as many processes as there are CPUs) before they are inserted
RUN_FILES = ("run.json",)
HOST_FILES = ("host.json",)
CONFIG_FILES = ("config.json", "status.json", "requests.jsonl")

# The report's table columns stored as integers, text and booleans; every other one is a DOUBLE.
_INT = {"tp", "max_tokens", "context_tokens", "concurrency", "n", "errors"}
_TEXT = {"host", "engine", "model", "workload", "config_id", "method", "method_params", "significant", "status",
         "flags", "checks", "slo"}
_BOOL = {"within_slo"}


def _report_columns() -> list[tuple[str, str]]:
    from .tables import COLUMNS

    return [(c, "INTEGER" if c in _INT else "VARCHAR" if c in _TEXT else "BOOLEAN" if c in _BOOL else "DOUBLE")
            for c in COLUMNS]


# Environment labels (collector.environment.host_environment) -> columns of `hosts`
ENV_COLUMNS = {"GPUs": "gpus", "driver": "driver", "CUDA": "cuda", "engine": "engine", "engine commit": "engine_commit",
               "patches": "patches", "model": "model", "drafter": "drafter", "CPU": "cpu", "OS": "os"}


def schema() -> dict[str, list[tuple[str, str]]]:
    """Every table's columns and SQL types, in order."""
    return {
        "runs": [("run_id", "VARCHAR"), ("suite", "VARCHAR"), ("started_at", "TIMESTAMPTZ"),
                 ("finished_at", "TIMESTAMPTZ"), ("specfleet_commit", "VARCHAR"), ("schema_version", "INTEGER"),
                 ("hosts", "INTEGER"), ("configs", "INTEGER"), ("requests", "BIGINT"), ("problems", "INTEGER"),
                 ("fingerprint", "VARCHAR"), ("stored_at", "TIMESTAMPTZ")],
        "hosts": [("run_id", "VARCHAR"), ("host", "VARCHAR"), *((c, "VARCHAR") for c in ENV_COLUMNS.values()),
                  ("gpu_count", "INTEGER"), ("environment", "VARCHAR")],
        "configs": [("run_id", "VARCHAR"), ("host", "VARCHAR"), ("config_id", "VARCHAR"), ("config_digest", "VARCHAR"),
                    ("phase", "VARCHAR"), ("engine", "VARCHAR"), ("model", "VARCHAR"), ("tp", "INTEGER"),
                    ("method", "VARCHAR"), ("method_params", "VARCHAR"), ("server_args", "VARCHAR"),
                    ("env", "VARCHAR"), ("status", "VARCHAR"), ("reason", "VARCHAR"), ("detail", "VARCHAR"),
                    ("ready_s", "DOUBLE"), ("wall_s", "DOUBLE"), ("requests", "INTEGER"), ("requests_ok", "INTEGER"),
                    ("started_at", "TIMESTAMPTZ"), ("finished_at", "TIMESTAMPTZ")],
        "cells": [("run_id", "VARCHAR"), ("config_digest", "VARCHAR"), *_report_columns(),
                  ("tok_s_ci_low", "DOUBLE"), ("tok_s_ci_high", "DOUBLE"), ("accept_length_std", "DOUBLE"),
                  ("accept_length_ci_low", "DOUBLE"), ("accept_length_ci_high", "DOUBLE")],
        "requests": [("run_id", "VARCHAR"), ("host", "VARCHAR"), ("config_id", "VARCHAR"),
                     ("config_digest", "VARCHAR"), ("line", "INTEGER"),
                     *((k, "VARCHAR" if k == "workload" else "DOUBLE" if k == "request_rate" else "INTEGER")
                       for k in ROW_KEYS), ("ok", "BOOLEAN"),
                     *((k, "INTEGER" if k == "completion_tokens" else "DOUBLE") for k in NUMBERS)],
        "problems": [("run_id", "VARCHAR"), ("problem", "VARCHAR")],
    }


def schema_digest() -> str:
    return hashlib.sha256(json.dumps(schema()).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------------------
# Finding runs and what they hold
# ---------------------------------------------------------------------------------------------------------------

def runs_under(results: Path) -> dict[str, Path]:
    """Every run folder under `results` (one holding run.json or a host folder with host.json), by name."""
    out = {}
    for d in sorted(p for p in results.iterdir() if p.is_dir() and not p.name.startswith(".")) \
            if results.is_dir() else []:
        if (d / "run.json").exists() or any(d.glob("*/host.json")):
            out[d.name] = d
    return out


def fingerprint(root: Path) -> str:
    """What the store reads of a run folder, as names, sizes and modification times: it changes when any of
    those files is written, added or removed."""
    parts: list[str] = []

    def add(path: Path) -> None:
        try:
            st = path.stat()
        except OSError:
            return
        parts.append(f"{path.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}")

    for name in RUN_FILES:
        add(root / name)
    for host in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for name in HOST_FILES:
            add(host / name)
        for cfg in sorted(p for p in host.iterdir() if p.is_dir() and not p.name.startswith(".")):
            for name in CONFIG_FILES:
                add(cfg / name)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


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
    from scipy import special

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
    import pandas as pd

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
    from .tables import table

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
    import pandas as pd

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


# ---------------------------------------------------------------------------------------------------------------
# The store
# ---------------------------------------------------------------------------------------------------------------

class Busy(Exception):
    """Another process held the store past the wait."""


class Unusable(Exception):
    """The file is not a history store specfleet made (not a database, damaged, another storage version, or a
    DuckDB database without specfleet's marker): refused, and left as it is."""


MARKER = "schema"  # specfleet's marker: the `meta` table's row of this key holds the store's schema digest


def _refusal(db: Path, why: str) -> Unusable:
    return Unusable(f"{db}: {why}, not a history store specfleet made; left as it is: pass another --db, or move "
                    "it away and build the store there with `specfleet db`")


def _marked(con: Any) -> Optional[str]:
    """Why the open database is not specfleet's store (None: it carries the marker, a schema digest in `meta`)."""
    tables = sorted({r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()})
    columns = {r[0] for r in con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'meta'").fetchall()}
    if {"key", "value"} <= columns:
        got = con.execute(f"SELECT value FROM meta WHERE key = '{MARKER}'").fetchone()
        if got and isinstance(got[0], str) and len(got[0]) == 16 and set(got[0]) <= set("0123456789abcdef"):
            return None
    return f"a DuckDB database without specfleet's marker (its tables: {', '.join(tables) or 'none'})"


def _open(db: Path, read_only: bool, deadline: float, wait_s: float) -> Any:
    """DuckDB's connection, polled while another process holds the file (Busy past the deadline); a file DuckDB
    cannot open: Unusable."""
    import duckdb

    while True:
        try:
            return duckdb.connect(str(db), read_only=read_only)
        except duckdb.Error as exc:
            if not any(w in str(exc).lower() for w in ("could not set lock", "conflicting lock")):
                raise _refusal(db, f"DuckDB cannot open it ({str(exc).strip()})") from None
            if time.monotonic() >= deadline:
                raise Busy(f"{db}: held by another process past {wait_s:.0f} s ({exc})") from None
            time.sleep(0.2)  # polling the lock until the deadline: DuckDB offers no wait on it


def _kinds(db: Path) -> None:
    """Unusable unless the store and the write-ahead log DuckDB keeps beside it (when there is one) are regular files,
    judged by their status alone: DuckDB would wait forever on a FIFO at either, or read a device without end."""
    why = kind(db, follow=False)
    if why:
        raise _refusal(db, why)
    wal = db.with_name(db.name + ".wal")
    why = kind(wal, follow=False) if os.path.lexists(wal) else None
    if why:
        raise Unusable(f"{wal}: {why}, not the write-ahead log DuckDB keeps beside the history store {db}; left as "
                       "it is: move it away (or pass another --db), then run the same command again")


def _new(db: Path) -> None:
    """A new store at `db`: made under a temporary name beside it with its tables and marker, then linked into
    place, so that a file at `db` is always a marked store; never over a file that appeared meanwhile (that one,
    another process's store, is then used)."""
    import duckdb

    if not db.parent.is_dir():
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(db.parent))
    tmp = db.with_name(f".{db.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        con = duckdb.connect(str(tmp))
        try:
            con.execute("BEGIN TRANSACTION")
            _create(con, rebuild=True)
            con.execute("COMMIT")
            con.execute("CHECKPOINT")
        finally:
            con.close()
        os.link(tmp, db)
    except FileExistsError:
        pass
    finally:
        for made in (tmp, tmp.with_name(tmp.name + ".wal")):
            made.unlink(missing_ok=True)


def connect(db: Path, read_only: bool = False, wait_s: float = WAIT_S) -> Any:
    """The store, opened when no other process holds it for writing (polled until `wait_s` has passed: Busy). A
    file there that is not a store specfleet made (DuckDB cannot open it, or it lacks the marker) is refused,
    Unusable, and never written to; opened for writing where there is none, a new store is made."""
    deadline = time.monotonic() + wait_s
    if not os.path.lexists(db):
        if read_only:
            raise Unusable(f"{db}: no history store there: build it with `specfleet db`")
        _new(db)
    _kinds(db)
    con = _open(db, True, deadline, wait_s)
    try:
        why = _marked(con)
    finally:
        if not read_only or why:
            con.close()
    if why:
        raise _refusal(db, why)
    return con if read_only else _open(db, False, deadline, wait_s)


def _create(con: Any, rebuild: bool) -> bool:
    """Create the tables; drop and create them when `rebuild` or when their schema changed. True when the store
    was (re)created."""
    have = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    digest = schema_digest()
    old = con.execute(f"SELECT value FROM meta WHERE key = '{MARKER}'").fetchone() if "meta" in have else None
    if not rebuild and old is not None and old[0] == digest:
        return False
    for name in [*schema(), "meta"]:
        con.execute(f"DROP TABLE IF EXISTS {name}")
    for name, cols in schema().items():
        con.execute(f"CREATE TABLE {name} ({', '.join(f'{c} {t}' for c, t in cols)})")
    con.execute("CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
    con.execute(f"INSERT INTO meta VALUES ('{MARKER}', ?)", [digest])
    return True


@dataclass
class Summary:
    """What an update did."""

    db: Path
    read: list[str] = field(default_factory=list)  # runs read (new or changed)
    new: int = 0
    unchanged: int = 0
    dropped: list[str] = field(default_factory=list)  # runs whose folder is gone
    problems: int = 0
    rebuilt: bool = False
    runs: int = 0  # runs in the store afterwards
    seconds: float = 0.0

    def line(self) -> str:
        changed = len(self.read) - self.new
        return (f"history store {self.db}: {self.runs} runs; read {len(self.read)} ({self.new} new, {changed} "
                f"changed), {self.unchanged} unchanged, {len(self.dropped)} dropped (folder gone)"
                + (", rebuilt" if self.rebuilt else "")
                + (f"; {self.problems} problems skipped (warnings above)" if self.problems else "")
                + f"; {self.seconds:.1f} s")


def _extracts(todo: list[tuple[str, str]], given: dict[str, Run]) -> Iterable[Extract]:
    """Each run read, by as many processes as there are CPUs where there are several; a run large enough for
    load_run to read with several processes itself is read here; a run the caller has already read (`given`) is
    not read again."""
    import pandas  # noqa: F401  (loaded once, before the workers fork)

    from . import tables  # noqa: F401

    yield from (extract_run(rid, given[rid]) for rid, _ in todo if rid in given)
    todo = [t for t in todo if t[0] not in given]

    def size(folder: str) -> int:
        return sum(p.stat().st_size for p in Path(folder).glob("*/*/requests.jsonl"))

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    small = [t for t in todo if size(t[1]) < PARALLEL_BYTES]
    large = [t for t in todo if t not in small]
    if cpus > 1 and len(small) > 1 and "fork" in multiprocessing.get_all_start_methods():
        with multiprocessing.get_context("fork").Pool(min(cpus, len(small))) as pool:
            yield from pool.imap(extract, small, chunksize=4)
    else:
        yield from map(extract, small)
    yield from map(extract, large)


def _insert(con: Any, batch: list[Extract], prints: dict[str, str]) -> None:
    import pandas as pd

    now = pd.Timestamp.now(tz="UTC")
    for name, cols in schema().items():
        names = [c for c, _ in cols]
        frames = []
        for e in batch:
            got = e.tables[name]
            if name == "runs":
                got = {**got, "fingerprint": [prints[e.run_id]], "stored_at": [now]}
            frames.append(pd.DataFrame({n: got[n] for n in names}))
        frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=names)
        if frame.empty:
            continue
        con.register("_frame", frame)
        select = ", ".join(f"CAST({c} AS {t})" for c, t in cols)
        con.execute(f"INSERT INTO {name} SELECT {select} FROM _frame")
        con.unregister("_frame")


def update(results: Path, db: Optional[Path] = None, rebuild: bool = False, wait_s: float = WAIT_S,
           warn: Callable[[str], Any] = print, loaded: Optional[Run] = None) -> Summary:
    """Bring the store up to date with every run under `results`: new and changed runs read (each replaced in
    the same transaction as the others), runs whose folder is gone dropped, unchanged ones left alone. `loaded`:
    a run of `results` the caller has just read with its request rows kept (its problems already said), stored
    from that instead of being read again."""
    start = time.monotonic()
    db = db or results / DB_FILE
    found = runs_under(results)
    prints = {rid: fingerprint(folder) for rid, folder in found.items()}
    out = Summary(db)
    with _system_errors(db):
        _update(results, found, prints, out, rebuild, wait_s, warn, loaded)
    out.seconds = time.monotonic() - start
    return out


@contextlib.contextmanager
def _system_errors(db: Path) -> Iterator[None]:
    """DuckDB's I/O errors (a full disk, a read-only filesystem) as the OSError they are, naming the store."""
    import duckdb

    try:
        yield
    except duckdb.IOException as exc:
        text = str(exc)
        code = next((c for c in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EIO)
                     if os.strerror(c) in text), None)
        if code is None:
            raise
        raise OSError(code, os.strerror(code), str(db)) from exc


def _update(results: Path, found: dict[str, Path], prints: dict[str, str], out: Summary, rebuild: bool,
            wait_s: float, warn: Callable[[str], Any], loaded: Optional[Run]) -> None:
    """update's work, in one transaction: `found` the run folders under `results` with their fingerprints
    (`prints`), said in `out`."""
    import duckdb

    con = connect(out.db, wait_s=wait_s)
    try:
        con.execute("BEGIN TRANSACTION")
        out.rebuilt = _create(con, rebuild)
        stored = dict(con.execute("SELECT run_id, fingerprint FROM runs").fetchall())
        todo = [(rid, str(found[rid])) for rid in found if stored.get(rid) != prints[rid]]
        out.dropped = sorted(set(stored) - set(found))
        out.new = sum(1 for rid, _ in todo if rid not in stored)
        out.unchanged = len(found) - len(todo)
        gone = [*out.dropped, *(rid for rid, _ in todo if rid in stored)]
        for name in schema():
            if gone:
                con.execute(f"DELETE FROM {name} WHERE run_id IN (SELECT unnest(?))", [gone])
        batch: list[Extract] = []
        given = {loaded.root.name: loaded} if loaded is not None and loaded.root.parent.resolve() == \
            results.resolve() and all(c.rows is not None or c.source is None for c in loaded.configs) else {}
        for e in _extracts(todo, given):
            for p in e.problems if e.run_id not in given else ():
                warn(f"warning: {p}")
            out.problems += len(e.problems)
            out.read.append(e.run_id)
            batch.append(e)
            if len(batch) >= BATCH_RUNS:
                _insert(con, batch, prints)
                batch = []
        _insert(con, batch, prints)
        out.runs = con.execute("SELECT count(*) FROM runs").fetchone()[0]
        con.execute("COMMIT")
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            pass  # nothing to roll back any more (the commit itself failed): the store is as it was
        raise
    finally:
        con.close()


def _shown(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def sql(db: Path, query: str, fmt: str = "md") -> str:
    """The answer to `query` from the store (opened read-only), as a markdown table, CSV or JSON. ValueError: the
    query failed (DuckDB's message)."""
    import csv
    import io

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
        def plain(v: Any) -> Any:
            if isinstance(v, float) and not math.isfinite(v):
                return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
            return v if v is None or isinstance(v, (bool, int, float, str)) else str(v)
        return json.dumps([{n: plain(v) for n, v in zip(names, r)} for r in rows], indent=1) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(names)
        w.writerows(["" if v is None else v for v in r] for r in rows)
        return buf.getvalue()
    from .history import pipe

    if not names:
        return "(no rows)\n"
    return pipe([dict(zip(names, map(_shown, r))) for r in rows] or [dict.fromkeys(names, "")]) + "\n"

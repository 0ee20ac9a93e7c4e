"""The history store's database: every run under a results folder in one DuckDB file (`results/specfleet.duckdb` by
default), for `specfleet history` and for SQL: its tables (`schema`), and opening it, or making it.

One DuckDB file rather than a Parquet dataset: a run is replaced in one transaction (an update cut short leaves the
store as it was, never half a run), a changed run is deleted and inserted again without rewriting files, one file
is what a user copies or opens with the DuckDB CLI, and a thousand runs do not become thousands of small files.
`collector.store_update` brings it up to date with a results folder, from each run's rows (`collector.store_rows`);
`collector.history` answers from it. When its tables change, the next update rebuilds the store.

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
import os
import time
import uuid
from pathlib import Path
from typing import Any, Iterator, Optional

from agent.bounded import kind

from .request_lines import NUMBERS, ROW_KEYS
from .tables import COLUMNS

DB_FILE = "specfleet.duckdb"  # in the results folder
WAIT_S = 120.0  # how long an update waits for another process's update of the same store to end

# The speedup table's columns stored as integers, text and booleans; every other one is a DOUBLE.
_INT = {"tp", "max_tokens", "context_tokens", "concurrency", "n", "errors"}
_TEXT = {"host", "engine", "model", "workload", "config_id", "method", "method_params", "significant", "status",
         "flags", "checks", "slo"}
_BOOL = {"within_slo"}


def _report_columns() -> list[tuple[str, str]]:
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
            create(con, rebuild=True)
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


def create(con: Any, rebuild: bool) -> bool:
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


@contextlib.contextmanager
def system_errors(db: Path) -> Iterator[None]:
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

"""Bringing the history store (collector.store) up to date with every run under a results folder, incrementally: a
run is read again only when one of the files the store reads of it changed (name, size or modification time: its
fingerprint), each new or changed run replaced in one transaction with the others; a run folder that is gone is
dropped. A damaged file is skipped and named with its line, as the report does (warnings, and the store's own
`problems` table)."""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import pandas as pd

from . import forked
from .request_lines import PARALLEL_BYTES
from .results import Run
from .store import DB_FILE, WAIT_S, connect, create, schema, system_errors
from .store_rows import Extract, extract, extract_run

BATCH_RUNS = 64  # runs read (by as many processes as there are CPUs) before they are inserted
RUN_FILES = ("run.json",)
HOST_FILES = ("host.json",)
CONFIG_FILES = ("config.json", "status.json", "requests.jsonl")


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
    not read again (pandas and the report's modules are loaded with this module, once, before the workers fork)."""
    yield from (extract_run(rid, given[rid]) for rid, _ in todo if rid in given)
    todo = [t for t in todo if t[0] not in given]

    def size(folder: str) -> int:
        return sum(p.stat().st_size for p in Path(folder).glob("*/*/requests.jsonl"))

    cpus = forked.cpus()
    small = [t for t in todo if size(t[1]) < PARALLEL_BYTES]
    large = [t for t in todo if t not in small]
    if cpus > 1 and len(small) > 1 and forked.available():
        with forked.pool(min(cpus, len(small))) as pool:
            yield from pool.imap(extract, small, chunksize=4)
    else:
        yield from map(extract, small)
    yield from map(extract, large)


def _insert(con: Any, batch: list[Extract], prints: dict[str, str]) -> None:
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
    with system_errors(db):
        _update(results, found, prints, out, rebuild, wait_s, warn, loaded)
    out.seconds = time.monotonic() - start
    return out


def _update(results: Path, found: dict[str, Path], prints: dict[str, str], out: Summary, rebuild: bool,
            wait_s: float, warn: Callable[[str], Any], loaded: Optional[Run]) -> None:
    """update's work, in one transaction: `found` the run folders under `results` with their fingerprints
    (`prints`), said in `out`."""
    import duckdb

    con = connect(out.db, wait_s=wait_s)
    try:
        con.execute("BEGIN TRANSACTION")
        out.rebuilt = create(con, rebuild)
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

"""Read a run folder per the results contract, tolerating damage: every problem is reported
with its file (and line) and skipped, never fatal.

A config's requests.jsonl is kept as what the report reads of it, summed up cell by cell (`CellRows`), not as its
lines. Its lines are read one of two ways, which keep the same lines and say the same of the others:
- plain: `json.loads` and `records.request_problem`, a line at a time (`agent.records.read_requests`, the
  stdlib reader the controller uses too);
- fast, with msgspec installed: the file a piece at a time, each line decoded and type-checked against
  `records.REQUEST` (config_id: the folder's) in C. A line msgspec refuses is read again the plain way, which
  decides what it is and what is said of it. A file holding a line that only the plain check refuses (an ok
  request without output_tok_s), or a byte at which str.splitlines() breaks a line and a split at newlines does
  not, is read wholly the plain way.
A large run's files are read by as many processes as there are CPUs. (Past 400 lines because both readers of one
file format live here, and must say the same of every line.)
"""
from __future__ import annotations

import functools
import gc
import json
import math
import multiprocessing
import os
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Optional, Union

import numpy as np

from agent import bounded, records
from agent.records import plain_line as _plain_line
from agent.records import plain_rows as _plain_rows
from agent.records import read_requests

from .serving import Serving
from .stats import mean_std

try:
    import msgspec
except ImportError:  # the plain reader alone: the same result, several times slower
    msgspec = None

OUTCOMES = [o.value for o in records.Outcome]
# The numbers the report reads of a valid request line, besides its cell and repetition (records.CELL, rep) and ok.
NUMBERS = ("output_tok_s", "tpot_s", "accept_length", "ttft_s", "sent_s", "done_s", "completion_tokens", "e2e_s",
           "chunk_gap_max_s", "scheduled_s")
PARALLEL_BYTES = 64 << 20  # requests.jsonl bytes from which a run's files are read by several processes at once
# Bytes at which str.splitlines() also breaks lines (after universal newlines made \r and \r\n a \n): a file
# that holds any is read the plain way, so that its lines are numbered as they always were.
_BREAKS = (b"\x0b", b"\x0c", b"\x1c", b"\x1d", b"\x1e")
_UTF8_BREAKS = (b"\xc2\x85", b"\xe2\x80\xa8", b"\xe2\x80\xa9")  # U+0085, U+2028, U+2029


Summary = tuple[int, Optional[float], Optional[float]]  # n, mean, sample std (stats.mean_std) of a sample
NONE: Summary = (0, None, None)


@dataclass
class CellRows:
    """What the report reads of the valid request lines of one cell of a config, summed up where they are read
    (in another process, for a large run), each figure as the report's own code works it out from the lines."""

    key: tuple[Any, ...]  # records.cell_key: workload, max_tokens, context_tokens, concurrency
    n_total: int = 0  # valid lines
    errors: int = 0  # of those, not ok
    tok: Summary = NONE  # output_tok_s of the ok ones
    bursts: Summary = NONE  # report.bursts() of the lines, where concurrency > 1: each burst's aggregate tok/s
    acc_mean: Optional[float] = None  # mean accept_length of the ok ones that carry it
    ttft_mean: Optional[float] = None  # likewise, ttft_s
    tpot_mean: Optional[float] = None  # likewise, tpot_s
    serving: Optional[Serving] = None  # what latency limits, goodput and the achieved rate are worked out from


def summary(xs: list[float]) -> Summary:
    return (len(xs), *mean_std(xs))


def _mean(xs: list[float]) -> Optional[float]:
    return sum(xs) / len(xs) if xs else None  # mean_std(xs)[0]


@dataclass
class RequestFile:
    """One requests.jsonl as read: its cells in the order they first appear, its first valid line (as
    `json.loads` gives it), how many lines were valid, what was wrong with the others, whether it is blank."""

    cells: list[CellRows] = field(default_factory=list)
    first: Optional[dict[str, Any]] = None
    count: int = 0
    problems: list[str] = field(default_factory=list)
    blank: bool = False
    rows: Optional[dict[str, np.ndarray]] = None  # the valid lines by column (`row_columns`), when asked for


@dataclass
class ConfigResult:
    host: str
    config_id: str
    config: dict[str, Any]
    status: dict[str, Any]
    cells: list[CellRows] = field(default_factory=list)  # its valid request lines, by cell
    first: Optional[dict[str, Any]] = None  # its first valid request line
    count: int = 0  # how many request lines were valid
    source: Optional[Path] = None  # its requests.jsonl, where there is one
    rows: Optional[dict[str, np.ndarray]] = None  # its valid request lines by column, when load_run kept them

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The valid request lines themselves, read again from the file (the report needs only `cells`)."""
        return read_requests(self.source, []) if self.source is not None and self.source.exists() else []

    def identity(self) -> dict[str, Any]:
        """What the config is (engine, model name, method, params, tp), from config.json or, when that is lost,
        from its first request line (which carries the same fields), so its rows still pair with their
        baseline."""
        cfg, first = self.config, (self.first or {})
        model = cfg.get("model")
        return {"host": self.host, "config_id": self.config_id,
                "engine": cfg.get("engine") or first.get("engine", ""),
                "model": model.get("name") if isinstance(model, dict) else (first.get("model") or ""),
                "tp": cfg.get("tp", first.get("tp")), "method": cfg.get("method") or first.get("method", ""),
                "method_params": cfg.get("method_params", first.get("method_params", {}))}


@dataclass
class Run:
    root: Path
    meta: dict[str, Any]
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)
    configs: list[ConfigResult] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)  # the report's, worked out once


# ---------------------------------------------------------------------------------------------------------------
# The fast reader: msgspec decodes and type-checks every line at once; the plain reader has the last word
# ---------------------------------------------------------------------------------------------------------------

_PY = {"string": str, "integer": int, "number": float, "boolean": bool, "object": dict, "array": list,
       "null": type(None)}
_REQUEST_NAMES = tuple(f.name for f in records.REQUEST)
CHUNK_BYTES = 1 << 18  # lines are decoded about this many bytes at a time: their objects stay in the CPU's cache


def _row_type(folder: str) -> Any:
    """records.REQUEST as a msgspec type, for the lines of config folder `folder`: each field with the JSON types
    it may have (config_id: the folder's name only); an optional field is None when absent, and may be null
    only where REQUEST allows it. Fields outside REQUEST are skipped, as the plain check ignores them. A `number`
    takes a JSON integer (as the plain check does), as the float of its value."""
    fields: list[tuple[Any, ...]] = []
    for f in records.REQUEST:
        kinds = tuple(_PY[t] for t in f.types)
        kind = kinds[0] if len(kinds) == 1 else Union[kinds]
        if f.name == "config_id":
            kind = Literal[folder]
        fields.append((f.name, kind) if f.required else (f.name, kind, None))
    return msgspec.defstruct("RequestRow", fields, kw_only=True, gc=False)


class _Whole(Exception):
    """A file to read whole before splitting its lines: it holds \\r or non-ASCII bytes."""


def _streamed(path: Path) -> Iterator[list[bytes]]:
    """The file's lines, a piece (about CHUNK_BYTES) at a time, read as they are needed: each piece is still in
    the CPU's cache while it is decoded, and no buffer the size of the file is allocated (and page-faulted in).
    Not a regular file within bounded.REQUESTS: BoundError before a byte is read."""
    rest = b""
    for block in bounded.chunks(path, bounded.REQUESTS, CHUNK_BYTES):
        if b"\r" in block or not block.isascii():
            raise _Whole
        if rest:
            block = rest + block
        cut = block.rfind(b"\n")
        if cut < 0:
            rest = block
            continue
        rest = block[cut + 1:]
        yield block[:cut].split(b"\n")
    if rest:
        yield [rest]


def _whole(data: bytes) -> Iterator[list[bytes]]:
    """The lines of a file read whole (universal newlines already applied), a piece at a time."""
    pos, size = 0, len(data)
    while pos < size:
        cut = data.find(b"\n", pos + CHUNK_BYTES)
        end = size if cut < 0 else cut
        lines = data[pos:end].split(b"\n")
        if end == size and not lines[-1]:
            lines.pop()  # the newline that ends the file
        yield lines
        pos = end + 1


def _read_whole(path: Path) -> bytes:
    """The file, with universal newlines (as Path.read_text() reads it)."""
    data = bounded.read_bytes(path, bounded.REQUESTS)
    return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n") if b"\r" in data else data


class _Columns:
    """What the report reads of the valid lines, by column, added a piece of the file at a time while the
    piece's objects are still in the CPU's cache: the first line of each (cell, repetition) pair (`bursts`,
    insertion-ordered), each line's pair as that first line's number, ok, and NUMBERS as floats (NaN: null)."""

    def __init__(self, key: Callable[[Any], tuple[Any, ...]], get: Callable[[Any, str], Any]) -> None:
        self.key, self.get = key, get
        self.bursts: dict[tuple[Any, ...], int] = {}
        self.n = 0
        self.parts: dict[str, list[np.ndarray]] = {"burst": [], "ok": [], **{k: [] for k in NUMBERS}}

    def add(self, rows: list[Any]) -> None:
        m = len(rows)
        parts, get = self.parts, self.get
        parts["burst"].append(np.fromiter(map(self.bursts.setdefault, map(self.key, rows), range(self.n, self.n + m)),
                                          dtype=np.int64, count=m))
        parts["ok"].append(np.array([get(r, "ok") for r in rows] if m else [], dtype=bool))
        for k in NUMBERS:
            parts[k].append(np.array([get(r, k) for r in rows] if m else [], dtype=float))
        self.n += m

    def column(self, name: str) -> np.ndarray:
        got = self.parts[name]
        return np.concatenate(got) if got else np.zeros(0, dtype={"burst": np.int64, "ok": bool}.get(name, float))


class _Fast(_Columns):
    """_Columns of msgspec rows: each field read by a C getter, over a whole piece."""

    def __init__(self) -> None:
        super().__init__(attrgetter(*records.CELL, "rep"), getattr)
        self.getters = {k: attrgetter(k) for k in ("ok", *NUMBERS)}

    def add(self, rows: list[Any]) -> None:
        m = len(rows)
        parts = self.parts
        parts["burst"].append(np.fromiter(map(self.bursts.setdefault, map(self.key, rows), range(self.n, self.n + m)),
                                          dtype=np.int64, count=m))
        for k, get in self.getters.items():
            parts[k].append(np.array(list(map(get, rows)), dtype=bool if k == "ok" else float))
        self.n += m


_rate_of = attrgetter("request_rate")


def _fast_columns(path: Path, problems: list[str]) -> Optional[tuple[_Columns, Optional[dict[str, Any]]]]:
    """The columns of every valid line, and the first valid line; None when the file must be read the plain
    way: it holds a byte at which str.splitlines() breaks a line and a split at newlines does not, or a line
    that only the plain check refuses. Problems are added only once the whole file is read. Raises OSError."""
    assert msgspec is not None
    try:
        return _decoded(path, _streamed(path), problems)
    except _Whole:
        pass
    data = _read_whole(path)
    if any(b in data for b in _BREAKS) or (not data.isascii() and any(b in data for b in _UTF8_BREAKS)):
        return None
    return _decoded(path, _whole(data), problems)


def _decoded(path: Path, pieces: Iterator[list[bytes]],
             problems: list[str]) -> Optional[tuple[_Columns, Optional[dict[str, Any]]]]:
    row_type = _row_type(path.parent.name)
    decode = msgspec.json.Decoder(row_type).decode
    cols = _Fast()
    rates: set[Any] = set()  # every request_rate met: one msgspec cannot check is left to the plain reader
    said: list[tuple[int, str]] = []  # (line, problem): the problems in line order at the end
    first: Optional[bytes] = None  # the first kept row's line
    line0 = 0
    for lines in pieces:
        try:
            rows: list[Any] = list(map(decode, lines))
            if first is None and lines:
                first = lines[0]
        except msgspec.DecodeError:
            if any(any(b in line for b in _BREAKS) for line in lines):  # never valid JSON: only in refused lines
                return None
            rows = []
            for i, line in enumerate(lines, line0):
                try:
                    rows.append(decode(line))
                except msgspec.DecodeError:
                    # the plain reader decides: blank, malformed, a wrong field, or valid after all
                    found: list[str] = []
                    row = _plain_line(path, i + 1, line.decode("utf-8", errors="replace"), found)
                    said.extend((i, p) for p in found)
                    if row is None:
                        continue
                    rows.append(row_type(**{k: row[k] for k in _REQUEST_NAMES if k in row}))
                if first is None:
                    first = line
        rates.update(map(_rate_of, rows))
        cols.add(rows)
        del rows
        line0 += len(lines)
    # What msgspec does not check: an ok request carries output_tok_s; a request_rate string is "inf". Such a
    # line is left to the plain reader.
    if (cols.column("ok") & np.isnan(cols.column("output_tok_s"))).any() or not all(map(records.rate_ok, rates)):
        return None
    problems += [p for _, p in sorted(said, key=lambda s: s[0])]
    return cols, (json.loads(first.decode("utf-8", errors="replace")) if first is not None else None)


def _plain_columns(rows: list[dict[str, Any]]) -> _Columns:
    cols = _Columns(lambda r: (*records.cell_key(r), r["rep"]), dict.get)
    cols.add(rows)
    return cols


def _cells(cols: _Columns) -> list[CellRows]:
    """The valid lines by cell, cells in the order they first appear, summed up as report._samples and
    report.bursts would sum up the lines themselves (the same figures, from the same numbers in the same
    order)."""
    n = cols.n
    if not n:
        return []
    burst = cols.column("burst")  # each line's (cell, rep) pair, as the number of the pair's first line
    ok = cols.column("ok")
    num = {k: cols.column(k) for k in NUMBERS}
    pairs = list(cols.bursts.items())  # in order of their first lines
    pair_first = np.fromiter((i for _, i in pairs), dtype=np.int64, count=len(pairs))
    cell_of: dict[tuple[Any, ...], int] = {}
    pair_cell = np.fromiter((cell_of.setdefault((*key[:-2], records.rate(key[-2])), len(cell_of))
                             for key, _ in pairs), dtype=np.int64,
                            count=len(pairs))
    keys = list(cell_of)  # cells in the order they first appear
    pair = np.searchsorted(pair_first, burst)  # each line's pair, as its place in `pairs`
    cell = pair_cell[pair]
    by_cell = np.argsort(cell, kind="stable")  # each cell's lines in file order
    cell_bounds = np.searchsorted(cell[by_cell], np.arange(len(keys) + 1))
    # bursts: a pair whose lines are all ok and timed, over its first send to its last finish
    by_pair = np.argsort(pair, kind="stable")
    pair_starts = np.searchsorted(pair[by_pair], np.arange(len(pairs)))
    timed = (ok & ~np.isnan(num["sent_s"]) & ~np.isnan(num["done_s"]))[by_pair]
    whole = np.logical_and.reduceat(timed, pair_starts)
    span = (np.maximum.reduceat(num["done_s"][by_pair], pair_starts)
            - np.minimum.reduceat(num["sent_s"][by_pair], pair_starts))
    counted = whole & (np.nan_to_num(span) > 0)
    rate = np.add.reduceat(np.nan_to_num(num["completion_tokens"])[by_pair], pair_starts) / np.where(counted, span, 1)
    # every repetition's span over its lines that carry both times (failed ones too), and its sends
    sent, done = num["sent_s"][by_pair], num["done_s"][by_pair]
    with np.errstate(invalid="ignore"):
        whole_span = np.fmax.reduceat(done, pair_starts) - np.fmin.reduceat(sent, pair_starts)
    out = []
    for c, key in enumerate(keys):
        idx = by_cell[cell_bounds[c]:cell_bounds[c + 1]]
        good = idx[ok[idx]]
        rows = CellRows(key, n_total=len(idx), errors=len(idx) - len(good),
                        tok=summary(num["output_tok_s"][good].tolist()))
        for name, attr in (("tpot_s", "tpot_mean"), ("accept_length", "acc_mean"), ("ttft_s", "ttft_mean")):
            values = num[name][good]
            setattr(rows, attr, _mean(values[~np.isnan(values)].tolist()))
        if (key[3] or 1) > 1 or key[4] is not None:  # one burst per repetition, in the order they first appear
            mine = np.flatnonzero((pair_cell == c) & counted)
            rows.bursts = summary(rate[mine].tolist())
        reps = np.flatnonzero(pair_cell == c)
        rows.serving = Serving.of(num, idx, good, pair[good], reps, whole_span[reps], pair[idx], key[4] is not None)
        out.append(rows)
    return out


ROW_KEYS = (*records.CELL, "rep")  # what row_columns gives of each line besides ok and NUMBERS


def row_columns(cols: _Columns) -> dict[str, np.ndarray]:
    """The valid lines as columns, in file order: ROW_KEYS (request_rate as `records.rate` gives it, NaN for a
    closed-loop line), ok and NUMBERS (NaN: null)."""
    pairs = list(cols.bursts)  # (cell, rep) of each pair, in the order of their first lines
    first = np.fromiter(cols.bursts.values(), dtype=np.int64, count=len(pairs))
    pair = np.searchsorted(first, cols.column("burst"))
    out: dict[str, np.ndarray] = {}
    for i, name in enumerate(ROW_KEYS):
        values = [key[i] for key in pairs]
        if name == "request_rate":
            per_pair = np.array([math.nan if v is None else records.rate(v) for v in values], dtype=float)
        elif name == "workload":
            per_pair = np.array(values, dtype=object)
        else:
            per_pair = np.array(values, dtype=np.int64)
        out[name] = per_pair[pair] if len(pairs) else per_pair
    out["ok"] = cols.column("ok")
    out.update((k, cols.column(k)) for k in NUMBERS)
    return out


def read_cells(path: Path, keep: bool = False) -> RequestFile:
    """A requests.jsonl read by cell (`keep`: its valid lines by column too, `rows`). Every line that is not a
    valid request is reported as `path:line`, as `read_requests` reports it, and skipped."""
    out = RequestFile()
    collecting = gc.isenabled()
    gc.disable()  # a million small objects, none of them in a cycle
    try:
        got = _fast_columns(path, out.problems) if msgspec is not None else None
        if got is None:
            rows = _plain_rows(path, bounded.read_bytes(path, bounded.REQUESTS), out.problems)
            got = _plain_columns(rows), (rows[0] if rows else None)
        cols, out.first = got
        out.cells, out.count = _cells(cols), cols.n
        if keep:
            out.rows = row_columns(cols)
        if not out.count:
            data = bounded.read_bytes(path, bounded.REQUESTS)
            out.blank = not data or data.isspace()  # not data.strip()
    except OSError as exc:
        return RequestFile(problems=[f"{path}: unreadable ({exc.strerror or exc}); its requests skipped"])
    finally:
        if collecting:
            gc.enable()
    return out


def _read_all(paths: list[Path], meanwhile: Optional[Callable[[], Any]], keep: bool = False,
              parallel: bool = True) -> list[RequestFile]:
    """Every file read by cell, in order; from PARALLEL_BYTES on by as many processes as there are CPUs (the
    largest files first, so they end together; `parallel` false: never), with `meanwhile` run here while they
    read."""
    read = functools.partial(read_cells, keep=keep)
    sizes = [p.stat().st_size if p.is_file() else 0 for p in paths]
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = min(cpus, len(paths))
    if (not parallel or workers < 2 or sum(sizes) < PARALLEL_BYTES
            or "fork" not in multiprocessing.get_all_start_methods()):
        if meanwhile is not None:
            meanwhile()
        return [read(p) for p in paths]
    order = sorted(range(len(paths)), key=lambda i: -sizes[i])
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        pending = pool.map_async(read, [paths[i] for i in order], chunksize=1)
        if meanwhile is not None:
            meanwhile()
        got = pending.get()
    files: list[RequestFile] = [RequestFile()] * len(paths)
    for i, f in zip(order, got):
        files[i] = f
    return files


# ---------------------------------------------------------------------------------------------------------------
# The run folder
# ---------------------------------------------------------------------------------------------------------------

def _read_json(path: Path, problems: list[Any], then: str) -> dict[str, Any] | None:
    """A JSON object file; None when missing (not reported) or damaged (reported with `then`, what follows): not
    a regular file within bounded.RECORD is said before anything is read."""
    try:
        text = bounded.read_text(path, bounded.RECORD, errors="replace")
    except FileNotFoundError:
        return None
    except OSError as exc:
        problems.append(f"{path}: unreadable ({exc.strerror or exc}); {then}")
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        problems.append(f"{path}:{exc.lineno}: malformed JSON ({exc.msg}, column {exc.colno}); {then}")
        return None
    if not isinstance(obj, dict):
        problems.append(f"{path}: not a JSON object (got {type(obj).__name__}); {then}")
        return None
    return obj


@dataclass
class _Later:
    """A place in the problems for what reading a config's requests.jsonl will find."""

    result: ConfigResult
    path: Path


def _config(host_dir: Path, d: Path, problems: list[Any]) -> ConfigResult | None:
    status_path = d / "status.json"
    if not status_path.exists():
        problems.append(f"{status_path}: missing (config incomplete or interrupted); config skipped")
        return None
    status = _read_json(status_path, problems, "config skipped")
    if status is None:
        return None
    if status.get("status") not in OUTCOMES:
        problems.append(f"{status_path}: status {status.get('status')!r} is not ok|failed|skipped; config skipped")
        return None
    config = _read_json(d / "config.json", problems, "the config's identity taken from its request lines")
    if config is None and not (d / "config.json").exists():
        problems.append(f"{d / 'config.json'}: missing; the config's identity taken from its request lines")
    jsonl = d / "requests.jsonl"
    result = ConfigResult(host_dir.name, d.name, config or {}, status)
    if jsonl.exists():
        result.source = jsonl
        problems.append(_Later(result, jsonl))  # read with the others, then its problems go here
    elif status["status"] == "ok":
        problems.append(f"{jsonl}: missing, though status.json says ok; its cells have no data")
    return result


def load_run(root: Path, meanwhile: Optional[Callable[[], Any]] = None, keep_rows: bool = False,
             parallel: bool = True) -> Run:
    """Every host folder (one holding host.json or config folders) and its configs. Damage is reported in
    `problems`, each naming its file (and line), and skipped; everything intact is kept. `meanwhile` runs
    while the request lines are read (in other processes, for a large run; `parallel` false: in this one).
    `keep_rows`: each config's valid request lines are kept too, by column (ConfigResult.rows)."""
    problems: list[Any] = []
    meta = _read_json(root / "run.json", problems, "run metadata unknown")
    if meta is None and not (root / "run.json").exists():
        problems.append(f"{root / 'run.json'}: missing; run metadata unknown")
    run = Run(root=root, meta=meta or {})
    for host_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        host_json = _read_json(host_dir / "host.json", problems, "host facts unknown; its configs are kept")
        cfg_dirs = sorted(p for p in host_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
        if host_json is None and not cfg_dirs:
            continue
        if host_json is None and not (host_dir / "host.json").exists():
            problems.append(f"{host_dir / 'host.json'}: missing; host facts unknown; its configs are kept")
        run.hosts[host_dir.name] = host_json or {}
        for d in cfg_dirs:
            result = _config(host_dir, d, problems)
            if result is not None:
                run.configs.append(result)
    later = [p for p in problems if isinstance(p, _Later)]
    files = dict(zip(map(id, later), _read_all([p.path for p in later], meanwhile, keep_rows, parallel)))
    for p in problems:
        if not isinstance(p, _Later):
            run.problems.append(p)
            continue
        f, c = files[id(p)], p.result
        c.cells, c.first, c.count, c.rows = f.cells, f.first, f.count, f.rows
        run.problems += f.problems
        if c.status["status"] == "ok" and not f.count and f.blank:
            run.problems.append(f"{p.path}: empty, though status.json says ok; its cells have no data")
    return run

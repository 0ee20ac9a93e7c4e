"""A config's requests.jsonl read by cell, tolerating damage: every line that is not a valid request is reported
with its file and line, and skipped.

A file is kept as what the report reads of it, summed up cell by cell (`results.CellRows`), not as its lines. Its
lines are read one of two ways, which keep the same lines and say the same of the others:
- plain: `json.loads` and `records.request_problem`, a line at a time (`agent.records.read_requests`, the
  stdlib reader the controller uses too);
- fast, with msgspec installed: the file a piece at a time, each line decoded and type-checked against
  `records.REQUEST` (config_id: the folder's) in C. A line msgspec refuses is read again the plain way, which
  decides what it is and what is said of it. A file holding a line that only the plain check refuses (an ok
  request without output_tok_s), or a byte at which str.splitlines() breaks a line and a split at newlines does
  not, is read wholly the plain way.
A large run's files are read by as many processes as there are CPUs (`read_all`).
"""
from __future__ import annotations

import functools
import gc
import json
import math
from dataclasses import dataclass, field
from operator import attrgetter, eq
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Optional, Union

import numpy as np

from agent import bounded, records
from agent.records import plain_line, plain_rows

from . import forked
from .results import CellRows, SpecRows
from .serving import Serving
from .stats import summary

try:
    import msgspec
except ImportError:  # the plain reader alone: the same result, several times slower
    msgspec = None

# The numbers the report reads of a valid request line, besides its cell and repetition (records.CELL, rep) and ok.
NUMBERS = ("output_tok_s", "tpot_s", "accept_length", "ttft_s", "sent_s", "done_s", "completion_tokens", "e2e_s",
           "chunk_gap_max_s", "scheduled_s")
# What the acceptance table reads of a line besides ok (results.SpecRows), summed up per file, never kept as columns:
# its speculative counts, and whether its accept_scope is `burst` (BURST_SCOPE).
SPEC = ("spec_steps", "spec_accepted_tokens", "spec_draft_tokens")
BURST_SCOPE = "burst_scope"
_is_burst = functools.partial(eq, "burst")  # eq("burst", None) is False, where "burst".__eq__(None) is not
PARALLEL_BYTES = 64 << 20  # requests.jsonl bytes from which a run's files are read by several processes at once
# Bytes at which str.splitlines() also breaks lines (after universal newlines made \r and \r\n a \n): a file
# that holds any is read the plain way, so that its lines are numbered as they always were.
_BREAKS = (b"\x0b", b"\x0c", b"\x1c", b"\x1d", b"\x1e")
_UTF8_BREAKS = (b"\xc2\x85", b"\xe2\x80\xa8", b"\xe2\x80\xa9")  # U+0085, U+2028, U+2029


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
    spec: SpecRows = field(default_factory=SpecRows)  # what the acceptance table reads of the ok lines



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
    insertion-ordered), each line's pair as that first line's number, ok, NUMBERS and SPEC as floats (NaN: null),
    and BURST_SCOPE."""

    def __init__(self, key: Callable[[Any], tuple[Any, ...]], get: Callable[[Any, str], Any]) -> None:
        self.key, self.get = key, get
        self.bursts: dict[tuple[Any, ...], int] = {}
        self.n = 0
        self.parts: dict[str, list[np.ndarray]] = {"burst": [], "ok": [], BURST_SCOPE: [],
                                                   **{k: [] for k in (*NUMBERS, *SPEC)}}

    def add(self, rows: list[Any]) -> None:
        m = len(rows)
        parts, get = self.parts, self.get
        parts["burst"].append(np.fromiter(map(self.bursts.setdefault, map(self.key, rows), range(self.n, self.n + m)),
                                          dtype=np.int64, count=m))
        parts["ok"].append(np.array([get(r, "ok") for r in rows] if m else [], dtype=bool))
        parts[BURST_SCOPE].append(np.array([_is_burst(get(r, "accept_scope")) for r in rows] if m else [], dtype=bool))
        for k in (*NUMBERS, *SPEC):
            parts[k].append(np.array([get(r, k) for r in rows] if m else [], dtype=float))
        self.n += m

    def column(self, name: str) -> np.ndarray:
        got = self.parts[name]
        return np.concatenate(got) if got else np.zeros(0, dtype={"burst": np.int64, "ok": bool,
                                                                   BURST_SCOPE: bool}.get(name, float))


class _Fast(_Columns):
    """_Columns of msgspec rows: each field read by a C getter, over a whole piece."""

    def __init__(self) -> None:
        super().__init__(attrgetter(*records.CELL, "rep"), getattr)
        self.getters = {k: attrgetter(k) for k in ("ok", *NUMBERS, *SPEC)}
        self.scope = attrgetter("accept_scope")

    def add(self, rows: list[Any]) -> None:
        m = len(rows)
        parts = self.parts
        parts["burst"].append(np.fromiter(map(self.bursts.setdefault, map(self.key, rows), range(self.n, self.n + m)),
                                          dtype=np.int64, count=m))
        for k, get in self.getters.items():
            parts[k].append(np.array(list(map(get, rows)), dtype=bool if k == "ok" else float))
        parts[BURST_SCOPE].append(np.fromiter(map(_is_burst, map(self.scope, rows)), dtype=bool, count=m))
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
                    row = plain_line(path, i + 1, line.decode("utf-8", errors="replace"), found)
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
    """The valid lines by cell, cells in the order they first appear, summed up as tables.speedup.samples and
    tables.speedup.bursts would sum up the lines themselves (the same figures, from the same numbers in the same
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


def spec_rows(cols: _Columns) -> SpecRows:
    """What the acceptance table reads of the ok lines (results.SpecRows): a line's spec_steps s counts where it is
    above 0, its spec_accepted_tokens a and spec_draft_tokens d where they are there."""
    ok = cols.column("ok")
    s, a, d = (cols.column(k)[ok] for k in SPEC)
    out = SpecRows(requests=int(ok.sum()), burst=int(cols.column(BURST_SCOPE)[ok].sum()))
    stepped = np.nan_to_num(s) > 0
    out.with_steps = int(stepped.sum())
    use = stepped & ~np.isnan(a)
    if use.any():
        a_used, s_used = a[use], s[use]
        out.n, out.accepted, out.steps = int(use.sum()), float(a_used.sum()), float(s_used.sum())
        out.residual_ss = float(np.sum((a_used - out.accepted / out.steps * s_used) ** 2))
    drafted = ~np.isnan(d) & ~np.isnan(a)
    out.drafted_rows = int(drafted.sum())
    out.drafted, out.drafted_accepted = float(d[drafted].sum()), float(a[drafted].sum())
    per_step = stepped & ~np.isnan(d)
    out.per_step_rows = int(per_step.sum())
    out.per_step_drafted, out.per_step_steps = float(d[per_step].sum()), float(s[per_step].sum())
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
            rows = plain_rows(path, bounded.read_bytes(path, bounded.REQUESTS), out.problems)
            got = _plain_columns(rows), (rows[0] if rows else None)
        cols, out.first = got
        out.cells, out.count, out.spec = _cells(cols), cols.n, spec_rows(cols)
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


def read_all(paths: list[Path], meanwhile: Optional[Callable[[], Any]], keep: bool = False,
              parallel: bool = True) -> list[RequestFile]:
    """Every file read by cell, in order; from PARALLEL_BYTES on by as many processes as there are CPUs (the
    largest files first, so they end together; `parallel` false: never), with `meanwhile` run here while they
    read."""
    read = functools.partial(read_cells, keep=keep)
    sizes = [p.stat().st_size if p.is_file() else 0 for p in paths]
    workers = min(forked.cpus(), len(paths))
    if not parallel or workers < 2 or sum(sizes) < PARALLEL_BYTES or not forked.available():
        if meanwhile is not None:
            meanwhile()
        return [read(p) for p in paths]
    order = sorted(range(len(paths)), key=lambda i: -sizes[i])
    with forked.pool(workers) as pool:
        pending = pool.map_async(read, [paths[i] for i in order], chunksize=1)
        if meanwhile is not None:
            meanwhile()
        got = pending.get()
    files: list[RequestFile] = [RequestFile()] * len(paths)
    for i, f in zip(order, got):
        files[i] = f
    return files

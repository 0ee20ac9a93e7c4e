"""The timed requests of one config against its ready server: prompts built with the server's own
tokenizer, an untimed warmup, then every cell's repetitions, as bursts of concurrent requests (closed loop) or
requests sent on a schedule (open loop, `arrivals`), with a progress event now and then (`Pace`).

`measure` returns the request rows and how the config ended; it never stops the server.
"""
from __future__ import annotations

import random
import statistics
import threading
import time
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Dict, List, Mapping, Optional, Tuple, Union

from . import arrivals, client, counters, foreign, hostload, records, workloads
from .classify import Reason, classify, tail
from .engines import Engine
from .leftovers import MARK
from .server import Server, http_status, wait_until
from .store import now_iso

Prompt = Union[str, List[int]]
Sink = Callable[..., None]  # where events go: HostStore.event(kind, **fields)


class PromptError(ValueError):
    """A workload prompt cannot be built as asked."""


@dataclass
class Endpoint:
    """How requests reach the server: its engine's API, address and auth."""

    engine: Engine
    port: int
    host: str = "127.0.0.1"
    headers: Dict[str, str] = field(default_factory=dict)


@dataclass
class Measured:
    """The rows of a config and how its requests ended (reason None when ok)."""

    rows: List[Dict[str, Any]]
    reason: Optional[Reason] = None
    detail: Optional[str] = None
    timed_s: float = 0.0
    fields: Dict[str, Any] = field(default_factory=dict)  # status.json: counters, order_seed, cold_start, host_load
    window: Optional[Tuple[float, float]] = None  # time.monotonic() around the timed requests


def prompts(cfg: Mapping[str, Any], ep: Endpoint) -> Dict[Tuple[str, int], Prompt]:
    """Plain prompts as text, chat messages as the token ids of the server's chat template; long-context prompts
    as token ids of exactly `context_tokens`, built with the server's tokenizer (filler, then the question)."""
    out: Dict[Tuple[str, int], Prompt] = {}
    name = cfg["model"]["name"]
    filler: List[int] = []
    for cell in cfg["cells"]:
        key = (cell["workload"], cell["context_tokens"])
        if key in out:
            continue
        given = cfg["prompts"][cell["workload"]]
        if cell["context_tokens"] == 0 and isinstance(given, str):
            out[key] = given
            continue
        q = client.post_json(ep.port, "/tokenize", ep.engine.tokenize_body(name, given), 60, ep.host,
                             ep.headers)["tokens"]
        if cell["context_tokens"] == 0:
            out[key] = q
            continue
        need = cell["context_tokens"] - len(q)
        if need < 0:
            raise PromptError(f"context_tokens {cell['context_tokens']} is shorter than the "
                              f"{cell['workload']!r} prompt itself ({len(q)} tokens)")
        reps = 1 + need // 64
        while len(filler) < need:
            got = client.post_json(ep.port, "/tokenize", ep.engine.tokenize_body(name, workloads.FILLER * reps, False),
                                   120, ep.host, ep.headers)["tokens"]
            if len(got) <= len(filler):  # the filler no longer grows: the server's tokenizer is not answering it
                raise PromptError(f"the server's /tokenize gave {len(got)} tokens for {reps} copies of the filler "
                                  f"text; {need} are needed for context_tokens {cell['context_tokens']}")
            filler, reps = got, reps * 2
        out[key] = filler[:max(need, 0)] + q
    return out


def request_seed(tag: str, slot: int) -> int:
    """A request's seed: the same for a cell's repetition and slot (`tag`: `c<cell>r<rep>`) in every run."""
    return zlib.crc32(f"{tag}-{slot}".encode())


def burst(cfg: Mapping[str, Any], ep: Endpoint, prompt: Prompt, max_tokens: int, n: int,
          tag: str) -> Tuple[List[Dict[str, Any]], float]:
    """`n` identical requests released together, each its own measurement; and the burst's seconds."""
    gate = threading.Barrier(n)
    deadline = cfg["timeouts"]["request_s"]

    def one(slot: int) -> Dict[str, Any]:
        body = ep.engine.request(cfg["model"]["name"], prompt, max_tokens, cfg["sampling"],
                                 salt=f"{tag}-{slot}-{uuid.uuid4().hex[:8]}", seed=request_seed(tag, slot))
        gate.wait()
        return {"slot": slot, "started_at": now_iso(),
                **client.stream(ep.engine, ep.port, body, deadline, ep.host, ep.headers)}

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=n) as pool:
        rows = list(pool.map(one, range(n)))
    return rows, time.monotonic() - t0


def open_loop(cfg: Mapping[str, Any], ep: Endpoint, prompt: Prompt, cell: Mapping[str, Any], rep: int,
              tag: str) -> Tuple[List[Dict[str, Any]], float]:
    """One repetition of an open-loop cell: its requests sent on the cell's schedule (`arrivals.schedule`), each
    when it is due whether or not the earlier ones finished; each row keeps when it was due (`t_due`) beside
    when it was sent. And the seconds from the schedule's start to the last request's end."""
    deadline = cfg["timeouts"]["request_s"]
    offsets = arrivals.schedule(cell, rep)
    bodies = [ep.engine.request(cfg["model"]["name"], prompt, cell["max_tokens"], cfg["sampling"],
                                salt=f"{tag}-{slot}-{uuid.uuid4().hex[:8]}", seed=request_seed(tag, slot))
              for slot in range(len(offsets))]

    def one(slot: int, due: float) -> Dict[str, Any]:
        return {"slot": slot, "started_at": now_iso(), "t_due": due,
                **client.stream(ep.engine, ep.port, bodies[slot], deadline, ep.host, ep.headers)}

    return arrivals.send(offsets, one)


def _timed_out(rows: List[Dict[str, Any]]) -> bool:
    return any(not r["ok"] and ("timed out" in str(r["error"]) or "deadline" in str(r["error"])) for r in rows)


# Errors of a request whose server went away (client.stream names the exception's type first). A killed server's
# sockets close while the kernel still tears the process down, so its client can see these a few milliseconds before
# the process can be reaped: the rest of the bursts may fail that fast, and the exit must be waited for, not sampled.
CONNECTION_LOST = ("ConnectionRefusedError", "ConnectionResetError", "ConnectionAbortedError", "BrokenPipeError",
                   "RemoteDisconnected", "IncompleteRead")
LOST_WAIT_S = 2.0  # how long a server whose connections were lost is given to be seen exiting


def gone(server: Server, rows: List[Dict[str, Any]]) -> bool:
    """Whether the server exited: at once, or, when a request of `rows` lost its connection, within LOST_WAIT_S.
    A server that lost a connection and is still running after that is not gone (the requests' errors stay
    theirs)."""
    if not server.alive():
        return True
    lost = any(not r["ok"] and str(r["error"]).startswith(CONNECTION_LOST) for r in rows)
    return lost and wait_until(lambda: not server.alive(), LOST_WAIT_S)


def order(cells: List[Mapping[str, Any]], seed: int) -> List[Tuple[int, int]]:
    """(repetition, cell index) in run order: round by round (every cell's repetition r before any r + 1),
    each round shuffled by `seed`, and never one cell twice in a row where another can go between."""
    rng = random.Random(seed)
    out: List[Tuple[int, int]] = []
    for rep in range(max(c["repetitions"] for c in cells)):
        todo = [i for i, c in enumerate(cells) if rep < c["repetitions"]]
        rng.shuffle(todo)
        if out and len(todo) > 1 and todo[0] == out[-1][1]:
            todo[0], todo[1] = todo[1], todo[0]
        out += [(rep, i) for i in todo]
    return out


def cold_start(rows: List[Mapping[str, Any]], factor: float = 3.0) -> Optional[Dict[str, Any]]:
    """The first timed request's TTFT against the median of the other requests of its cell: above `factor`
    times it, the warmup did not warm the path this cell takes."""
    if not rows or rows[0].get("ttft_s") is None:
        return None
    first = rows[0]
    same = [r["ttft_s"] for r in rows[1:] if r.get("ttft_s") is not None and records.cell_key(r) ==
            records.cell_key(first)]
    if not same:
        return None
    median = statistics.median(same)
    ratio = first["ttft_s"] / median if median > 0 else None
    return {"first_ttft_s": round(first["ttft_s"], 6), "cell_median_ttft_s": round(median, 6),
            "ratio": None if ratio is None else round(ratio, 3), "outlier": bool(ratio and ratio > factor)}


class Pace:
    """A config's progress through its timed requests, told to `events` as `records.Event.CONFIG_PROGRESS` after a burst
    once `every_s` has passed since it was last told: requests done of `total`, output tok/s over that window (the
    server's completion_tokens of the requests that finished in it, over its wall seconds) and the config's ETA
    (requests left times the mean seconds per request so far)."""

    def __init__(self, events: Optional[Sink], config_id: str, total: int, every_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.events, self.config_id, self.total, self.every_s, self.clock = events, config_id, total, every_s, clock
        self.start = self.last = clock()
        self.done = self.tokens = 0

    def begin(self) -> None:
        """The timed requests start now: the first window counts from here (not from the scans before them)."""
        self.start = self.last = self.clock()

    def burst(self, rows: List[Mapping[str, Any]]) -> None:
        self.done += len(rows)
        self.tokens += sum(r.get("completion_tokens") or 0 for r in rows if r["ok"])
        now = self.clock()
        window = now - self.last
        if self.events is None or window < self.every_s or window <= 0:
            return
        self.events(records.Event.CONFIG_PROGRESS, config_id=self.config_id, done=self.done, total=self.total,
                    tok_s=round(self.tokens / window, 2), window_s=round(window, 3),
                    eta_s=round((now - self.start) / self.done * (self.total - self.done), 1))
        self.last, self.tokens = now, 0


def measure(cfg: Mapping[str, Any], identity: Mapping[str, Any], server: Server, ep: Endpoint,
            seed: Optional[int] = None, timed: Optional[Callable[[], ContextManager[float]]] = None,
            events: Optional[Sink] = None, progress_s: float = 0.0) -> Measured:
    """Warmup, then every cell's repetitions in a shuffled order (`order`, its seed recorded), between two
    readings of the server's counters; stops early when the server dies or hangs. `timed` is entered around
    the timed requests (a packed phase's `pack.Busy`; it may wait first). With `events`, a progress event at
    most every `progress_s` seconds (`Pace`)."""
    t0 = time.monotonic()
    built = prompts(cfg, ep)
    t1 = time.monotonic()
    first = cfg["cells"][0]
    [warm], _ = burst(cfg, ep, built[(first["workload"], first["context_tokens"])], cfg["warmup_max_tokens"], 1,
                      "warmup")
    if not warm["ok"]:  # the engine's own words first (a drafter that passed health and died at its first step)
        reason = classify(tail(server.log_text(), 120), Reason.CRASHED if gone(server, [warm]) else
                          Reason.WARMUP_FAILED)
        return Measured([], reason, f"warmup request failed: {warm['error']}")
    seed = random.randrange(1 << 31) if seed is None else seed
    out = Measured([], fields={"order_seed": seed, "prompts_s": round(t1 - t0, 3),
                               "warmup_s": round(time.monotonic() - t1, 3)})
    with timed() if timed is not None else nullcontext(0.0) as waited:
        if waited:
            out.fields["waited_for_neighbours_s"] = round(waited, 3)
        total = sum(records.requests_of(c) * c["repetitions"] for c in cfg["cells"])
        return _timed(cfg, identity, server, ep, built, seed, out, Pace(events, identity["config_id"], total,
                                                                         progress_s))


def _timed(cfg: Mapping[str, Any], identity: Mapping[str, Any], server: Server, ep: Endpoint,
           built: Dict[Tuple[str, int], Prompt], seed: int, out: Measured, pace: Pace) -> Measured:
    run_id = str((getattr(server, "env", None) or {}).get(MARK, "")).split("/", 1)[0]  # the run of this server
    seen = foreign.merge([], foreign.scan(server.owns, run_id), "timed")  # (its port probes: before the load sample)
    before = counters.read(ep.engine, ep.port, ep.host, ep.headers)
    last = before if ep.engine.steps_from_counters and cfg["method"] != "autoregressive" else None
    load0 = hostload.sample(server.owns)
    origin: Optional[float] = None
    start = time.monotonic()
    pace.begin()
    for rep, i in order(cfg["cells"], seed):
        cell = cfg["cells"][i]
        prompt = built[(cell["workload"], cell["context_tokens"])]
        if cell.get("request_rate") is not None:
            got, seconds = open_loop(cfg, ep, prompt, cell, rep, f"c{i}r{rep}")
        else:
            got, seconds = burst(cfg, ep, prompt, cell["max_tokens"], cell["concurrency"], f"c{i}r{rep}")
        out.timed_s += seconds
        if last is not None:
            last = counters.steps_of_burst(ep.engine, ep.port, ep.host, ep.headers, last, got)
        pace.burst(got)
        origin = min(r["t_sent"] for r in got) if origin is None else origin
        for r in got:  # seconds since the first timed request was sent: bursts can be rebuilt from the rows
            sent, done, due = r.pop("t_sent"), r.pop("t_done"), r.pop("t_due", None)
            r["sent_s"], r["done_s"] = round(sent - origin, 6), None if done is None else round(done - origin, 6)
            if due is not None:
                r["scheduled_s"] = round(due - origin, 6)
        out.rows += [records.request_row(identity, cell, rep, r) for r in got]
        out.window = (start, time.monotonic())
        if gone(server, got):
            out.reason = classify(tail(server.log_text(), 120), Reason.CRASHED)
            out.detail = f"server {server.exit_detail()} during timed requests ({len(out.rows)} requests recorded)"
            return out
        if _timed_out(got) and http_status(ep.port, ep.engine.health_path, ep.host, 10.0, ep.headers) != 200:
            out.reason = Reason.REQUEST_TIMEOUT
            out.detail = (f"request deadline of {cfg['timeouts']['request_s']:g} s passed and the server no "
                          f"longer answers {ep.engine.health_path} (hung); {len(out.rows)} requests recorded")
            return out
    span = out.window[1] - out.window[0] if out.window else 0.0  # the CPU seconds cover the whole window
    out.fields["host_load"] = hostload.summary(load0, hostload.sample(server.owns), span)
    seen = foreign.merge(seen, foreign.scan(server.owns, run_id), "timed")
    if seen:
        out.fields["foreign"] = seen
    out.fields["counters"] = counters.check(before, counters.read(ep.engine, ep.port, ep.host, ep.headers),
                                            out.rows, cfg["method"] != "autoregressive")
    out.fields["cold_start"] = cold_start(out.rows)
    if not any(r["ok"] for r in out.rows):
        errors = sorted({str(r["error"]) for r in out.rows})[:3]
        out.reason, out.detail = Reason.REQUESTS_FAILED, f"no request succeeded: {'; '.join(errors)}"
    return out

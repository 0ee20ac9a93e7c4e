"""Open-loop load: when each request of an open-loop cell is due, and sending them on that schedule.

A schedule depends only on the cell (rate, arrival, requests, seed) and the repetition, never on the config: the
baseline and every method of a phase meet the same arrivals, so their figures pair request for request.
- `poisson`: a Poisson process (as vLLM's `bench serve --request-rate` and GuideLLM's `poisson` rate type send)
  conditioned on the cell's count: exponential gaps, scaled so that the n requests span (n - 1)/rate. Given how
  many arrivals fall in a span, a Poisson process places them uniformly at random in it, so these are its arrivals;
  a cell of a few requests then runs at the rate it names (unconditioned, 8 arrivals at 16 req/s drawn here ran
  at 19 to 44 req/s), keeping the bursts and lulls of random arrivals;
- `constant`: one request every 1/rate seconds (GuideLLM's `constant`);
- rate "inf": every request due at 0 (vLLM's `--request-rate inf`, GuideLLM's `throughput`).
"""
from __future__ import annotations

import math
import random
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Mapping, Tuple

from .records import INF

MAX_THREADS = 1024  # requests in flight at once from one open-loop cell; past it sends wait (and show as late)


def schedule(cell: Mapping[str, Any], rep: int) -> List[float]:
    """Seconds after the cell's start at which each of its `requests` is due, for repetition `rep`."""
    n, rate = cell["requests"], cell["request_rate"]
    if rate == INF:
        return [0.0] * n
    rate = float(rate)
    if cell.get("arrival", "poisson") == "constant":
        return [i / rate for i in range(n)]
    # a string seed: the same draws on every Python (random seeds str by its SHA-512)
    rng = random.Random(f"specfleet:{cell.get('seed', 0)}:{rate!r}:{n}:{rep}")
    gaps = [rng.expovariate(rate) for _ in range(n - 1)]
    scale = (n - 1) / rate / sum(gaps) if gaps else 0.0
    out, t = [0.0], 0.0
    for g in gaps:
        t += g * scale
        out.append(t)
    return out


def send(offsets: List[float], one: Callable[[int, float], Dict[str, Any]],
         clock: Callable[[], float] = time.perf_counter) -> Tuple[List[Dict[str, Any]], float]:
    """Call `one(i, due)` for each offset at `due` = start + offset (on `clock`), each in its own thread, without
    waiting for earlier ones to finish; the results in schedule order, and the seconds from the start to the
    last one's end. What is timed is each call's own send, not this loop: a call sent late says so."""
    start = clock()
    futures: List[Future[Dict[str, Any]]] = []
    with ThreadPoolExecutor(max_workers=max(1, min(len(offsets), MAX_THREADS))) as pool:
        for i, offset in enumerate(offsets):
            due = start + offset
            wait = due - clock()
            if wait > 0:
                time.sleep(wait)  # the schedule itself: the next request is not due yet
            futures.append(pool.submit(one, i, due))
        rows = [f.result() for f in futures]
    return rows, clock() - start


def achieved_rate(sent: List[float]) -> float | None:
    """Requests per second the client actually sent at: (n - 1) over the first to the last send; None below two
    sends, or when they all left at once (inf)."""
    if len(sent) < 2:
        return None
    span = max(sent) - min(sent)
    return (len(sent) - 1) / span if span > 0 else math.inf

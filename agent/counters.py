"""The server's own counters around the timed requests, checked against the request rows.

Read right after the warmup and right after the last timed request (Prometheus text on the engine's metrics
path); the difference is what the server says the timed requests were. Six checks:
- generation tokens: the rows' `completion_tokens` (each from the server's usage) sum to the counter's delta exactly;
- requests: as many finished requests as rows;
- verify steps (speculative configs, where the engine counts them: SGLang from 0.5.15, vLLM as its drafts, one a
  verify step): the rows' verify steps (each from the request's own report) sum to the counter's delta exactly;
- accepted tokens (speculative configs, where the engine counts them: vLLM, llama.cpp): the rows' accepted drafts
  sum to the counter's delta exactly; and drafted tokens (llama.cpp) the same way;
- acceptance length (speculative configs, where the engine counts drafts): 1 + accepted / drafts over the window
  against the rows' 1 + Σ accepted / Σ verify steps. Each request is weighted by its verify steps because that is
  how the counter aggregates (one draft per verify step); a plain mean of the per-request means would weight a
  short request like a long one and differ from the server's figure by design. Must agree within 1%.
Where the rows' verify steps were read from this very counter (llama.cpp, `steps_of_burst`) the verify-step and
acceptance-length checks are left out: they could not fail; its answers' own drafted and accepted tokens are checked.
A disagreement makes the config `suspect`: its figures are kept and every report shows the two numbers.
"""
from __future__ import annotations

import http.client
import math
import re
from typing import Any, Dict, List, Mapping, Optional

from .engines import Engine

SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
ACCEPT_TOLERANCE = 0.01


ROUNDED = re.compile(r"^[+-]?\d(?:\.(\d*))?[eE]([+-]?\d+)$")
BLUR = "~"  # `<key>~`: how far a reading's printed figure may lie from the counter (half its last printed digit)


def blur(text: str) -> float:
    """How far a printed counter may lie from its value: llama.cpp prints its counters as C++ streams print a
    double, six significant digits (`1.23457e+06`), so from a million on they are rounded; 0 for a figure printed
    whole."""
    m = ROUNDED.match(text)
    if not m:
        return 0.0
    return 0.5 * 10.0 ** (int(m.group(2)) - len(m.group(1) or ""))


def parse(text: str, names: Mapping[str, str]) -> Dict[str, float]:
    """{key: value summed over every label set} for the metric names asked (Prometheus text format), and for a
    figure printed rounded, `<key>~` its rounding (`blur`)."""
    wanted = {v: k for k, v in names.items()}
    out: Dict[str, float] = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if not m or m.group(1) not in wanted:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if math.isfinite(value):
            key = wanted[m.group(1)]
            out[key] = out.get(key, 0.0) + value
            if blur(m.group(3)):
                out[key + BLUR] = out.get(key + BLUR, 0.0) + blur(m.group(3))
    return out


def read(engine: Engine, port: int, host: str = "127.0.0.1", headers: Optional[Dict[str, str]] = None,
         timeout: float = 30.0) -> Optional[Dict[str, float]]:
    """The engine's counters now; None when it serves none (no metrics path, or metrics not enabled)."""
    if not engine.metrics_path or not engine.counters:
        return None
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", engine.metrics_path, headers=headers or {})
        resp = conn.getresponse()
        body = resp.read().decode("utf-8", errors="replace")
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()
    if resp.status != 200:
        return None
    found = parse(body, engine.counters)
    return found if "generation_tokens" in found else None


def steps_of_burst(engine: Engine, port: int, host: str, headers: Optional[Dict[str, str]],
                   last: Mapping[str, float], rows: List[Dict[str, Any]]) -> Optional[Dict[str, float]]:
    """For an engine whose answers lack their verify steps (`Engine.steps_from_counters`): the server's drafts
    counter read after a burst, which had the server to itself (every request of it finished, none of another
    sent), less its reading before it. A burst of one request gets them as its `spec_steps` and its acceptance
    length (`accept_scope: request`); a larger one gives each row the burst's length, `spec_steps` left null
    (`accept_scope: burst`). The reading is returned for the next burst; None (nothing more read) when the server
    serves no counters."""
    now = read(engine, port, host, headers)
    if now is None:
        return None
    steps, accepted = _delta(last, now, "drafts"), _delta(last, now, "accepted_tokens")
    rounded = any(k + BLUR in m for k in ("drafts", "accepted_tokens") for m in (last, now))
    if steps is None or accepted is None or not rows or not all(r.get("ok") for r in rows) or rounded or steps < 1:
        return now  # (a counter printed rounded cannot give a burst's steps exactly: none are claimed)
    steps_i, accepted_i = int(round(steps)), int(round(accepted))
    length = 1 + accepted_i / steps_i
    for r in rows:
        r["accept_length"] = length
        r["accept_scope"] = "request" if len(rows) == 1 else "burst"
        if len(rows) == 1:
            r["spec_steps"] = steps_i
    return now


def _delta(before: Mapping[str, float], after: Mapping[str, float], key: str) -> Optional[float]:
    return after[key] - before[key] if key in before and key in after else None


def _same(before: Mapping[str, float], after: Mapping[str, float], key: str, server: float, rows: float) -> bool:
    """The server's difference equals the rows' figure, exactly, or within the two readings' rounding."""
    return abs(server - rows) <= before.get(key + BLUR, 0.0) + after.get(key + BLUR, 0.0)


def check(before: Optional[Mapping[str, float]], after: Optional[Mapping[str, float]],
          rows: List[Mapping[str, Any]], speculative: bool) -> Dict[str, Any]:
    """The status.json `counters` field: each check with the server's and the rows' figure, and the verdict
    (`ok`, `suspect`, or `unchecked` with why)."""
    if before is None or after is None:
        return {"verdict": "unchecked", "why": "the server exposes no counters (engine metrics off or absent)"}
    checks: Dict[str, Dict[str, Any]] = {}
    gen = _delta(before, after, "generation_tokens")
    tokens = sum(int(r.get("completion_tokens") or 0) for r in rows)
    if gen is not None:
        checks["generation_tokens"] = {"server": int(round(gen)), "rows": tokens,
                                       "ok": _same(before, after, "generation_tokens", gen, tokens)}
    done = _delta(before, after, "requests")
    if done is not None:
        checks["requests"] = {"server": int(round(done)), "rows": len(rows), "ok": int(round(done)) == len(rows)}
    drafts, accepted = _delta(before, after, "drafts"), _delta(before, after, "accepted_tokens")
    steps = [r.get("spec_steps") for r in rows if r.get("ok")]
    verify = _delta(before, after, "verify_steps")  # SGLang 0.5.15 on: the verify steps of finished requests
    if verify is None:
        verify = drafts  # vLLM: one draft per verify step (`num_spec_steps` per request)
    counted = speculative and bool(steps) and all(isinstance(s, int) for s in steps)
    own = any(r.get("accept_scope") for r in rows)  # steps taken from this very counter: nothing to check them by
    if counted and verify is not None and not own:
        total = sum(int(r.get("spec_steps") or 0) for r in rows)
        checks["verify_steps"] = {"server": int(round(verify)), "rows": total, "ok": int(round(verify)) == total}
    drafted_each = [r.get("spec_draft_tokens") for r in rows if r.get("ok")]
    drafted = _delta(before, after, "draft_tokens")
    if speculative and drafted is not None and drafted_each and all(isinstance(t, int) for t in drafted_each):
        total = sum(drafted_each)  # type: ignore[arg-type]
        checks["draft_tokens"] = {"server": int(round(drafted)), "rows": total,
                                  "ok": _same(before, after, "draft_tokens", drafted, total)}
    took_each = [r.get("spec_accepted_tokens") for r in rows if r.get("ok")]
    if speculative and accepted is not None and took_each and all(isinstance(t, int) for t in took_each):
        # exactly, request by request summed (llama.cpp's answers carry them without their verify steps)
        took = sum(int(r.get("spec_accepted_tokens") or 0) for r in rows)
        checks["accepted_tokens"] = {"server": int(round(accepted)), "rows": took,
                                     "ok": _same(before, after, "accepted_tokens", accepted, took)}
    if speculative and drafts and accepted is not None and steps and all(isinstance(s, int) for s in steps) and not own:
        total_steps = sum(steps)  # type: ignore[arg-type]
        rows_acc = sum(int(r.get("spec_accepted_tokens") or 0) for r in rows if r.get("ok"))
        server = 1 + accepted / drafts
        mine = 1 + rows_acc / total_steps if total_steps else None
        checks["accept_length"] = {
            "server": round(server, 4), "rows": None if mine is None else round(mine, 4),
            "ok": mine is not None and abs(mine - server) <= ACCEPT_TOLERANCE * server,
            "weighting": "verify steps (1 + Σ accepted / Σ steps)"}
    verdict = "ok" if checks and all(c["ok"] for c in checks.values()) else "suspect"
    out: Dict[str, Any] = {"verdict": verdict, **checks}
    if verdict == "suspect":
        out["why"] = "; ".join(f"{k}: server {c['server']} vs rows {c['rows']}" for k, c in checks.items()
                               if not c["ok"]) or "no counter could be compared"
    return out

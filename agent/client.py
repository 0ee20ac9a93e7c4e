"""Streaming HTTP client: one timed request, measured from the server's own token counts.

The stream is parsed by `Measurement`, which is pure and fed (timestamp, data) pairs, so the
metric math is tested on recorded streams. Tokens always come from the server's usage fields,
never from counting chunks: with speculation one chunk carries several tokens.
"""
from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .engines import Engine


@dataclass
class Measurement:
    """Accumulates one streamed response; `result()` gives the request's metrics."""

    engine: Engine
    t_sent: float
    t_first: float | None = None
    t_last: float | None = None
    chunks: int = 0
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    accept_length: float | None = None
    spec_steps: int | None = None
    spec_accepted: int | None = None
    spec_drafted: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    itl_s: list[float] = field(default_factory=list)
    gaps_s: list[float] = field(default_factory=list)      # between content chunks, whole
    chunk_tokens: list[int] = field(default_factory=list)  # tokens each content chunk carried (after the first)
    _state: dict[str, Any] = field(default_factory=dict)
    _t_prev: float | None = None

    def feed(self, t: float, data: str) -> None:
        """One SSE `data:` payload received at time `t` (perf_counter seconds)."""
        self.t_last = t
        if data.strip() == "[DONE]":
            return
        try:
            obj = json.loads(data)
        except json.JSONDecodeError:
            self.error = f"malformed stream chunk: {data[:200]!r}"
            return
        if not isinstance(obj, dict):
            self.error = f"malformed stream chunk: {data[:200]!r}"
            return
        info = self.engine.parse_chunk(obj, self._state)
        if info.error:
            self.error = info.error
            return
        self.chunks += 1
        if info.has_content:
            if self.t_first is None:
                self.t_first = t
            elif self._t_prev is not None and info.tokens:
                # inter-token latency: the chunk's gap spread over the tokens it carried
                self.itl_s.extend([(t - self._t_prev) / info.tokens] * info.tokens)
                self.gaps_s.append(t - self._t_prev)
                self.chunk_tokens.append(info.tokens)
            self._t_prev = t
        for name in ("completion_tokens", "prompt_tokens", "accept_length", "spec_steps", "spec_accepted",
                     "spec_drafted", "finish_reason"):
            value = getattr(info, name)
            if value is not None:
                setattr(self, name, value)

    def result(self) -> dict[str, Any]:
        """Metrics per the results contract (fields other than the cell's identity)."""
        ok = self.error is None and self.completion_tokens is not None and self.t_last is not None
        err = self.error or (None if ok else "stream ended without usage from the server")
        e2e = (self.t_last - self.t_sent) if self.t_last is not None else None
        ttft = (self.t_first - self.t_sent) if self.t_first is not None else None
        tok = self.completion_tokens
        out_tok_s = tok / e2e if ok and e2e and tok is not None else None
        decode = None
        if ok and tok and tok > 1 and ttft is not None and e2e and e2e > ttft:
            decode = (tok - 1) / (e2e - ttft)
        itl = sorted(self.itl_s)
        return {
            "prompt_tokens": self.prompt_tokens, "completion_tokens": tok,
            "ttft_s": ttft, "e2e_s": e2e, "output_tok_s": out_tok_s, "decode_tok_s": decode,
            "tpot_s": 1 / decode if decode else None,
            "itl_mean_s": sum(itl) / len(itl) if itl else None,
            "itl_p50_s": itl[len(itl) // 2] if itl else None,
            "chunk_gap_mean_s": sum(self.gaps_s) / len(self.gaps_s) if self.gaps_s else None,
            "chunk_gap_p50_s": sorted(self.gaps_s)[len(self.gaps_s) // 2] if self.gaps_s else None,
            "chunk_gap_max_s": max(self.gaps_s) if self.gaps_s else None,
            "chunk_tokens_mean": sum(self.chunk_tokens) / len(self.chunk_tokens) if self.chunk_tokens else None,
            "chunks": self.chunks, "finish_reason": self.finish_reason,
            "accept_length": self.accept_length, "spec_steps": self.spec_steps,
            "spec_accepted_tokens": self.spec_accepted, "ok": ok, "error": err,
            **({} if self.spec_drafted is None else {"spec_draft_tokens": self.spec_drafted}),
            "t_sent": self.t_sent, "t_done": self.t_last,  # clock readings: measure makes them offsets
        }


def post_json(port: int, path: str, body: dict[str, Any], timeout: float, host: str = "127.0.0.1",
              headers: dict[str, str] | None = None) -> Any:
    """A plain (non-streamed) JSON POST; raises on HTTP errors."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"POST {path}: HTTP {resp.status}: {data[:300]!r}")
        return json.loads(data)
    finally:
        conn.close()


def stream(engine: Engine, port: int, body: dict[str, Any], deadline_s: float, host: str = "127.0.0.1",
           headers: dict[str, str] | None = None, clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """Send one streamed request and measure it; never raises for server-side failures."""
    t0 = clock()
    m = Measurement(engine, t_sent=t0)
    end = t0 + deadline_s
    conn = http.client.HTTPConnection(host, port, timeout=min(deadline_s, 60.0))
    try:
        conn.request("POST", engine.generate_path, json.dumps(body),
                     {"Content-Type": "application/json", "Accept": "text/event-stream", **(headers or {})})
        resp = conn.getresponse()
        if resp.status != 200:
            m.error = f"HTTP {resp.status}: {resp.read()[:300].decode(errors='replace')}"
            m.t_last = clock()
            return m.result()
        while True:
            remaining = end - clock()
            if remaining <= 0:
                raise TimeoutError(f"request deadline of {deadline_s:.0f} s passed")
            if conn.sock is not None:
                conn.sock.settimeout(min(remaining, 60.0))
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if line.startswith(b"data:"):
                m.feed(clock(), line[5:].decode("utf-8", errors="replace").strip())
    except (OSError, http.client.HTTPException, TimeoutError) as exc:
        m.error = f"{type(exc).__name__}: {exc}"
        m.t_last = clock()
    finally:
        conn.close()
    return m.result()

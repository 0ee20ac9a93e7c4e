"""How long each config will take: from earlier runs of the same host when there are any, else from the profile.

Evidence is what the controller already holds: `<results>/<run_id>/<host>/<config_id>/` with `config.json`,
`status.json` and `requests.jsonl`. A config's estimate uses the newest ok result of the same engine, model, tp,
method and parameters on that host: its startup (`ready_s`) and its mean decode speed (server-counted tokens
after the first, over the time after the first token). Without one, the profile's `bench_estimate` is used,
its tok/s scaled by √tp (a rough allowance for tensor parallelism; the plan says which source it used).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from agent.records import read_requests
from agent.store import read_json


@dataclass(frozen=True)
class Evidence:
    """What an earlier ok run measured for one kind of config."""

    run_id: str
    ready_s: float
    tok_s: float


def kind(cfg: Mapping[str, Any]) -> tuple[Any, ...]:
    """What makes two configs comparable for timing: engine, model name, tp, method and its parameters."""
    model = cfg.get("model")
    name = model.get("name") if isinstance(model, dict) else model
    return (cfg.get("engine"), name, cfg.get("tp"), cfg.get("method"),
            json.dumps(cfg.get("method_params") or {}, sort_keys=True))


def _decode_tok_s(rows: Iterable[Mapping[str, Any]]) -> Optional[float]:
    speeds = [r["decode_tok_s"] for r in rows if r.get("ok") and isinstance(r.get("decode_tok_s"), (int, float))
              and r["decode_tok_s"] > 0 and r.get("concurrency") == 1]
    return sum(speeds) / len(speeds) if speeds else None


def history(results: Path, host: str) -> dict[tuple[Any, ...], Evidence]:
    """The newest ok measurement per config kind among the controller's runs of `host` (damaged files skipped)."""
    found: dict[tuple[Any, ...], tuple[str, Evidence]] = {}
    if not results.is_dir():
        return {}
    for status_path in results.glob(f"*/{host}/*/status.json"):
        status, config = read_json(status_path), read_json(status_path.parent / "config.json")
        if not isinstance(status, dict) or not isinstance(config, dict) or status.get("status") != "ok":
            continue
        if not isinstance(status.get("ready_s"), (int, float)):
            continue
        tok_s = _decode_tok_s(read_requests(status_path.parent / "requests.jsonl", []))  # damaged lines skipped
        if tok_s is None:
            continue
        when = str(status.get("finished_at") or "")
        run_id = status_path.parents[2].name
        key = kind(config)
        if key not in found or when > found[key][0]:
            found[key] = (when, Evidence(run_id, float(status["ready_s"]), tok_s))
    return {k: v for k, (_, v) in found.items()}


def _burst_s(n: int, max_tokens: int, context_tokens: int, tok_s: float, prefill_tok_s: float) -> float:
    return max_tokens / tok_s * (1 + 0.25 * (n - 1)) + context_tokens * n / prefill_tok_s


def cell_seconds(c: Mapping[str, Any], tok_s: float, prefill_tok_s: float) -> float:
    """One repetition of a cell: a burst of `concurrency` requests (output at tok_s, a little slower per extra
    request in flight; the context at the prefill speed); an open-loop cell's schedule, then its last request
    (all at once, for "inf": a burst of them all)."""
    rate = c.get("request_rate")
    if rate is None:
        return _burst_s(c["concurrency"], c["max_tokens"], c["context_tokens"], tok_s, prefill_tok_s)
    if rate == "inf":
        return _burst_s(c["requests"], c["max_tokens"], c["context_tokens"], tok_s, prefill_tok_s)
    return (c["requests"] - 1) / rate + _burst_s(1, c["max_tokens"], c["context_tokens"], tok_s, prefill_tok_s)


def seconds(cells: Iterable[Mapping[str, Any]], startup_s: float, tok_s: float, prefill_tok_s: float) -> float:
    """A config's time: startup, then each cell's repetitions (`cell_seconds`)."""
    return startup_s + sum(c["repetitions"] * cell_seconds(c, tok_s, prefill_tok_s) for c in cells)


def apply(configs: list[dict[str, Any]], profile: Mapping[str, float],
          evidence: Mapping[tuple[Any, ...], Evidence]) -> None:
    """Set each config's `estimate_s`, `estimate_ready_s` (its startup, within it) and `estimate_source` in
    place."""
    for cfg in configs:
        seen = evidence.get(kind(cfg))
        if seen:
            cfg["estimate_s"] = round(seconds(cfg["cells"], seen.ready_s, seen.tok_s, profile["prefill_tok_s"]), 1)
            cfg["estimate_ready_s"] = round(seen.ready_s, 1)
            cfg["estimate_source"] = (f"measured in run {seen.run_id}: ready {seen.ready_s:.0f} s, "
                                      f"{seen.tok_s:.1f} tok/s")
        else:
            tok_s = profile["tok_s"] * math.sqrt(cfg["tp"])
            cfg["estimate_s"] = round(seconds(cfg["cells"], profile["startup_s"], tok_s, profile["prefill_tok_s"]), 1)
            cfg["estimate_ready_s"] = round(float(profile["startup_s"]), 1)
            cfg["estimate_source"] = f"profile: {profile['tok_s']:g} tok/s × √tp {cfg['tp']}"

"""The time per config: where its seconds went, each figure as its status.json records it (agent/config_run.py), and
specfleet's own overhead, what is left of its wall time once the engine's phases are taken away. A figure the config
did not record is missing (blank in report.md, null in report.json), never worked out from the others."""
from __future__ import annotations

from typing import Any, Mapping, Optional

import pandas as pd

from ..results import Run
from ..views import config_result_order

STARTUP_PHASES = ("weights", "compile", "kv_cache", "graphs")  # status.json `startup`, in the order they happen

# The engine's phases of a config, in the order they happen: status.json's field and what it measures.
PHASES = (
    ("ready_s", "engine startup: from the server's launch until it first answered its health check"),
    ("warmup_s", "the untimed warmup request, the engine's first (first-use compilation lands here)"),
    ("timed_s", "the timed requests"),
    ("stop_s", "the server's stop"),
)
OVERHEAD = "specfleet_overhead_s"
TIMES = (
    *PHASES,
    (OVERHEAD, "specfleet's own overhead: wall_s - (ready_s + warmup_s + timed_s + stop_s): the flag and memory "
     "checks, building the prompts, the counters and samples around the timed requests, reading the server's log "
     "(and a packed config's waits for the configs beside it)"),
    ("wall_s", "the whole config, from its flag and memory checks until its server was stopped"),
)
WHAT = dict(TIMES)  # each time column -> what it measures, the words of report.md and docs/results.md


def _seconds(v: Any) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def overhead(status: Mapping[str, Any]) -> Optional[float]:
    """specfleet's own overhead of a config (WHAT[OVERHEAD]); None when it did not record its wall time or one of
    the phases."""
    wall = _seconds(status.get("wall_s"))
    phases = [_seconds(status.get(k)) for k, _ in PHASES]
    if wall is None or any(p is None for p in phases):
        return None
    return round(wall - sum(p for p in phases if p is not None), 3)  # status.json's seconds have three decimals


def timing(run: Run) -> pd.DataFrame:
    """Per config (per host, in views.config_order): where its log told, the seconds from launch at which its
    weights were loaded, its model compiled, its KV cache allocated and its graphs captured (a column only where
    some config has it); then TIMES."""
    rows = []
    for c in sorted(run.configs, key=lambda c: (c.host, config_result_order(c))):
        st = c.status
        marks = st.get("startup") if isinstance(st.get("startup"), dict) else {}
        rows.append({"host": c.host, "config_id": c.config_id, "status": st.get("reason") or st.get("status"),
                     **{f"{k}_s": marks.get(k) for k in STARTUP_PHASES},
                     **{k: _seconds(st.get(k)) for k, _ in PHASES}, OVERHEAD: overhead(st),
                     "wall_s": _seconds(st.get("wall_s"))})
    found = [f"{k}_s" for k in STARTUP_PHASES if any(r[f"{k}_s"] is not None for r in rows)]
    return pd.DataFrame([{k: v for k, v in r.items() if not k.endswith(tuple(f"{p}_s" for p in STARTUP_PHASES))
                          or k in found} for r in rows],
                        columns=["host", "config_id", "status", *found, *WHAT])

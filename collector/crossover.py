"""Where speculation pays: per host × tp × cell (workload, max_tokens, context) × config, along each load axis the
run swept (closed-loop concurrency, open-loop request rate), the load above which the config's throughput falls
below the baseline's, and, where latency limits are set, its goodput; the highest load within the limits.

- Throughput at a load: a cell's output tok/s over all its requests (`burst_tok_s_mean`; at concurrency 1 the
  requests' own tok/s), so its ratio to the baseline's is `burst_speedup` (`speedup` at concurrency 1) with its
  95% interval; goodput's is `goodput_speedup`.
- The crossover: the first load where the ratio goes from at least 1 to below 1, interpolated linearly in load
  between the two measured loads around it (a failed load is left out and named); its interval, where the
  interval's upper bound and its lower bound cross 1 in the same way (an open end: beyond the loads measured).
- "pays everywhere measured" / "never pays" when the ratio stays on one side of 1.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd

from .tables import row_dicts
from .vocab import CELL, na

GROUP = ["host", "engine", "model", "tp", *CELL[:3]]  # a cell without its load, on its host
COLUMNS = GROUP + ["axis", "config_id", "method", "method_params", "loads", "load_min", "load_max", "best_speedup",
                   "best_at", "pays_at", "crossover", "crossover_low", "crossover_high", "crossover_kind",
                   "crossover_text", "goodput_crossover", "goodput_crossover_low", "goodput_crossover_high",
                   "goodput_crossover_kind", "goodput_crossover_text", "slo", "max_load_within_slo", "not_measured"]
# crossover_kind: crosses (at, with its interval), everywhere (pays at every load measured), never, other (no load
# measured, or it pays only from some load on)
AXES = ("concurrency", "request_rate")


@dataclass(frozen=True)
class Point:
    """One load of a config: its ratio to the baseline with the interval, or the reason it has none."""

    load: float
    ratio: Optional[float] = None
    lo: Optional[float] = None
    hi: Optional[float] = None
    status: str = "ok"


@dataclass(frozen=True)
class Crossing:
    """Where a ratio falls below 1 along the loads: `at` (None when it does not, or not between finite loads),
    its interval [`low`, `high`] (None: beyond the loads measured) and the finding in words."""

    at: Optional[float]
    low: Optional[float]
    high: Optional[float]
    text: str
    kind: str = "crosses"


def load_text(load: float, axis: str) -> str:
    """`c4`, `2.5 req/s`, `all at once`."""
    if axis == "concurrency":
        return f"c{load:g}"
    return "all at once" if math.isinf(load) else f"{load:g} req/s"


def _down(loads: Sequence[float], values: Sequence[float]) -> Optional[tuple[int, Optional[float]]]:
    """The first segment where `values` go from >= 1 to < 1: its index and the load where the line between the two
    points crosses 1 (None when the upper load is infinite)."""
    for i in range(len(values) - 1):
        a, b = values[i], values[i + 1]
        if a >= 1 > b:
            if math.isinf(loads[i + 1]):
                return i, None
            return i, loads[i] + (a - 1) / (a - b) * (loads[i + 1] - loads[i])
    return None


def crossing(points: Sequence[Point], axis: str) -> Crossing:
    """The crossover of the points with a ratio (in load order), per the module's rule."""
    got = [p for p in sorted(points, key=lambda p: p.load) if p.ratio is not None]
    if not got:
        return Crossing(None, None, None, "no load measured", "other")
    loads = [p.load for p in got]
    ratio = [float(p.ratio) for p in got]  # type: ignore[arg-type]
    if all(r >= 1 for r in ratio):
        return Crossing(None, None, None, "pays everywhere measured", "everywhere")
    if all(r < 1 for r in ratio):
        return Crossing(None, None, None, "never pays", "never")
    found = _down(loads, ratio)
    if found is None:  # below 1 first, then above: it pays only from some load on
        first = next(p.load for p in got if p.ratio is not None and p.ratio >= 1)
        return Crossing(None, None, None, f"pays from {load_text(first, axis)} on, not below", "other")
    i, at = found
    if at is None:
        return Crossing(None, loads[i], math.inf,
                        f"above {load_text(loads[i], axis)}, below all at once (not interpolated)")
    lows = [p.lo if p.lo is not None else p.ratio for p in got]
    highs = [p.hi if p.hi is not None else p.ratio for p in got]
    lo_cross = _down(loads, lows)  # the lower bound falls below 1 first
    low = loads[0] if lo_cross is None else lo_cross[1]
    hi_cross = _down(loads[i:], highs[i:])
    high = None if hi_cross is None else hi_cross[1]
    text = f"{_load_number(at)} ({'≤ ' if lo_cross is None else ''}{_load_number(low)} to " \
           f"{'beyond ' + load_text(loads[-1], axis) if high is None else _load_number(high)})"
    again = [p.load for p in got[i + 1:] if p.ratio is not None and p.ratio >= 1]
    if again:
        text += f"; pays again at {', '.join(load_text(x, axis) for x in again)}"
    return Crossing(at, low, high, text)


def _load_number(x: Optional[float]) -> str:
    """A load the ratio crosses 1 at, to three significant digits; `?` when it is not known."""
    return "?" if x is None else ("inf" if math.isinf(x) else f"{x:.3g}")


def _points(rows: list[dict[str, Any]], axis: str, key: str) -> list[Point]:
    """One Point per row: the throughput ratio (`key` "burst"), or goodput's."""
    out = []
    for r in rows:
        load = float(r[axis])
        if key == "goodput":
            ratio, lo, hi = r["goodput_speedup"], r["goodput_speedup_ci_low"], r["goodput_speedup_ci_high"]
        elif axis == "concurrency" and r["concurrency"] == 1:
            ratio, lo, hi = r["speedup"], r["speedup_ci_low"], r["speedup_ci_high"]
        else:
            ratio, lo, hi = r["burst_speedup"], r["burst_speedup_ci_low"], r["burst_speedup_ci_high"]
        ratio, lo, hi = (None if v is None or pd.isna(v) else float(v) for v in (ratio, lo, hi))
        status = str(r["status"])
        if status == "ok" and (ratio is None or not r["n"]):  # a load whose every request failed is left out too
            status = "no ok request" if not r["n"] else "no baseline"
        out.append(Point(load, ratio if status == "ok" else None, lo, hi, status))
    return out


def table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per host × tp × cell × config × axis with two loads or more (the table's rows, `tables.table`)."""
    rows: list[dict[str, Any]] = []
    if df.empty:
        return pd.DataFrame(rows, columns=COLUMNS)
    recs = row_dicts(df)
    for axis in AXES:
        groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for r in recs:
            open_loop = not na(r["request_rate"])
            if open_loop != (axis == "request_rate") or na(r["config_id"]) or na(r[axis]):
                continue
            groups.setdefault((*(r[k] for k in GROUP), r["config_id"]), []).append(r)
        for (*group, cid), members in groups.items():
            members.sort(key=lambda r: float(r[axis]))
            if len(members) < 2:
                continue
            rows.append(_row(dict(zip(GROUP, group)), cid, members, axis))
    return pd.DataFrame(rows, columns=COLUMNS)


def _row(group: dict[str, Any], cid: str, members: list[dict[str, Any]], axis: str) -> dict[str, Any]:
    first = members[0]
    spec = first["method"] != "autoregressive"
    points = _points(members, axis, "burst")
    measured = [p for p in points if p.ratio is not None]
    best = max(measured, key=lambda p: p.ratio or 0, default=None) if spec else None
    row: dict[str, Any] = {**group, "axis": axis, "config_id": cid, "method": first["method"],
                           "method_params": first["method_params"],
                           "loads": ", ".join(load_text(p.load, axis) for p in points),
                           "load_min": min((p.load for p in measured), default=None),
                           "load_max": max((p.load for p in measured), default=None),
                           "best_speedup": best.ratio if best else None,
                           "best_at": load_text(best.load, axis) if best else None,
                           "pays_at": _runs(measured, axis) if spec else None,
                           "not_measured": "; ".join(f"{load_text(p.load, axis)}: {p.status}" for p in points
                                                     if p.status != "ok") or None}
    for prefix, key in (("", "burst"), ("goodput_", "goodput")):
        c = crossing(_points(members, axis, key), axis) if spec else None
        if key == "goodput" and not any(r["slo"] for r in members if isinstance(r["slo"], str)):
            c = None
        row[f"{prefix}crossover"] = c.at if c else None
        row[f"{prefix}crossover_low"] = c.low if c else None
        row[f"{prefix}crossover_high"] = c.high if c else None
        row[f"{prefix}crossover_text"] = c.text if c else None
        row[f"{prefix}crossover_kind"] = c.kind if c else None
    slos = [r["slo"] for r in members if isinstance(r["slo"], str) and r["slo"]]
    row["slo"] = slos[0] if slos else None
    within = [float(r[axis]) for r in members if isinstance(r["within_slo"], (bool, np.bool_)) and r["within_slo"]]
    row["max_load_within_slo"] = (load_text(max(within), axis) if within else "none") if slos else None
    return row


def _runs(measured: list[Point], axis: str) -> str:
    """The measured loads where the ratio is above 1, as runs of neighbours: `c1–c2`, `c1, c8`, `nowhere`."""
    runs: list[list[float]] = []
    previous_paid = False
    for p in measured:
        paid = (p.ratio or 0) > 1
        if paid and previous_paid:
            runs[-1].append(p.load)
        elif paid:
            runs.append([p.load])
        previous_paid = paid
    if not runs:
        return "nowhere measured"
    return ", ".join(load_text(r[0], axis) if len(r) == 1 else f"{load_text(r[0], axis)}–{load_text(r[-1], axis)}"
                     for r in runs)


def slo_text(slo: Optional[str]) -> str:
    """`ttft ≤ 2000 ms, tpot ≤ 100 ms (90% of requests)`."""
    if not slo:
        return ""
    limits = json.loads(slo)
    parts = [f"{k[:-3]} ≤ {v:g} ms" for k, v in limits.items() if k.endswith("_ms")]
    return f"{', '.join(parts)} ({limits.get('attainment', 0.9) * 100:g}% of requests)"


def bounds(row: dict[str, Any], prefix: str = "") -> Optional[tuple[float, float, float]]:
    """A config's crossover as (estimate, low, high) for comparing runs: one that crosses as measured (an open
    end: beyond the loads measured); one that pays everywhere measured as above its highest load; one that never
    pays as at or below its lowest. None when there is nothing to compare (no load measured, the baseline)."""
    kind = row.get(f"{prefix}crossover_kind")
    lo_load, hi_load = row.get("load_min"), row.get("load_max")
    if kind == "crosses":
        at = row[f"{prefix}crossover"]
        low, high = row[f"{prefix}crossover_low"], row[f"{prefix}crossover_high"]
        at = low if na(at) else at  # between a finite load and "all at once": its finite side
        return (float(at), float(lo_load if na(low) else low), math.inf if na(high) else float(high))
    if kind == "everywhere" and not na(hi_load):
        return (float(hi_load), float(hi_load), math.inf)
    if kind == "never" and not na(lo_load):
        return (float(lo_load), 0.0, float(lo_load))
    return None


def moved(a: Optional[tuple[float, float, float]], b: Optional[tuple[float, float, float]]) -> str:
    """How B's crossover stands to A's: `down` (regressed) when B's interval lies wholly below A's, `up` when
    wholly above, `same` when they overlap, `` when either has none."""
    if a is None or b is None:
        return ""
    if b[2] < a[1]:
        return "down"
    if b[1] > a[2]:
        return "up"
    return "same"

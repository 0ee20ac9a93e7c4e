"""The report's plots, drawn without a display (matplotlib's Agg) from the speedup table (tables.speedup.table) and, for
the latency distributions, the request lines: one PNG and one SVG per figure, per host and tp.

A failed or skipped config (or a value that cannot be had, such as a speedup without its baseline) is drawn as
a marked gap: an `x` at the foot of the axes with the reason beside it, never as a value. A figure without a
single value is not written."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from agent.records import cell_key

from .. import crossover
from ..results import Run
from ..tables import row_dicts
from ..tables.ddtree_vs_dflash import DDTREE, DFLASH, scheduling
from ..views import budget, budget_key, method_label
from ..vocab import CELL, cell_words, load_words, na, number
from . import drawing, trend
from .drawing import MAX_WIDTH_IN, NAN, Colors, figure, gap, legend


@dataclass
class Point:
    """One value of a series at `x`; `gap` says why there is none (y is NaN then)."""

    x: float
    y: float
    lo: float = NAN
    hi: float = NAN
    gap: str = ""
    config_id: str = ""


@dataclass
class Series:
    label: str
    points: list[Point]


@dataclass
class Panel:
    """One axes: its series, and its references: a value each (one Point, its x unused) drawn across the axes."""

    title: str
    series: list[Series]
    refs: list[Series] = field(default_factory=list)


def _known(v: float) -> bool:
    return not math.isnan(v)


def _point(r: dict[str, Any], x: float, value: str, missing: str, interval: bool) -> Point:
    """The row's `value` at x, with the speedup's interval where `interval`; a gap with the config's status when
    it did not end ok, else `missing` when the value is empty."""
    y = number(r[value])
    lo, hi = (number(r["speedup_ci_low"]), number(r["speedup_ci_high"])) if interval else (NAN, NAN)
    why = "" if _known(y) else (missing if r["status"] == "ok" else str(r["status"]))
    return Point(x, y, lo, hi, why, str(r["config_id"]))


def _order(r: dict[str, Any]) -> tuple[Any, ...]:
    """Configs in the order every figure lists them: the baseline, then by method and budget (by number)."""
    return budget_key(r["method"], r["method_params"]), str(r["config_id"])


def _configs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each config's first row, in _order."""
    first: dict[str, dict[str, Any]] = {}
    for r in rows:
        first.setdefault(str(r["config_id"]), r)
    return sorted(first.values(), key=_order)


def _cells(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    out: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(cell_key(r), []).append(r)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Drawing
# ---------------------------------------------------------------------------------------------------------------

def _draw_series(ax: Axes, s: Series, color: Any, gid: str) -> None:
    pts = sorted(s.points, key=lambda p: p.x)
    x = np.array([p.x for p in pts])
    y = np.array([p.y for p in pts])
    lo, hi = np.array([p.lo for p in pts]), np.array([p.hi for p in pts])
    err = np.nan_to_num(np.vstack([y - lo, hi - y])) if np.isfinite(lo).any() else None
    ax.errorbar(x, y, yerr=err, marker="o", markersize=4, capsize=3, color=color, label=s.label)
    for p in pts:
        if p.gap:
            gap(ax, p.x, p.gap, color, f"{gid}-gap-{p.config_id}-at-{p.x:g}")


def _draw_ref(ax: Axes, ref: Series, color: Any, gid: str) -> None:
    """A reference value across the axes (with its interval as a band), or, without one, a marked legend entry
    with the reason."""
    p = ref.points[0]
    if p.gap:
        ax.plot([], [], marker="x", linestyle="none", color=color, label=f"{ref.label}: {p.gap}",
                gid=f"{gid}-gap-{p.config_id}")
        return
    ax.axhline(p.y, color=color, linestyle="--", linewidth=1.2, label=ref.label)
    if _known(p.lo) and _known(p.hi):
        ax.axhspan(p.lo, p.hi, color=color, alpha=0.12, linewidth=0)


def _has_value(panels: list[Panel]) -> bool:
    return any(_known(p.y) for panel in panels for s in panel.series for p in s.points)


def _line_figure(panels: list[Panel], title: str, xlabel: str, ylabel: str, *, log2_x: bool = False,
                 baseline: bool = False) -> Optional[Figure]:
    """Small multiples, one panel each; None when no series holds a value."""
    if not panels or not _has_value(panels):
        return None
    fig, axes = figure(len(panels), title)
    colors = Colors()
    for k, (ax, panel) in enumerate(zip(axes, panels)):
        if baseline:
            ax.axhline(1.0, color="0.5", linewidth=0.8, label="baseline (1.0)")
        for s in panel.series:
            _draw_series(ax, s, colors(s.label), f"p{k}")
        for ref in panel.refs:
            _draw_ref(ax, ref, colors(ref.label), f"p{k}")
        xs = sorted({p.x for s in panel.series for p in s.points})
        if log2_x:
            ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.minorticks_off()
        ax.set_title(panel.title, fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    legend(fig, axes)
    return fig


# ---------------------------------------------------------------------------------------------------------------
# The figures of one host and tp
# ---------------------------------------------------------------------------------------------------------------

def _dflash_label(r: dict[str, Any], paths: dict[str, Optional[str]]) -> str:
    path = paths.get(str(r["config_id"]))
    label = method_label(r)
    return f"{label} ({path.replace('_', ' ')})" if path and path.replace("_", " ") not in label else label


def _budget_panels(rows: list[dict[str, Any]], value: str, missing: str, interval: bool,
                   paths: dict[str, Optional[str]]) -> list[Panel]:
    """Per cell holding DDTree configs: `value` against the budget, each DFlash config as a reference."""
    panels = []
    for group in _cells(rows).values():
        trees = [(b, r) for r in group if r["method"] == DDTREE
                 for b in [budget(r["method_params"])] if b is not None]
        if not trees:
            continue
        points = [_point(r, float(b), value, missing, interval) for b, r in trees]
        refs = [Series(_dflash_label(r, paths), [_point(r, 0.0, value, missing, interval)])
                for r in sorted((r for r in group if r["method"] == DFLASH), key=_order)]
        panels.append(Panel(cell_words(group[0]), [Series("DDTree", points)], refs))
    return panels


def _sweep_panels(rows: list[dict[str, Any]], axis: str) -> list[Panel]:
    """Per group of cells that differ only in `axis` and take more than one value of it: each speculative
    config's speedup against it (configs measured at one value of it only are left out)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in CELL if k != axis), []).append(r)
    panels = []
    for group in groups.values():
        if len({r[axis] for r in group}) < 2:
            continue
        series = []
        for first in _configs([r for r in group if r["method"] != "autoregressive"]):
            mine = [r for r in group if r["config_id"] == first["config_id"]]
            if len({r[axis] for r in mine}) > 1:
                series.append(Series(method_label(first), [_point(r, float(r[axis]), "speedup", "no baseline", True)
                                                            for r in mine]))
        if series:
            panels.append(Panel(cell_words(group[0], leave_out=axis), series))
    return panels


def _bar_figure(rows: list[dict[str, Any]], title: str) -> Optional[Figure]:
    """tok/s (mean ± sample std) per config, grouped by cell."""
    cells = list(_cells(rows).items())
    configs = _configs(rows)
    if not any(_known(number(r["tok_s_mean"])) for r in rows):
        return None
    width = 0.8 / len(configs)
    fig, (ax,) = figure(1, title, width=min(max(6.0, 0.3 * len(cells) * len(configs) + 2), MAX_WIDTH_IN - 2.4),
                         height=4.2)
    colors = Colors()
    for j, first in enumerate(configs):
        cid, label = first["config_id"], method_label(first)
        color = colors(label)
        xs, ys, errs = [], [], []
        for i, (_, group) in enumerate(cells):
            r = next((r for r in group if r["config_id"] == cid), None)
            if r is None:
                continue
            x = i - 0.4 + width * (j + 0.5)
            p = _point(r, x, "tok_s_mean", "no data", False)
            if p.gap:
                gap(ax, x, p.gap, color, f"p0-gap-{cid}-cell{i}")
            else:
                xs.append(x)
                ys.append(p.y)
                errs.append(np.nan_to_num(number(r["tok_s_std"])))
        if xs:
            ax.bar(xs, ys, width=width, yerr=errs, capsize=2, color=color, label=label)
        else:  # only gaps: the legend shows its marker
            ax.plot([], [], marker="x", markeredgewidth=2, linestyle="none", color=color, label=label)
    ax.set_xticks(range(len(cells)), [cell_words(group[0]) for _, group in cells], rotation=20, ha="right")
    ax.set_ylabel("output tok/s per request (mean ± std)")
    ax.grid(True, axis="y", alpha=0.3)
    legend(fig, [ax])
    return fig


def _latencies(run: Run, host: str, configs: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """config_id -> ttft_s and tpot_s of its ok request lines."""
    by_id = {c.config_id: c for c in run.configs if c.host == host}
    out: dict[str, dict[str, list[float]]] = {}
    for first in configs:
        c = by_id.get(str(first["config_id"]))
        got: dict[str, list[float]] = {"ttft_s": [], "tpot_s": []}
        for line in c.requests if c is not None and c.status.get("status") == "ok" else []:
            if line.get("ok"):
                for name, values in got.items():
                    v = line.get(name)
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        values.append(float(v))
        out[str(first["config_id"])] = got
    return out


def _box_figure(configs: list[dict[str, Any]], values: dict[str, list[float]], title: str,
                ylabel: str) -> Optional[Figure]:
    """One box per config, over its requests of every cell."""
    if not any(values.values()):
        return None
    fig, (ax,) = figure(1, title, width=max(6.0, 0.7 * len(configs) + 1), height=4.2)
    colors = Colors()
    shown = [(i, str(r["config_id"])) for i, r in enumerate(configs) if values[str(r["config_id"])]]
    parts = ax.boxplot([values[cid] for _, cid in shown], positions=[i for i, _ in shown], widths=0.6)
    for median, (_, cid) in zip(parts["medians"], shown):
        median.set_gid(f"median-{cid}")
    for i, r in enumerate(configs):
        if not values[str(r["config_id"])]:
            label = method_label(r)
            gap(ax, i, str(r["status"]) if r["status"] != "ok" else "no data", colors(label),
                 f"p0-gap-{r['config_id']}")
    ax.set_xticks(range(len(configs)), [method_label(r) for r in configs], rotation=20, ha="right")
    ax.set_ylabel(ylabel)
    ax.grid(True, axis="y", alpha=0.3)
    return fig


def _throughput(r: dict[str, Any]) -> float:
    """A load's throughput: output tok/s over all its requests (the requests' own at concurrency 1)."""
    one = na(r["request_rate"]) and r["concurrency"] == 1
    return number(r["tok_s_mean"] if one else r["burst_tok_s_mean"])


def _pareto_figure(rows: list[dict[str, Any]], title: str) -> Optional[Figure]:
    """Per cell swept over loads (crossover.table): throughput against p90 e2e latency for every config across the
    loads, each point labelled with its load; each crossover marked (a star between the two loads around it,
    where the line between them is at the interpolated load)."""
    pays = crossover.table(pd.DataFrame(rows))
    if pays.empty:
        return None
    groups = list(pays.groupby([*crossover.GROUP, "axis"], sort=False, dropna=False))
    fig, axes = figure(len(groups), title, width=5.2, height=3.8)
    colors = Colors()
    drawn = False
    for k, (ax, (key, group)) in enumerate(zip(axes, groups)):
        axis = key[-1]
        cell = dict(zip(crossover.GROUP, key))
        for first in sorted(row_dicts(group), key=_order):
            mine = sorted((r for r in rows if r["config_id"] == first["config_id"]
                           and all(r[g] == cell[g] for g in CELL[:3])
                           and (not na(r["request_rate"])) == (axis == "request_rate")),
                          key=lambda r: float(r[axis]))
            pts = [(r, number(r["e2e_p90_s"]), _throughput(r)) for r in mine]
            pts = [(r, x, y) for r, x, y in pts if _known(x) and _known(y)]
            if not pts:
                continue
            label = method_label(first)
            color = colors(label)
            ax.plot([x for _, x, _ in pts], [y for _, _, y in pts], marker="o", markersize=4, color=color,
                    label=label, gid=f"p{k}-{first['config_id']}")
            drawn = True
            for r, x, y in pts:
                ax.annotate(load_words({**r, "concurrency": r["concurrency"] if axis == "concurrency" else None})
                            or "c1", (x, y), xytext=(3, 3), textcoords="offset points", fontsize=6, color=color)
            at = first["crossover"]
            if not na(at):
                loads = [float(r[axis]) for r, _, _ in pts]
                xs, ys = [x for _, x, _ in pts], [y for _, _, y in pts]
                cx, cy = float(np.interp(at, loads, xs)), float(np.interp(at, loads, ys))
                ax.plot([cx], [cy], marker="*", markersize=12, color=color, linestyle="none",
                        markeredgecolor="black", gid=f"p{k}-crossover-{first['config_id']}",
                        label=f"crossover ({label})")
        ax.set_title(f"{cell_words(cell, leave_out='concurrency')}: over {axis.replace('_', ' ')}",
                     fontsize=9)
        ax.set_xlabel("p90 e2e latency (s)")
        ax.set_ylabel("output tok/s, all requests")
        ax.grid(True, alpha=0.3)
    if not drawn:
        return None
    legend(fig, axes)
    return fig


def _host_figures(run: Run, host: str, tp: int, rows: list[dict[str, Any]]) -> Iterator[tuple[str, Figure]]:
    """The figures of one host and tp (`rows`: their rows of the table) that have data, named."""
    name, where = f"{_safe(host)}-tp{tp}", f"{host} tp{tp}"
    paths = {c.config_id: scheduling(c, run.hosts.get(host)) for c in run.configs if c.host == host}
    speedup = "speedup over autoregressive"
    made = [
        ("speedup-vs-budget", _line_figure(
            _budget_panels(rows, "speedup", "no baseline", True, paths),
            f"{where}: speedup vs DDTree budget (95% interval); DFlash as reference", "DDTree budget", speedup,
            log2_x=True, baseline=True)),
        ("tok-s", _bar_figure(rows, f"{where}: output tok/s per method and workload")),
        ("accept-length-vs-budget", _line_figure(
            _budget_panels(rows, "accept_length_mean", "not reported", False, paths),
            f"{where}: mean acceptance length vs DDTree budget; DFlash as reference", "DDTree budget",
            "accepted tokens per verify step", log2_x=True)),
        ("speedup-vs-context", _line_figure(
            _sweep_panels(rows, "context_tokens"), f"{where}: speedup vs context length (95% interval)",
            "context tokens", speedup, baseline=True)),
        ("speedup-vs-concurrency", _line_figure(
            _sweep_panels(rows, "concurrency"), f"{where}: per-request speedup vs concurrency (95% interval)",
            "requests in flight", speedup, log2_x=True, baseline=True)),
    ]
    made.append(("throughput-vs-latency", _pareto_figure(
        rows, f"{where}: throughput against p90 latency across loads; ★ where speculation stops paying")))
    configs = _configs(rows)
    lat = _latencies(run, host, configs)
    for field_, kind, what in (("ttft_s", "ttft", "time to first token (s)"),
                               ("tpot_s", "tpot", "time per output token after the first (s)")):
        made.append((kind, _box_figure(configs, {cid: v[field_] for cid, v in lat.items()},
                                       f"{where}: {what}, per request, every cell", what)))
    yield from ((f"{kind}-{name}", fig) for kind, fig in made if fig is not None)


def figures(run: Run, df: pd.DataFrame) -> Iterator[tuple[str, Figure]]:
    """(file name without suffix, figure) for every plot that has data, per host and tp in the table's order."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in df.to_dict("records"):
        if not pd.isna(r["host"]) and not pd.isna(r["tp"]):
            groups.setdefault((str(r["host"]), int(r["tp"])), []).append(r)
    for (host, tp), rows in groups.items():
        yield from _host_figures(run, host, tp, rows)


def _all_figures(run: Run, df: pd.DataFrame, history: list[dict[str, Any]]) -> Iterator[tuple[str, Figure]]:
    yield from figures(run, df)
    if history:
        yield from trend.figures(history)


def _safe(name: str) -> str:
    """A host name as a file name part."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def write(run: Run, df: pd.DataFrame, out: Path, history: Optional[list[dict[str, Any]]] = None) -> list[Path]:
    """Every plot of the run as PNG and SVG into `out`, and with `history` (collector.history.for_run) its trend
    plots; the files written, in order (drawing.write: those of an earlier report that this one no longer has are
    removed, and a PNG or SVG in `out` without specfleet's mark is refused before anything is drawn)."""
    return drawing.write(_all_figures(run, df, history or []), out)

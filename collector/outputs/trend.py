"""The trend plots of a run that has history (collector.history.for_run): per host and tp, a panel per config, its
cells' tok/s over the runs (95% intervals), a ring on a run outside the spread of the previous runs, and a dashed
line before each run whose host environment or config changed, labelled with the change."""
from __future__ import annotations

import re
from typing import Any, Iterator

import numpy as np
from matplotlib.figure import Figure

from ..history import config_changes, environment_changes
from ..views import budget_key
from ..vocab import cell_words, number
from .drawing import Colors, figure, gap, legend

MAX_CELLS = 6  # cells drawn per config: those with the most runs; `specfleet history` lists every one
LABEL_CHARS = 40  # a change's label is cut to this length
RUN_CHARS = 18  # a run's id on the x axis likewise


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n - 1] + "…"


def _groups(points: list[dict[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    out: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for p in points:
        out.setdefault((str(p["host"]), int(p["tp"]) if p["tp"] is not None else 0), []).append(p)
    return out


def _figure_of(host: str, tp: int, pts: list[dict[str, Any]]) -> Figure | None:
    """One host and tp: None when no cell of it has an earlier run."""
    first: dict[str, Any] = {}  # each run at its first measurement in the group
    for p in pts:
        if p["measured_at"] is not None and (p["run_id"] not in first or p["measured_at"] < first[p["run_id"]]):
            first[p["run_id"]] = p["measured_at"]
        first.setdefault(p["run_id"], None)
    runs = sorted(((when is not None, when, rid) for rid, when in first.items()),
                  key=lambda r: (r[0], r[1] or 0, r[2]))
    x_of = {r[2]: i for i, r in enumerate(runs)}
    if len(runs) < 2:
        return None
    configs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    order: dict[str, tuple[Any, ...]] = {}
    for p in pts:
        configs.setdefault(str(p["config_id"]), {}).setdefault(cell_words(p), []).append(p)
        order.setdefault(str(p["config_id"]), (budget_key(str(p["method"]), p["method_params"] or "{}"),
                                               str(p["config_id"])))
    names = sorted(configs, key=order.__getitem__)
    fig, axes = figure(len(names), f"{host} tp{tp}: output tok/s per cell over the runs (95% interval); "
                        "○ outside the previous runs' spread; dashed: what changed", width=5.2, height=3.8)
    colors = Colors()
    env_marks: dict[int, list[str]] = {}
    for p in pts:
        if p["previous_run"] is not None:
            for change in environment_changes(p["previous_environment"], p["environment"]):
                env_marks.setdefault(x_of[p["run_id"]], [])
                if change not in env_marks[x_of[p["run_id"]]]:
                    env_marks[x_of[p["run_id"]]].append(change)
    for ax, name in zip(axes, names):
        cells = sorted(configs[name].items(), key=lambda kv: -len(kv[1]))[:MAX_CELLS]
        marks = {x: list(v) for x, v in env_marks.items()}
        for words, cell_pts in cells:
            color, gid = colors(words), f"trend-{_gid(name)}-{_gid(words)}"
            shown = [p for p in cell_pts if number(p["tok_s_mean"]) == number(p["tok_s_mean"])]
            y = np.array([number(p["tok_s_mean"]) for p in shown])
            lo = np.array([number(p["tok_s_ci_low"]) for p in shown])
            hi = np.array([number(p["tok_s_ci_high"]) for p in shown])
            ax.errorbar([x_of[p["run_id"]] for p in shown], y, yerr=np.nan_to_num(np.vstack([y - lo, hi - y])),
                        marker="o", markersize=4, capsize=3, color=color, label=words, gid=gid)
            for p in cell_pts:
                if p not in shown:  # failed, skipped or no data in that run: a marked gap, never a value
                    gap(ax, x_of[p["run_id"]], str(p["status"] or "no data"), color,
                         f"{gid}-gap-{x_of[p['run_id']]}")
            for p in cell_pts:
                if any(o.startswith("tok/s") for o in p["outside"]):
                    ax.plot([x_of[p["run_id"]]], [number(p["tok_s_mean"])], marker="o", markersize=12,
                            markerfacecolor="none", markeredgecolor="red", linestyle="none",
                            gid=f"trend-outside-{_gid(name)}-{x_of[p['run_id']]}")
                if p["previous_run"] is not None:
                    for change in config_changes(p):
                        marks.setdefault(x_of[p["run_id"]], [])
                        if change not in marks[x_of[p["run_id"]]]:
                            marks[x_of[p["run_id"]]].append(change)
        for x, said in sorted(marks.items()):
            ax.axvline(x - 0.5, color="0.4", linestyle="--", linewidth=1, gid=f"trend-change-{_gid(name)}-{x}")
            ax.annotate(_short("; ".join(said), LABEL_CHARS), (x - 0.5, 0.98), xycoords=ax.get_xaxis_transform(),
                        xytext=(3, 0), textcoords="offset points", rotation=90, va="top", fontsize=7, color="0.3")
        ax.set_title(name, fontsize=9)
        ax.set_xticks(range(len(runs)), [_short(str(r[2]), RUN_CHARS) for r in runs], rotation=30, ha="right",
                      fontsize=7)
        ax.set_xlim(-0.6, len(runs) - 0.4)
        ax.set_ylabel("output tok/s")
        ax.grid(alpha=0.3)
    legend(fig, axes)
    return fig


def _gid(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", text)


def figures(points: list[dict[str, Any]]) -> Iterator[tuple[str, Figure]]:
    """(file name without suffix, figure) per host and tp whose cells have an earlier run."""
    for (host, tp), pts in _groups(points).items():
        fig = _figure_of(host, tp, pts)
        if fig is not None:
            yield f"trend-{_gid(host)}-tp{tp}", fig

"""The drawing kit of every plot (the run's, `plots`, and its trend over earlier runs, `trend`): matplotlib's Agg
without a display, one colour per label, figures of small multiples with one legend, a missing value drawn as a
marked gap (never as a value), and each figure written as PNG and SVG carrying specfleet's mark."""
from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any, Iterable

import matplotlib
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from agent.store import write_atomic

from . import own

FORMATS = ("png", "svg")
GAP_Y = 0.04  # where a gap's marker sits, in axes coordinates: at the foot of the axes, never at a value
PNG_DPI = 100
MAX_WIDTH_IN = 30.0  # a figure grows with its bars up to this width (inches)
PANEL_COLUMNS = 3
PALETTE = [*matplotlib.colormaps["tab10"].colors, *matplotlib.colormaps["tab20"].colors[1::2]]
RC = {"svg.fonttype": "none", "svg.hashsalt": "specfleet", "font.size": 9}  # SVG text stays text; ids stable
NAN = float("nan")


class Colors:
    """A colour per label, the same in every panel of a figure."""

    def __init__(self) -> None:
        self.given: dict[str, Any] = {}

    def __call__(self, label: str) -> Any:
        return self.given.setdefault(label, PALETTE[len(self.given) % len(PALETTE)])


def gap(ax: Axes, x: float, reason: str, color: Any, gid: str) -> None:
    """No value at data x: a dotted line across the axes, an `x` at its foot and the reason written upwards."""
    where = ax.get_xaxis_transform()
    ax.axvline(x, color=color, linestyle=":", linewidth=1, alpha=0.6, gid=f"{gid}-line")
    ax.plot([x], [GAP_Y], marker="x", markersize=8, markeredgewidth=2, linestyle="none", color=color,
            transform=where, gid=gid, clip_on=False)
    ax.annotate(reason, (x, GAP_Y), xycoords=where, xytext=(4, 6), textcoords="offset points", rotation=90,
                fontsize=7, color=color, gid=f"{gid}-reason")


def figure(panels: int, title: str, width: float = 4.6, height: float = 3.4) -> tuple[Figure, list[Axes]]:
    """A figure of `panels` axes, PANEL_COLUMNS to a row, each `width` by `height` inches, under `title`."""
    cols = min(panels, PANEL_COLUMNS)
    rows = math.ceil(panels / cols)
    fig = Figure(figsize=(min(width * cols + 2.4, MAX_WIDTH_IN), height * rows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(rows, cols, squeeze=False).ravel())
    for ax in axes[panels:]:
        fig.delaxes(ax)
    fig.suptitle(title)
    return fig, axes[:panels]


def legend(fig: Figure, axes: list[Axes]) -> None:
    """One legend for the figure, each label once, beside the panels."""
    found: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            found.setdefault(label, handle)
    if found:
        fig.legend(list(found.values()), list(found), loc="outside right upper", fontsize=8)


def write(figures: Iterable[tuple[str, Figure]], out: Path) -> list[Path]:
    """Each (name, figure) as `out`/name.png and .svg, drawn under RC, with specfleet's mark; the files written, in
    order. A PNG or SVG in `out` that this call did not write is removed. `out` is checked first (own.check_plots):
    a PNG or SVG there without the mark is refused (own.Foreign) before anything is drawn, and left as it was."""
    own.check_plots(out)
    written: list[Path] = []
    metadata = {"png": own.png_metadata(), "svg": own.svg_metadata()}
    with matplotlib.rc_context(RC):
        for name, fig in figures:
            for fmt in FORMATS:
                buf = io.BytesIO()
                fig.savefig(buf, format=fmt, dpi=PNG_DPI, metadata=metadata[fmt])
                fig.set_layout_engine("none")  # laid out once: the next format keeps the same layout
                path = out / f"{name}.{fmt}"
                write_atomic(path, buf.getvalue())
                written.append(path)
    for stale in sorted(out.glob("*")) if out.is_dir() else []:
        if stale.suffix.lstrip(".") in FORMATS and stale not in written:
            stale.unlink()
    return written

"""The report's outputs, one module per format behind one registry (`OUTPUTS`), each rendered from the tables that
`collector.tables` computes once per run: `markdown` (report.md, and what the terminal shows), `csv` (report.csv and
the two CSVs beside it), `json` (report.json), `plots` (plots/, PNG and SVG) and `html` (report.html, which embeds
the plots). `collector.report.write` writes them all, in this order; `--format` names the ones with a `name`."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from .. import HTML_FILE, PACK_FILE, PLOTS_DIR, VS_FILE

if TYPE_CHECKING:  # pandas loads with the outputs that render (own, which checks files, needs none of it)
    import pandas as pd

    from ..results import Run


@dataclass
class Context:
    """What an output is rendered from: the run, its speedup table, the run folder (None: nothing is written), the
    layout (`wide`), the plots drawn so far (`draw` false: none, and an earlier report's are removed) and the
    history of its cells from the history store (empty without one)."""

    run: Run
    table: pd.DataFrame
    folder: Optional[Path] = None
    wide: bool = False
    draw: bool = True
    plots: list[Path] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)  # collector.history.for_run: its cells' past runs


@dataclass(frozen=True)
class Output:
    """One output: its `--format` name (None: a file of `--write` only), its file or folder in the run folder, and
    its text (None: the run has nothing for it, and an earlier report's file is removed). A folder output writes
    its own files."""

    name: Optional[str]
    file: str
    render: Callable[[Context], Optional[str]]
    folder: bool = False


def _markdown(c: Context) -> str:
    from . import markdown
    return markdown.render(c.run, c.table, c.wide)


def _csv(c: Context) -> str:
    from . import csv
    return csv.render(c.run, c.table)


def _json(c: Context) -> str:
    from . import json
    return json.render(c.run, c.table)


def _vs_csv(c: Context) -> Optional[str]:
    from . import csv
    return csv.ddtree_vs_dflash_csv(c.run)


def _pack_csv(c: Context) -> Optional[str]:
    from . import csv
    return csv.pack_check_csv(c.run)


def _plots(c: Context) -> None:
    """Draw the plots into the run folder's plots/ (those of an earlier report that this one does not draw go), or,
    with `draw` false, remove an earlier report's: they would not match this one. A PNG or SVG there that specfleet
    did not draw is refused (own.Foreign) and left, with everything else, as it was."""
    from . import own

    assert c.folder is not None
    out = c.folder / PLOTS_DIR
    if c.draw:
        from . import plots
        c.plots = plots.write(c.run, c.table, out, c.history)
        return None
    own.check_plots(out)
    for stale in out.glob("*.*") if out.is_dir() else []:
        if stale.suffix in own.PLOT_SUFFIXES:
            stale.unlink()
    c.plots = []
    return None


def _html(c: Context) -> str:
    from . import html
    return html.render(c.run, c.table, c.plots, c.history)


# matplotlib and the page's code are imported only by the outputs that need them
OUTPUTS: tuple[Output, ...] = (
    Output("md", "report.md", _markdown),
    Output("csv", "report.csv", _csv),
    Output("json", "report.json", _json),
    Output(None, VS_FILE, _vs_csv),
    Output(None, PACK_FILE, _pack_csv),
    Output(None, PLOTS_DIR, _plots, folder=True),
    Output("html", HTML_FILE, _html),
)
FORMATS = tuple(o.name for o in OUTPUTS if o.name)


def by_name(name: str) -> Output:
    """The output of `--format name`."""
    return next(o for o in OUTPUTS if o.name == name)

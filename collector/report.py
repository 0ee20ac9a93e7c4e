"""The report of a run: its tables (`collector.tables`), computed once, rendered by each output of the registry
(`collector.outputs.OUTPUTS`): one format for the terminal (`render`), or every file into the run folder (`write`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from agent.store import write_atomic

from . import PLOTS_DIR
from .outputs import OUTPUTS, Context, by_name
from .outputs.own import check_report
from .results import Run
from .tables.speedup import table


def render(run: Run, fmt: str, wide: bool = False, folder: Optional[Path] = None,
           history: Optional[list[dict[str, Any]]] = None) -> str:
    """The report in format `fmt` (md, csv, json; html with its plots drawn into `folder`'s plots/, and with
    `history` (collector.history.for_run) its trend plots and section)."""
    context = Context(run, table(run), folder, wide, history=history or [])
    if fmt == "html":
        assert folder is not None, "the html page embeds the plots it draws into the run folder"
        next(o for o in OUTPUTS if o.file == PLOTS_DIR).render(context)
    text = by_name(fmt).render(context)
    assert text is not None
    return text


def write(root: Path, run: Run, plots: bool = True, history: Optional[list[dict[str, Any]]] = None) -> dict[str, str]:
    """Write every output into the run folder, in the registry's order (the plots before the page that embeds them;
    `plots` false: none, and an earlier report's removed; `history`: as for `render`); the text of each output
    with a format, by format. A report file or plot in the folder that specfleet did not write is refused
    (own.Foreign) before anything is written."""
    check_report(root)
    context = Context(run, table(run), root, draw=plots, history=history or [])
    texts: dict[str, str] = {}
    for output in OUTPUTS:
        text = output.render(context)
        if output.folder:
            continue
        if text is None:          # nothing of this kind in the run (any more): no file, not an empty one
            (root / output.file).unlink(missing_ok=True)
            continue
        write_atomic(root / output.file, text.encode())
        if output.name:
            texts[output.name] = text
    return texts

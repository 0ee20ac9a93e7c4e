"""report.json: the run's metadata, the speedup table's rows, where speculation pays (the crossovers), the spread
across hosts and engines, DDTree against DFlash, the pack checks, the acceptance per config, the time per config and
the problems met while reading the results."""
from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

from agent.records import INF

from .. import crossover
from ..results import Run
from ..tables.acceptance import acceptance
from ..tables.cross_host import cross_host
from ..tables.ddtree_vs_dflash import ddtree_vs_dflash, dflash_alone
from ..tables.pack_check import pack_check
from ..tables.timing import timing


def _rows(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The frame's rows; an infinite request_rate (or crossover bound) as "inf", as requests.jsonl writes it."""
    infinite = [c for c in ("request_rate", "crossover_high", "goodput_crossover_high") if c in df.columns]
    if infinite and not df.empty:
        df = df.assign(**{c: df[c].map(lambda v: INF if isinstance(v, float) and math.isinf(v) else v)
                          for c in infinite})
    return json.loads(df.to_json(orient="records", double_precision=6))


def render(run: Run, df: pd.DataFrame) -> str:
    """The report as one JSON document, from the speedup table `df` (tables.speedup.table)."""
    return dumps_indented({"run": run.meta, "rows": _rows(df), "where_speculation_pays": _rows(crossover.table(df)),
                           "cross_host": _rows(cross_host(df)),
                           "ddtree_vs_dflash": _rows(ddtree_vs_dflash(run, df)),
                           "dflash_without_ddtree": dflash_alone(run, df),
                           "baseline_alone_vs_packed": _rows(pack_check(run)),
                           "acceptance_per_config": _rows(acceptance(run)), "time_per_config": _rows(timing(run)),
                           "problems": run.problems}) + "\n"


_SCALARS = (str, int, float, bool, type(None))


def dumps_indented(doc: dict[str, Any]) -> str:
    """json.dumps(doc, indent=2), the same text, sooner: Python's json writes an indented document in Python
    code, so each list of flat objects (the table's rows, thousands of them) is written by the C encoder, one
    object at a time, with separators that lay it out as the indented form would."""
    if not doc:
        return "{}"
    parts = []
    for key, value in doc.items():
        if (isinstance(value, list) and value
                and all(isinstance(v, dict) and v and all(isinstance(x, _SCALARS) for x in v.values()) for v in value)):
            item = json.dumps  # "{" item, item "}" -> "{\n      " item ",\n      " item "\n    }"
            objects = ("{\n      " + item(v, separators=(",\n      ", ": "))[1:-1] + "\n    }" for v in value)
            text = "[\n    " + ",\n    ".join(objects) + "\n  ]"
        else:
            text = json.dumps(value, indent=2).replace("\n", "\n  ")  # one level in: every line after the first
        parts.append(f"  {json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(parts) + "\n}"

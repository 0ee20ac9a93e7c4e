"""report.csv (the full speedup table) and the two CSVs beside it, each written only when the run has rows for it:
every DDTree budget against every DFlash config of a cell (VS_FILE) and each packed phase's baseline alone against
packed (PACK_FILE)."""
from __future__ import annotations

import pandas as pd

from ..results import Run
from ..tables.ddtree_vs_dflash import ddtree_vs_dflash
from ..tables.pack_check import pack_check


def render(run: Run, df: pd.DataFrame) -> str:
    """The speedup table `df` (tables.speedup.table) as CSV, every column."""
    return df.to_csv(index=False, float_format="%.4f")


def ddtree_vs_dflash_csv(run: Run) -> str | None:
    """The comparison as CSV (the file VS_FILE), or None when the run has no group with both methods."""
    vs = ddtree_vs_dflash(run)
    return None if vs.empty else vs.to_csv(index=False, float_format="%.4f")


def pack_check_csv(run: Run) -> str | None:
    """The pack checks as CSV (the file PACK_FILE), or None when the run has none."""
    checked = pack_check(run)
    return None if checked.empty else checked.to_csv(index=False, float_format="%.4f")

"""The spread across hosts: per config and cell, tok/s and speedup on each host side by side."""
from __future__ import annotations

import pandas as pd

from ..vocab import CELL
from .speedup import rates


def cross_host(df: pd.DataFrame) -> pd.DataFrame:
    """Per config and cell: tok/s and speedup on each host side by side, and their spread
    (max/min - 1 of tok/s across the hosts that have the cell)."""
    ok = df[df["status"] == "ok"]
    if ok.empty or ok["host"].nunique() < 2:
        return pd.DataFrame()
    keys = ["config_id", *CELL]
    ok = ok.assign(request_rate=ok["request_rate"].map(lambda v: -1.0 if v is None else v))  # pivots drop NA keys
    tok = ok.pivot_table(index=keys, columns="host", values="tok_s_mean", aggfunc="first")
    spd = ok.pivot_table(index=keys, columns="host", values="speedup", aggfunc="first")
    out = pd.concat({"tok_s": tok, "speedup": spd}, axis=1)
    out.columns = [f"{host} {metric}" for metric, host in out.columns]
    out["tok_s_spread"] = tok.max(axis=1) / tok.min(axis=1) - 1
    out = out.reset_index()
    out["request_rate"] = rates(out["request_rate"].map(lambda v: None if v == -1.0 else v))
    return out

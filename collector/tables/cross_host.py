"""The spread across hosts and engines: per config and cell, tok/s and speedup on each host and engine side by side
(one machine served by two engines is two inventory hosts, each a column of its own)."""
from __future__ import annotations

import pandas as pd

from ..vocab import CELL
from .speedup import rates

SIDE = ["host", "engine"]  # a column's side: a host and the engine it ran


def side_name(host: str, engine: str) -> str:
    """`local (vllm)`: a side as its columns name it (`?` for an engine no record names)."""
    return f"{host} ({engine or '?'})"


def cross_host(df: pd.DataFrame) -> pd.DataFrame:
    """Per config and cell: tok/s, then speedup (over that host's own baseline), of each host and engine side by
    side (columns `<host> (<engine>) tok_s`, `<host> (<engine>) speedup`, sides in name order), and their spread
    (tok_s_spread: max/min - 1 of tok/s across the sides that have the cell). Empty below two sides."""
    ok = df[df["status"] == "ok"]
    ok = ok.assign(engine=ok["engine"].map(lambda e: e if isinstance(e, str) else ""))  # pivots drop NA keys
    if ok.empty or len(ok.drop_duplicates(SIDE)) < 2:
        return pd.DataFrame()
    keys = ["config_id", *CELL]
    ok = ok.assign(request_rate=ok["request_rate"].map(lambda v: -1.0 if v is None else v))
    tok = ok.pivot_table(index=keys, columns=SIDE, values="tok_s_mean", aggfunc="first")
    spd = ok.pivot_table(index=keys, columns=SIDE, values="speedup", aggfunc="first")
    out = pd.concat({"tok_s": tok, "speedup": spd}, axis=1)
    out.columns = [f"{side_name(host, engine)} {metric}" for metric, host, engine in out.columns]
    out["tok_s_spread"] = tok.max(axis=1) / tok.min(axis=1) - 1
    out = out.reset_index()
    out["request_rate"] = rates(out["request_rate"].map(lambda v: None if v == -1.0 else v))
    return out

"""The report's tables, one module each, computed once per run and rendered by `collector.outputs`: `speedup` (the
speedup table: a row per host, engine, model, tp, cell and config, each spec row paired with its autoregressive
baseline), `ddtree_vs_dflash`, `pack_check`, `cross_host`, `acceptance` (the acceptance per config) and `timing` (the
time per config).

Here, without pandas (the history store's schema takes them): the speedup table's key and columns, and the rows of
any of the tables as dicts."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import serving
from ..vocab import CELL

if TYPE_CHECKING:
    import pandas as pd

PAIR = ["host", "engine", "model", "tp", *CELL]  # a row's cell on its host: a spec row pairs with the baseline's

# Per cell, its latency percentiles, requests/s, for an open-loop cell the rate its client achieved and how late it
# sent (p99), and where latency limits are set (`slo`, JSON) the share of its requests within them, whether that
# share reaches the limits' attainment, and goodput (collector.serving), with goodput ÷ the baseline's.
SERVING_COLUMNS = [f"{m}_p{q}_s" for m in serving.LATENCIES for q in serving.PCTS] + [
    "req_s_mean", "achieved_rate", "send_lag_p99_s", "slo", "slo_met", "within_slo", "goodput_req_s",
    "goodput_tok_s", "goodput_speedup", "goodput_speedup_ci_low", "goodput_speedup_ci_high"]

COLUMNS = PAIR + ["config_id", "method", "method_params", "n", "errors", "tok_s_mean", "tok_s_std", "speedup",
                  "speedup_ci_low", "speedup_ci_high", "significant", "accept_length_mean", "ttft_mean_s",
                  "status", "cv", "tpot_mean_s", "burst_tok_s_mean", "burst_speedup", "burst_speedup_ci_low",
                  "burst_speedup_ci_high", "flags", "checks"] + SERVING_COLUMNS


def row_dicts(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The frame's rows as dicts, each value as iterrows() gives it (it reads the same df.values)."""
    columns = list(df.columns)
    return [dict(zip(columns, values)) for values in df.values]

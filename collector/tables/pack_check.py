"""The pack check: for a packed phase, its baseline measured alone against the same baseline measured again (the
pack check) while the phase's other configs ran beside it on the other slots."""
from __future__ import annotations

from typing import Any

import pandas as pd

from agent.records import cell_key

from ..results import Run
from ..stats import NONE, significant, summary_ratio_ci
from ..vocab import seconds_words
from . import PAIR
from .speedup import pack_checks, samples

PACK_COLUMNS = PAIR + ["baseline_config_id", "pack_check_config_id", "alone_n", "alone_tok_s_mean", "alone_tok_s_std",
                       "alone_status", "packed_n", "packed_tok_s_mean", "packed_tok_s_std", "packed_status",
                       "packed_over_alone", "packed_over_alone_ci_low", "packed_over_alone_ci_high",
                       "packed_over_alone_significant", "beside"]


def beside(status: dict[str, Any]) -> str:
    """The configs that were in their timed requests while this one was (neighbours with timed_overlap_s > 0),
    with those seconds: `tp1-dflash (slot 1): 80.0 s; tp1-ngram (slot 2): 12.5 s`."""
    near = status.get("neighbours")
    found = [n for n in near if isinstance(n, dict) and isinstance(n.get("timed_overlap_s"), (int, float))
             and n["timed_overlap_s"] > 0] if isinstance(near, list) else []
    return "; ".join(f"{n.get('config_id')} (slot {n.get('slot')}): {seconds_words(n['timed_overlap_s'])}"
                     for n in found)


def _side(name: str, s: dict[str, Any] | None) -> dict[str, Any]:
    """One side of a pack check's row: n, mean, std and status of a sample, `missing` without one."""
    n, mean, std = s["tok"] if s else NONE
    return {f"{name}_n": n, f"{name}_tok_s_mean": mean, f"{name}_tok_s_std": std,
            f"{name}_status": s["status"] if s else "missing"}


def pack_check(run: Run) -> pd.DataFrame:
    """Each pack check against its baseline, one row per cell of either: the baseline's tok/s measured alone and
    measured again beside the phase's other configs (mean, sample std, n, or the reason there is none),
    packed ÷ alone with the speedup's interval for a ratio of means, and the configs that were measuring beside
    the pack check (with the seconds they were). Empty when the run has no pack check."""
    got = samples(run)
    by_config: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for s in got:
        by_config.setdefault((s["host"], s["config_id"]), []).append(s)
    status = {(c.host, c.config_id): c.status for c in run.configs}
    rows = []
    for (host, cid), base_id in pack_checks(run).items():
        packed = {cell_key(s): s for s in by_config.get((host, cid), [])}
        alone = {cell_key(s): s for s in by_config.get((host, base_id), [])}
        near = beside(status[(host, cid)])
        for key in dict.fromkeys([*alone, *packed]):
            a, p = alone.get(key), packed.get(key)
            first = a or p
            assert first is not None
            ratio = lo = hi = None
            if a and p and a["tok"][0] and p["tok"][0]:
                ratio = p["tok"][1] / a["tok"][1]
                lo, hi = summary_ratio_ci(p["tok"], a["tok"])
            rows.append({**{k: first[k] for k in PAIR}, "baseline_config_id": base_id, "pack_check_config_id": cid,
                         **_side("alone", a), **_side("packed", p), "packed_over_alone": ratio,
                         "packed_over_alone_ci_low": lo, "packed_over_alone_ci_high": hi,
                         "packed_over_alone_significant": significant(lo, hi), "beside": near})
    out = pd.DataFrame(rows, columns=PACK_COLUMNS)
    for col in ("tp", "max_tokens", "context_tokens", "concurrency", "alone_n", "packed_n"):
        out[col] = out[col].astype("Int64")
    out = out.sort_values(["host", "tp", "workload", "max_tokens", "context_tokens", "concurrency",
                           "baseline_config_id"], na_position="last", kind="stable")
    return out.reset_index(drop=True)

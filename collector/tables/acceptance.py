"""The acceptance per config: for each speculative config, over its ok timed requests, the acceptance length pooled
over verify steps as the server's counters pool it (agent/counters.py), with its 95% interval, the share of drafted
tokens accepted and the tokens drafted per verify step, from the sums its request lines were read into
(results.SpecRows). A figure that cannot be worked out is missing (blank in report.md, null in report.json), never
filled in.

Per request i with verify steps s_i > 0 (spec_steps) and accepted draft tokens a_i (spec_accepted_tokens), n of
them: R = Σ a ÷ Σ s, accept_length = 1 + R; its standard error is the ratio estimator's,
SE = √(Σ (a_i − R s_i)² ÷ (n (n − 1))) ÷ s̄ with s̄ = Σ s ÷ n, and its interval 1 + R ± t(0.975, n − 1) SE."""
from __future__ import annotations

import math
from typing import Optional

import pandas as pd

from ..results import ConfigResult, Run, SpecRows
from ..stats import t_quantile
from ..views import config_result_order
from ..vocab import params_words

AR = "autoregressive"
VERDICTS = ("ok", "suspect", "unchecked")  # status.json `counters` verdicts (agent/counters.py)

# The acceptance length's interval, in words (report.md and docs/results.md).
INTERVAL = ("its 95% interval: 1 + R ± t(0.975, n − 1) × SE, where R = Σ a ÷ Σ s over the n requests with verify "
            "steps s and accepted tokens a, and SE = √(Σ (a − R s)² ÷ (n (n − 1))) ÷ mean s, the ratio estimator's "
            "standard error; none below two requests")
# Each figure of a config after its host, id, method and params (in words), and what it holds: the words of
# report.md and docs/results.md; accept_length has its interval beside it (INTERVAL).
FIGURES = (
    ("requests", "the config's ok timed requests"),
    ("requests_with_steps", "of those, the requests whose verify steps the server counted (spec_steps above 0)"),
    ("accept_length", "tokens per verify step, the bonus token included, over the requests with verify steps and "
     "accepted tokens: 1 + Σ accepted ÷ Σ verify steps, weighted by verify steps as the server's counters are (a "
     "mean of per-request lengths would weigh a short request like a long one)"),
    ("acceptance_rate", "Σ accepted ÷ Σ drafted tokens over the requests that carry their drafted tokens (llama.cpp "
     "counts them)"),
    ("draft_tokens_per_step", "Σ drafted tokens ÷ Σ verify steps over the requests that carry both"),
    ("burst_rows", "requests whose acceptance length is their burst's (accept_scope `burst`: the server's counters "
     "were read around the whole burst, so their own verify steps are unknown): in no figure above but the rate"),
    ("counters", "the config's counter check (status.json `counters`): ok, suspect or unchecked"),
)
WHAT = dict(FIGURES)  # each figure -> what it holds
CI = ["accept_length_ci_low", "accept_length_ci_high"]
COLUMNS = ["host", "config_id", "method", "params", "requests", "requests_with_steps", "accept_length", *CI,
           "acceptance_rate", "draft_tokens_per_step", "burst_rows", "counters"]


def _ratio(top: float, bottom: float, rows: int) -> Optional[float]:
    return top / bottom if rows and bottom > 0 else None


def interval(spec: SpecRows) -> tuple[Optional[float], Optional[float], Optional[float]]:
    """The acceptance length (1 + Σ a ÷ Σ s) and its 95% interval; None where it cannot be worked out (no request
    with verify steps; the interval below two)."""
    r = _ratio(spec.accepted, spec.steps, spec.n)
    if r is None:
        return None, None, None
    if spec.n < 2:
        return 1 + r, None, None
    se = math.sqrt(spec.residual_ss / (spec.n * (spec.n - 1))) / (spec.steps / spec.n)
    half = t_quantile(0.975, spec.n - 1) * se
    return 1 + r, 1 + r - half, 1 + r + half


def _verdict(c: ConfigResult) -> Optional[str]:
    counters = c.status.get("counters")
    verdict = counters.get("verdict") if isinstance(counters, dict) else None
    return verdict if verdict in VERDICTS else None


def acceptance(run: Run) -> pd.DataFrame:
    """Per speculative config (per host, in views.config_order, as the time per config): COLUMNS; no row for the
    autoregressive configs (the pack checks among them)."""
    rows = []
    for c in sorted(run.configs, key=lambda c: (c.host, config_result_order(c))):
        ident = c.identity()
        if ident["method"] == AR:
            continue
        spec = c.spec
        length, low, high = interval(spec)
        rows.append({"host": c.host, "config_id": c.config_id, "method": ident["method"],
                     "params": params_words(ident["method_params"]), "requests": spec.requests,
                     "requests_with_steps": spec.with_steps, "accept_length": length, "accept_length_ci_low": low,
                     "accept_length_ci_high": high,
                     "acceptance_rate": _ratio(spec.drafted_accepted, spec.drafted, spec.drafted_rows),
                     "draft_tokens_per_step": _ratio(spec.per_step_drafted, spec.per_step_steps, spec.per_step_rows),
                     "burst_rows": spec.burst, "counters": _verdict(c)})
    return pd.DataFrame(rows, columns=COLUMNS)


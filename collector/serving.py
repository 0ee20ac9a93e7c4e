"""A cell's serving figures, from its request lines: latency percentiles, the share of its requests within latency
limits (`slo`), goodput, request throughput and, for an open-loop cell, the rate its client achieved and how late it
sent.

Definitions (docs/serving.md):
- percentiles are numpy's linear interpolation over the ok requests, as vLLM's `bench serve` reports them;
- a request meets the limits when it succeeded and is within every limit given: TTFT, TPOT, the longest wait
  between two stream chunks (`itl_ms`: under speculation a chunk carries a verify step's tokens, so a reader waits a
  whole step however small the per-token ITL looks) and e2e; a request with one token has no TPOT and one with one
  content chunk no chunk gap, and those limits do not hold it back;
- goodput (vLLM's `--goodput`, after DistServe): per repetition, the requests (and their output tokens) that met
  every limit over the repetition's span, from its first send to its last byte; a cell's figure is the mean over
  its repetitions;
- the achieved rate: per repetition, (sends - 1) over the first to the last send.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import numpy as np

from agent.arrivals import achieved_rate

from .stats import Summary, summary

PCTS = (50, 90, 99)
LATENCIES = ("ttft", "tpot", "e2e")  # the figures reported as percentiles
LATE_S = 0.1  # an open-loop cell whose client sent a request more than this late (p99) is flagged behind_schedule
ATTAINMENT = 0.9  # the share of a load's requests that must meet the limits, unless the slo says otherwise
LIMITS = {"ttft_ms": "ttft", "tpot_ms": "tpot", "itl_ms": "gap", "e2e_ms": "e2e"}


@dataclass
class Serving:
    """The numbers of one cell the serving figures are worked out from: its ok requests' latencies, output
    tokens and repetition; each repetition's request count and span; the client's sends against the schedule."""

    ttft: np.ndarray
    tpot: np.ndarray
    e2e: np.ndarray
    gap: np.ndarray  # chunk_gap_max_s
    tokens: np.ndarray
    rep: np.ndarray  # of each ok request: its repetition, as a place in `spans`
    requests: np.ndarray  # per repetition: its requests, ok or not
    spans: np.ndarray  # per repetition: first send to last byte, NaN without times
    achieved: list[float]  # per repetition of an open-loop cell: the rate the client sent at
    lag: np.ndarray  # of every request sent on a schedule: sent - due, in seconds

    @classmethod
    def of(cls, num: Mapping[str, np.ndarray], idx: np.ndarray, good: np.ndarray, good_pair: np.ndarray,
           reps: np.ndarray, spans: np.ndarray, idx_pair: np.ndarray, open_loop: bool) -> Serving:
        """From the reader's columns (`num`, by line): the cell's lines `idx`, of which `good` are ok, each
        line's repetition (`good_pair`, `idx_pair`, numbered as `reps` numbers them)."""
        place = np.searchsorted(reps, good_pair)
        counts = np.bincount(np.searchsorted(reps, idx_pair), minlength=len(reps))
        achieved: list[float] = []
        if open_loop:
            sent = num["sent_s"][idx]
            for r in reps.tolist():
                got = achieved_rate(sent[(idx_pair == r) & ~np.isnan(sent)].tolist())
                if got is not None and math.isfinite(got):
                    achieved.append(got)
        lag = (num["sent_s"][idx] - num["scheduled_s"][idx])
        return cls(num["ttft_s"][good], num["tpot_s"][good], num["e2e_s"][good], num["chunk_gap_max_s"][good],
                   np.nan_to_num(num["completion_tokens"][good]), place, counts, spans, achieved,
                   lag[~np.isnan(lag)])

    def percentiles(self, name: str) -> tuple[Optional[float], ...]:
        values = getattr(self, name)
        values = values[~np.isnan(values)]
        if not len(values):
            return (None,) * len(PCTS)
        return tuple(float(v) for v in np.percentile(values, PCTS))

    def met(self, slo: Mapping[str, Any]) -> np.ndarray:
        """Which ok requests are within every limit of `slo` (a figure the request does not have holds it back
        only for TTFT and e2e, which every ok request has)."""
        ok = np.ones(len(self.ttft), dtype=bool)
        for key, name in LIMITS.items():
            if key in slo:
                values = getattr(self, name)
                without = np.isnan(values) if name in ("tpot", "gap") else np.zeros(len(values), dtype=bool)
                ok &= without | (values <= slo[key] / 1000.0)
        return ok

    def share(self, slo: Mapping[str, Any]) -> Optional[float]:
        """The share of all the cell's requests (failed ones too) that met every limit."""
        total = int(self.requests.sum())
        return float(self.met(slo).sum()) / total if total else None

    def per_rep(self, weights: np.ndarray) -> Summary:
        """Σ weights per repetition over its span, for the repetitions with a span."""
        sums = np.bincount(self.rep, weights=weights, minlength=len(self.spans))
        keep = ~np.isnan(self.spans) & (self.spans > 0)
        return summary((sums[keep] / self.spans[keep]).tolist())

    def goodput(self, slo: Mapping[str, Any]) -> tuple[Summary, Summary]:
        """Requests/s and output tok/s of the requests that met every limit, per repetition."""
        met = self.met(slo).astype(float)
        return self.per_rep(met), self.per_rep(met * self.tokens)

    def req_s(self) -> Summary:
        """Completed (ok) requests per second, per repetition."""
        return self.per_rep(np.ones(len(self.rep)))

    def late(self) -> Optional[float]:
        """The p99 of how late the client sent the requests that had a schedule (None without one)."""
        return float(np.percentile(self.lag, 99)) if len(self.lag) else None


def attainment(slo: Mapping[str, Any]) -> float:
    return float(slo.get("attainment", ATTAINMENT))

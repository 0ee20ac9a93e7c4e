"""A run's results as the collector holds them: the run (`Run`), each config's (`ConfigResult`), per cell of a
config what the report reads of its valid request lines (`CellRows`), and what the acceptance table reads of them
(`SpecRows`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from agent.records import read_requests

from .serving import Serving
from .stats import NONE, Summary


@dataclass
class CellRows:
    """What the report reads of the valid request lines of one cell of a config, summed up where they are read
    (in another process, for a large run), each figure as the report's own code works it out from the lines."""

    key: tuple[Any, ...]  # records.cell_key: workload, max_tokens, context_tokens, concurrency
    n_total: int = 0  # valid lines
    errors: int = 0  # of those, not ok
    tok: Summary = NONE  # output_tok_s of the ok ones
    bursts: Summary = NONE  # tables.speedup.bursts() of the lines, where concurrency > 1: each burst's aggregate tok/s
    acc_mean: Optional[float] = None  # mean accept_length of the ok ones that carry it
    ttft_mean: Optional[float] = None  # likewise, ttft_s
    tpot_mean: Optional[float] = None  # likewise, tpot_s
    serving: Optional[Serving] = None  # what latency limits, goodput and the achieved rate are worked out from


@dataclass
class SpecRows:
    """What the acceptance table (collector.tables.acceptance) reads of a config's ok request lines, summed up where
    they are read, as CellRows is: a = spec_accepted_tokens, s = spec_steps, d = spec_draft_tokens of a line."""

    requests: int = 0  # ok lines
    with_steps: int = 0  # of those, the lines whose s > 0
    n: int = 0  # of those, the lines that carry a too: the acceptance length's
    accepted: float = 0.0  # their Σ a
    steps: float = 0.0  # their Σ s
    residual_ss: float = 0.0  # their Σ (a - R s)², R = Σ a / Σ s (the ratio estimator's spread)
    drafted: float = 0.0  # Σ d over the ok lines that carry both d and a
    drafted_accepted: float = 0.0  # Σ a over the same lines
    drafted_rows: int = 0  # how many
    per_step_drafted: float = 0.0  # Σ d over the ok lines that carry d and s > 0
    per_step_steps: float = 0.0  # Σ s over the same lines
    per_step_rows: int = 0  # how many
    burst: int = 0  # ok lines with accept_scope `burst` (their steps are the burst's, not their own)


@dataclass
class ConfigResult:
    host: str
    config_id: str
    config: dict[str, Any]
    status: dict[str, Any]
    cells: list[CellRows] = field(default_factory=list)  # its valid request lines, by cell
    first: Optional[dict[str, Any]] = None  # its first valid request line
    count: int = 0  # how many request lines were valid
    source: Optional[Path] = None  # its requests.jsonl, where there is one
    rows: Optional[dict[str, np.ndarray]] = None  # its valid request lines by column, when load_run kept them
    spec: SpecRows = field(default_factory=SpecRows)  # what the acceptance table reads of its ok lines

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The valid request lines themselves, read again from the file (the report needs only `cells`)."""
        return read_requests(self.source, []) if self.source is not None and self.source.exists() else []

    def identity(self) -> dict[str, Any]:
        """What the config is (engine, model name, method, params, tp), from config.json or, when that is lost,
        from its first request line (which carries the same fields), so its rows still pair with their
        baseline."""
        cfg, first = self.config, (self.first or {})
        model = cfg.get("model")
        return {"host": self.host, "config_id": self.config_id,
                "engine": cfg.get("engine") or first.get("engine", ""),
                "model": model.get("name") if isinstance(model, dict) else (first.get("model") or ""),
                "tp": cfg.get("tp", first.get("tp")), "method": cfg.get("method") or first.get("method", ""),
                "method_params": cfg.get("method_params", first.get("method_params", {}))}


@dataclass
class Run:
    root: Path
    meta: dict[str, Any]
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)
    configs: list[ConfigResult] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)  # the report's, worked out once

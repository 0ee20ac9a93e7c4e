"""One run against another, cell by cell: the figures `specfleet compare` prints and the verdicts it exits by (what
they mean: `COMPARE` in collector/__main__.py, its --help)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from . import crossover
from .environment import differences
from .load import load_run
from .mdtable import pipe_rows
from .results import Run
from .stats import Summary, significant, summary_ratio_ci
from .tables import row_dicts
from .tables.speedup import table
from .views import budget_key, cell_text, fit_rows, outcomes, wrap
from .vocab import CELL, cell_words, na, ratio_words, tok_words

KEY = ("host", "engine", "config_id", *CELL)  # a cell of one run matches the cell of the other with the same key
_ENGINE = KEY.index("engine")
# A cell's verdict, as the JSON gives it; the text says it in words (Comparison.words). not_comparable: the same
# host, config and cell, measured by one engine in A and another in B: never judged.
VERDICTS = ("regressed", "improved", "slower_within_threshold", "faster_within_threshold", "not_significant",
            "no_interval", "not_ok", "not_comparable", "only_a", "only_b")


@dataclass(frozen=True)
class Side:
    """A cell as one run measured it: ok requests, mean and sample std of their tok/s, its status: `ok`, or
    why it has no number, as views.cell_text words it (`failed: oom`, `skipped: baseline_failed`, `no data`), and the
    engine that measured it."""

    n: int
    tok_s_mean: Optional[float]
    tok_s_std: Optional[float]
    status: str
    engine: str

    def summary(self) -> Summary:
        return self.n, self.tok_s_mean, self.tok_s_std


@dataclass(frozen=True)
class Cell:
    """One cell of either run or both: what it is (from A where A has it), each side, B ÷ A and its verdict. A cell
    not comparable (another engine in B) has both sides, each naming its engine, and no ratio."""

    host: str
    engine: str
    model: str
    tp: Optional[int]
    workload: Optional[str]
    max_tokens: Optional[int]
    context_tokens: Optional[int]
    concurrency: Optional[int]
    request_rate: Optional[float]
    config_id: str
    method: str
    method_params: str
    a: Optional[Side]
    b: Optional[Side]
    ratio: Optional[float] = None
    ci_low: Optional[float] = None
    ci_high: Optional[float] = None
    verdict: str = ""

    def cell(self) -> str:
        """`fib, 128 tok`: the cell in words."""
        return cell_words({k: getattr(self, k) for k in CELL})

    def name(self) -> str:
        """`h1 tp1-dflash, fib, 128 tok`."""
        return f"{self.host} {self.config_id}, {self.cell()}"


@dataclass(frozen=True)
class Moved:
    """One config's crossover (collector.crossover; `what`: throughput or goodput) in A and in B, and how B's
    stands to A's: down, up, same (their intervals overlap) or "" (either has none to compare)."""

    host: str
    tp: Optional[int]
    cell: str
    axis: str
    config_id: str
    what: str
    a: str
    b: str
    moved: str

    def name(self) -> str:
        return f"{self.host} {self.config_id}, {self.cell} over {self.axis.replace('_', ' ')} ({self.what})"


@dataclass(frozen=True)
class Comparison:
    """Every cell of run A and run B (`rows`), sorted as the report sorts them with budgets by number, and what
    differs in their hosts' environments: (host, label, value in A, value in B)."""

    run_a: str
    run_b: str
    threshold: float
    rows: list[Cell]
    environment: list[tuple[str, str, str, str]] = field(default_factory=list)
    crossovers: list[Moved] = field(default_factory=list)

    @property
    def moved_down(self) -> list[Moved]:
        """Crossovers whose interval in B lies wholly below A's: speculation stops paying at a lower load."""
        return [m for m in self.crossovers if m.moved == "down"]

    @property
    def regressed(self) -> list[Cell]:
        return self.having("regressed")

    @property
    def broken(self) -> list[Cell]:
        """Cells ok in A that failed or were skipped in B: an engine bump that breaks a config fails the gate too."""
        return [c for c in self.having("not_ok") if c.a is not None and c.a.status == "ok"
                and c.b is not None and c.b.status != "ok"]

    @property
    def percent(self) -> str:
        """The threshold as a percentage: `5%`, `2.50%`."""
        return f"{self.threshold:.0%}" if round(self.threshold * 100, 6).is_integer() else f"{self.threshold:.2%}"

    def having(self, verdict: str) -> list[Cell]:
        return [c for c in self.rows if c.verdict == verdict]

    def counts(self) -> dict[str, int]:
        """How many cells have each verdict, every verdict named."""
        return {v: len(self.having(v)) for v in VERDICTS}

    def words(self, verdict: str) -> str:
        """A verdict in a few words: `slower < 5%` for a significant slowdown within the threshold."""
        return {"slower_within_threshold": f"slower < {self.percent}", "faster_within_threshold":
                f"faster < {self.percent}", "not_significant": "not significant", "no_interval": "no interval",
                "not_ok": "failed or skipped", "not_comparable": "not comparable (another engine)",
                "only_a": "only in A", "only_b": "only in B"}.get(verdict, verdict)

    def to_json(self) -> str:
        doc = {"run_a": self.run_a, "run_b": self.run_b, "threshold": self.threshold, "counts": self.counts(),
               "regressed": [c.name() for c in self.regressed], "broken": [c.name() for c in self.broken],
               "crossovers_moved_down": [m.name() for m in self.moved_down],
               "crossovers": [asdict(m) for m in self.crossovers],
               "environment": [dict(zip(("host", "label", "a", "b"), d)) for d in self.environment],
               "cells": [asdict(c) for c in self.rows]}
        return json.dumps(doc, indent=2) + "\n"

    def text(self, wide: bool = False) -> str:
        """Markdown: the verdicts, the environment, a table per cell of those both runs measured, then the rest;
        within 120 columns. `wide`: one table of every cell with every column instead."""
        md = self._head()
        if wide:
            md += ["", "## Every cell", "", pipe_rows([_wide_row(c) for c in self.rows])]
        else:
            md += self._tables()
            md += self._list("Failed or skipped in a run", "not_ok",
                             lambda c: f"A {_side_text(c.a)}; B {_side_text(c.b)}")
            md += self._list("Not comparable: another engine", "not_comparable",
                             lambda c: f"A {_engine_text(c.a)}; B {_engine_text(c.b)}")
            md += self._list("Only in A", "only_a", lambda c: _side_text(c.a))
            md += self._list("Only in B", "only_b", lambda c: _side_text(c.b))
        return "\n".join(md) + "\n"

    def _head(self) -> list[str]:
        counts = "; ".join(f"{n} {self.words(v)}" for v, n in self.counts().items() if n) or "none"
        rule = (f"Per cell B ÷ A of mean tok/s with its 95% interval. A cell regressed when B ÷ A is below "
                f"{1 - self.threshold:.2f} (threshold {self.percent}) and the interval lies below 1; improved when it "
                f"is above {1 + self.threshold:.2f} and the interval lies above 1.")
        md = [f"# Run {self.run_b} (B) against run {self.run_a} (A)", "", *wrap(rule, indent=""), "",
              *wrap(f"{len(self.rows)} cells: {counts}")]
        md += self._list("Regressed", "regressed", _ratio_of) + self._list("Improved", "improved", _ratio_of)
        if self.crossovers:
            md += ["", "## Where speculation stops paying", "",
                   *wrap("Per config and cell swept over loads, its crossover (the load where its throughput, or "
                         "goodput, falls below the baseline's) in A and in B. Moved down: B's interval lies wholly "
                         "below A's, a regression.", indent=""), ""]
            md += _bullets(f"{m.name()}: A {m.a}; B {m.b}" + (f" — moved {m.moved}" if m.moved else "")
                           for m in self.crossovers)
        differ = _bullets(f"{host} {label}: {va} → {vb}" for host, label, va, vb in self.environment)
        return md + ["", "## Environment differences", "", *(differ or ["none"])]

    def _list(self, title: str, verdict: str, what: Callable[[Cell], str]) -> list[str]:
        """A section listing the cells with this verdict, each named with `what` of it; nothing when none."""
        cells = self.having(verdict)
        return ["", f"## {title}", "", *_bullets(f"{c.name()}: {what(c)}" for c in cells)] if cells else []

    def _tables(self) -> list[str]:
        """The cells both runs measured with one engine: a table per host, engine, tp and cell, a row per config."""
        groups: dict[tuple[Any, ...], list[Cell]] = {}
        for c in self.rows:
            if c.verdict not in ("not_ok", "not_comparable", "only_a", "only_b"):
                groups.setdefault((c.host, c.engine, c.tp, *(getattr(c, k) for k in CELL)), []).append(c)
        md = ["", "## Cells both runs measured"] if groups else []
        for cells in groups.values():
            first = cells[0]
            tp = "" if first.tp is None else f" tp{first.tp}"
            rows = [{"config": c.config_id, "A tok/s": _side_text(c.a, ""), "B tok/s": _side_text(c.b, ""),
                     "B ÷ A [95%]": _ratio_of(c), "verdict": self.words(c.verdict)}
                    for c in cells]
            md += ["", f"### {first.host} ({first.engine or '?'}){tp}: {first.cell()}", "", *fit_rows(rows, ["config"])]
        return md


def _bullets(items: Iterable[str]) -> list[str]:
    return [line for item in items for line in wrap(f"- {item}")]


def _ratio_of(c: Cell) -> str:
    return ratio_words(c.ratio, c.ci_low, c.ci_high)


def _side_text(side: Optional[Side], unit: str = " tok/s") -> str:
    if side is None:
        return "-"
    return tok_words(side.tok_s_mean, side.tok_s_std, side.n, unit) or side.status


def _engine_text(side: Optional[Side]) -> str:
    """`on vllm: 100.0 ± 1.0 tok/s (n=3)`: a side with the engine that measured it."""
    return "-" if side is None else f"on {side.engine or '?'}: {_side_text(side)}"


def _wide_row(c: Cell) -> dict[str, str]:
    """Every field of the cell, each side's prefixed a_ or b_."""
    def text(v: Any) -> str:
        return "" if v is None else (f"{v:.4f}" if isinstance(v, float) else str(v))

    values = asdict(c)
    row = {k: text(values[k]) for k in ("host", "engine", "model", "tp", *CELL, "config_id", "method",
                                         "method_params")}
    for label, side in (("a", c.a), ("b", c.b)):
        shown = asdict(side) if side else dict.fromkeys(f.name for f in fields(Side))
        row.update({f"{label}_{k}": text(v) for k, v in shown.items()})
    return {**row, **{k: text(values[k]) for k in ("ratio", "ci_low", "ci_high", "verdict")}}


def _plain(v: Any) -> Any:
    """A table value as JSON takes it: None for a missing one, Python int and float for numpy's."""
    if na(v):
        return None
    return v.item() if hasattr(v, "item") else v


def _sides(run: Run) -> dict[tuple[Any, ...], tuple[dict[str, Any], Side]]:
    """The run's table rows by KEY: each row as the table gives it, and its side; a side is `ok` when it has a
    mean tok/s, else its status in the words of views.cell_text (`failed: oom`, `no data`, `no ok request`)."""
    done = outcomes(run)
    out = {}
    for values in row_dicts(table(run)):
        r = {k: _plain(v) for k, v in values.items()}
        ok = r["status"] == "ok" and r["tok_s_mean"] is not None
        status = "ok" if ok else cell_text(r, done.get((r["host"], r["config_id"])))
        out[tuple(r[k] for k in KEY)] = (r, Side(int(r["n"] or 0), r["tok_s_mean"], r["tok_s_std"], status,
                                                 str(r["engine"] or "")))
    return out


def _verdict(ratio: Optional[float], lo: Optional[float], hi: Optional[float], threshold: float) -> str:
    sig = significant(lo, hi)
    if ratio is None or not sig:
        return "no_interval"
    if sig == "slower":
        return "regressed" if ratio < 1 - threshold else "slower_within_threshold"
    if sig == "faster":
        return "improved" if ratio > 1 + threshold else "faster_within_threshold"
    return "not_significant"


def _across_engines(keys_a: Iterable[tuple[Any, ...]], keys_b: Iterable[tuple[Any, ...]]
                    ) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    """A's keys that B lacks but has with another engine (the same host, config and cell), each with B's key: per
    run a host's config has one engine, so each has at most one."""
    def loose(key: tuple[Any, ...]) -> tuple[Any, ...]:
        return key[:_ENGINE] + key[_ENGINE + 1:]

    set_a, set_b = set(keys_a), set(keys_b)
    only_b = {loose(k): k for k in set_b - set_a}
    return {k: only_b[loose(k)] for k in set_a - set_b if loose(k) in only_b}


def _order(row: dict[str, Any]) -> tuple[Any, ...]:
    """The report's order (host, engine, tp, cell), then the methods' (views.budget_key: the baseline first, DDTree
    budgets by number)."""
    cell = [(row[k] is None, row[k]) for k in ("host", "engine", "tp", *CELL)]
    return (*cell, budget_key(row["method"], row["method_params"]), row["config_id"])


def compare(a: Run, b: Run, threshold: float = 0.05) -> Comparison:
    """Run B against run A, cell by cell (module docstring): a cell matches on KEY; one that B measured with
    another engine is set beside A's, not comparable."""
    sides_a, sides_b = _sides(a), _sides(b)
    switched = _across_engines(sides_a, sides_b)
    taken = set(switched.values())
    rows = []
    for key in dict.fromkeys([*sides_a, *sides_b]):
        if key in taken:  # with A's key, under A's engine
            continue
        row = (sides_a.get(key) or sides_b[key])[0]
        key_b = switched.get(key, key)
        side_a = sides_a[key][1] if key in sides_a else None
        side_b = sides_b[key_b][1] if key_b in sides_b else None
        ratio = lo = hi = None
        if key in switched:
            verdict = "not_comparable"
        elif side_a is None or side_b is None:
            verdict = "only_a" if side_b is None else "only_b"
        elif side_a.status != "ok" or side_b.status != "ok":
            verdict = "not_ok"
        else:
            if side_a.tok_s_mean and side_b.tok_s_mean is not None:
                ratio = side_b.tok_s_mean / side_a.tok_s_mean
                lo, hi = summary_ratio_ci(side_b.summary(), side_a.summary())
            verdict = _verdict(ratio, lo, hi, threshold)
        rows.append((_order(row), Cell(
            **{k: row[k] for k in ("host", "engine", "model", "tp", *CELL, "config_id", "method",
                                   "method_params")},
            a=side_a, b=side_b, ratio=ratio, ci_low=lo, ci_high=hi, verdict=verdict)))
    rows.sort(key=lambda pair: pair[0])
    return Comparison(run_a=_run_id(a), run_b=_run_id(b), threshold=threshold, rows=[c for _, c in rows],
                      environment=differences(a, b), crossovers=_crossovers(a, b))


def _crossovers(a: Run, b: Run) -> list[Moved]:
    """Each speculative config's crossovers in both runs (either run's where only one has it)."""
    def by_key(run: Run) -> dict[tuple[Any, ...], dict[str, Any]]:
        got = crossover.table(table(run))
        return {tuple(_plain(r[k]) for k in (*crossover.GROUP, "axis", "config_id")): r for r in row_dicts(got)
                if r["method"] != "autoregressive"}

    side_a, side_b = by_key(a), by_key(b)
    out = []
    for key in dict.fromkeys([*side_a, *side_b]):
        ra, rb = side_a.get(key), side_b.get(key)
        first = ra or rb
        assert first is not None
        for what, prefix in (("throughput", ""), ("goodput", "goodput_")):
            texts = [r[f"{prefix}crossover_text"] if r is not None else None for r in (ra, rb)]
            if all(na(t) for t in texts):
                continue
            move = crossover.moved(crossover.bounds(ra, prefix) if ra else None,
                                   crossover.bounds(rb, prefix) if rb else None)
            out.append(Moved(str(first["host"]), _plain(first["tp"]),
                             cell_words(first, leave_out="concurrency"), str(first["axis"]),
                             str(first["config_id"]), what, *("-" if na(t) else str(t) for t in texts), move))
    return out


def _run_id(run: Run) -> str:
    return str(run.meta.get("run_id") or run.root.name)


RUN_FOLDER = "name a run's folder, results/<run_id> (a run whose hosts' results are not here yet: `specfleet pull`)"


def _load(path: str) -> Optional[Run]:
    """The run in `path`, or None once it is said, in one line with what to do, that the folder is not a run's
    (none there, not a folder, or no config results in it). An OSError of reading it (a permission, an I/O error)
    is raised: the command line says it as the system's refusal."""
    root = Path(path)
    if not root.is_dir():
        print(f"{'no such run folder' if not os.path.lexists(root) else 'not a run folder'}: {root}; {RUN_FOLDER}",
              file=sys.stderr)
        return None
    run = load_run(root)
    for p in run.problems:
        print(f"warning: {p}", file=sys.stderr)
    if not run.configs:
        print(f"{root}: no config results in this run folder; {RUN_FOLDER}", file=sys.stderr)
        return None
    return run


def main(args: argparse.Namespace) -> int:
    """Print the comparison of args.run_b against args.run_a; 1 when a cell regressed or a config ok in A failed
    in B, 2 when a folder named is not a run's (said of the first such), else 0; a folder the system refuses to
    read raises its OSError (exit 3)."""
    a = _load(args.run_a)
    b = _load(args.run_b) if a is not None else None
    if a is None or b is None:
        return 2
    result = compare(a, b, args.threshold)
    sys.stdout.write(result.to_json() if args.format == "json" else result.text(wide=args.wide))
    return 1 if result.regressed or result.broken or result.moved_down else 0

"""Unit tests for the collector: results folders built by hand, expected answers computed by hand.

Every run folder here follows the layout of shared/reference/results-contract.md:
results/<run_id>/run.json, <host>/host.json, <host>/<config_id>/{config.json,status.json,requests.jsonl,server.log}.
"""
from __future__ import annotations

import csv
import io
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import pandas as pd
import pytest
from scipy import stats

from collector.__main__ import main as collector_main
from collector.load import load_run
from collector.report import render
from collector.tables.speedup import table

REPO = Path(__file__).resolve().parents[2]

CONTRACT_COLUMNS = [
    "host", "engine", "model", "tp", "workload", "max_tokens", "context_tokens", "concurrency", "config_id",
    "method", "n", "tok_s_mean", "tok_s_std", "speedup", "speedup_ci_low", "speedup_ci_high",
    "accept_length_mean", "status",
]
ENGINE = "vllm"
MODEL = "Qwen/Qwen3-8B"
MAX_TOKENS = 128


# ---------------------------------------------------------------------------------------------------------------
# Building results folders by hand
# ---------------------------------------------------------------------------------------------------------------

def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2))


def cell(workload: str = "fib", max_tokens: int = MAX_TOKENS, context_tokens: int = 0,
         concurrency: int = 1, repetitions: int = 3) -> dict[str, Any]:
    """One entry of config.json "cells"."""
    return {"workload": workload, "max_tokens": max_tokens, "context_tokens": context_tokens,
            "concurrency": concurrency, "repetitions": repetitions}


def make_run(root: Path, run_id: str = "run1") -> Path:
    """results/<run_id>/ with its run.json."""
    run_dir = root / "results" / run_id
    _write_json(run_dir / "run.json", {"run_id": run_id, "started_at": "2026-11-30T07:00:00+00:00",
                                       "finished_at": "2026-11-30T08:00:00+00:00", "project_version": "abc1234",
                                       "suite": "unit", "schema_version": 1})
    return run_dir


def make_config(run_dir: Path, host: str, config_id: str, *, method: str, cells: Sequence[dict[str, Any]],
                samples: Optional[dict[tuple[str, int, int, int], Sequence[float]]] = None,
                accept: Optional[Sequence[float]] = None, method_params: Optional[dict[str, Any]] = None,
                tp: int = 1, engine: str = ENGINE, model: str = MODEL, status: str = "ok",
                reason: Optional[str] = None, failed_requests: int = 0,
                extra_lines: Sequence[str] = ()) -> Path:
    """A config folder. `samples` maps (workload, max_tokens, context_tokens, concurrency) to the
    output_tok_s of its ok requests; `accept` gives each ok request's accept_length (else null);
    `failed_requests` adds that many ok=false rows to the first cell; `extra_lines` are appended raw."""
    host_dir = run_dir / host
    if not (host_dir / "host.json").exists():
        _write_json(host_dir / "host.json", {"host": host, "hostname": host, "gpus": {"count": 1, "devices": [
            {"name": "NVIDIA H200", "memory_total_mib": 143771}]}, "engine": {"name": engine}})
    d = host_dir / config_id
    params = method_params if method_params is not None else {}
    _write_json(d / "config.json", {"config_id": config_id, "engine": engine, "model": {"name": model},
                                    "method": method, "method_params": params, "tp": tp,
                                    "cells": list(cells), "command": ["vllm", "serve", model]})
    _write_json(d / "status.json", {"config_id": config_id, "status": status, "reason": reason, "detail": None,
                                    "started_at": "2026-11-30T07:00:00+00:00", "ready_s": 30.0,
                                    "finished_at": "2026-11-30T07:10:00+00:00", "log_tail": "",
                                    "wall_s": 100.0, "timed_s": 60.0})
    (d / "server.log").write_text("INFO server started\n")
    rows: list[dict[str, Any]] = []
    base = {"host": host, "config_id": config_id, "engine": engine, "model": model, "method": method,
            "method_params": params, "tp": tp, "prompt_tokens": 100}
    for i_cell, ((workload, max_tokens, ctx, conc), toks) in enumerate((samples or {}).items()):
        key = {"workload": workload, "max_tokens": max_tokens, "context_tokens": ctx, "concurrency": conc}
        for rep, tok in enumerate(toks):
            acc = accept[rep] if accept is not None else None
            rows.append({**base, **key, "rep": rep, "completion_tokens": max_tokens, "ttft_s": 0.05,
                         "e2e_s": max_tokens / tok, "output_tok_s": tok, "accept_length": acc,
                         "ok": True, "error": None})
        for i in range(failed_requests if i_cell == 0 else 0):
            # A failed request carries a throughput that would visibly move the mean if it were counted.
            rows.append({**base, **key, "rep": len(toks) + i, "completion_tokens": 5, "ttft_s": 0.05,
                         "e2e_s": 0.1, "output_tok_s": 50.0, "accept_length": None, "ok": False,
                         "error": "server closed the connection"})
    lines = [json.dumps(r) for r in rows] + list(extra_lines)
    if status == "ok" or lines:
        (d / "requests.jsonl").write_text("".join(line + "\n" for line in lines))
    return d


FIB = ("fib", MAX_TOKENS, 0, 1)
QSORT = ("qsort", MAX_TOKENS, 0, 1)
FIB_C4 = ("fib", MAX_TOKENS, 0, 4)


@pytest.fixture()
def standard_run(tmp_path: Path) -> Path:
    """Two hosts. h1: ok baseline (fib 10/12/14 plus one failed request), ok dflash (fib 20/24/28 with accept
    lengths 3/3.5/4, plus a concurrency-4 fib cell the baseline lacks), a crashed ddtree with two cells.
    h2: an OOM baseline, a dflash skipped as baseline_failed, and an ok ngram with no ok baseline."""
    run_dir = make_run(tmp_path)
    make_config(run_dir, "h1", "tp1-autoregressive", method="autoregressive", cells=[cell("fib")],
                samples={FIB: [10.0, 12.0, 14.0]}, failed_requests=1)
    make_config(run_dir, "h1", "tp1-dflash", method="dflash", method_params={"num_speculative_tokens": 4},
                cells=[cell("fib"), cell("fib", concurrency=4)],
                samples={FIB: [20.0, 24.0, 28.0], FIB_C4: [30.0, 32.0, 34.0]}, accept=[3.0, 3.5, 4.0])
    make_config(run_dir, "h1", "tp1-ddtree-b16", method="ddtree", method_params={"budget": 16},
                cells=[cell("fib"), cell("qsort")], status="failed", reason="crashed")
    make_config(run_dir, "h2", "tp1-autoregressive", method="autoregressive", cells=[cell("fib")],
                status="failed", reason="oom")
    make_config(run_dir, "h2", "tp1-dflash", method="dflash", method_params={"num_speculative_tokens": 4},
                cells=[cell("fib")], status="skipped", reason="baseline_failed")
    make_config(run_dir, "h2", "tp1-ngram", method="ngram", method_params={"num_speculative_tokens": 3},
                cells=[cell("fib")], samples={FIB: [15.0, 15.0, 15.0]})
    return run_dir


def row(df: pd.DataFrame, host: str, config_id: str, workload: str = "fib", concurrency: int = 1) -> pd.Series:
    """The single table row for (host, config_id, workload, concurrency)."""
    sel = df[(df["host"] == host) & (df["config_id"] == config_id) & (df["workload"] == workload)
             & (df["concurrency"] == concurrency)]
    assert len(sel) == 1, f"expected one row for {host}/{config_id}/{workload}/c{concurrency}, got {len(sel)}"
    return sel.iloc[0]


def is_empty(v: Any) -> bool:
    """Blank in the table: None, NaN or an empty string."""
    return v is None or v == "" or (isinstance(v, float) and math.isnan(v))


def expected_log_ratio_ci(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Independent computation of the contract's interval: delta method on log(mean a / mean b), relative
    standard errors, Welch–Satterthwaite degrees of freedom, Student t quantile."""
    na, nb = len(a), len(b)
    ma, mb = sum(a) / na, sum(b) / nb
    var_a = sum((x - ma) ** 2 for x in a) / (na - 1)
    var_b = sum((x - mb) ** 2 for x in b) / (nb - 1)
    ra, rb = var_a / (na * ma * ma), var_b / (nb * mb * mb)
    df = (ra + rb) ** 2 / (ra ** 2 / (na - 1) + rb ** 2 / (nb - 1))
    half = stats.t.ppf(0.5 + level / 2, df) * math.sqrt(ra + rb)
    ratio = ma / mb
    return ratio * math.exp(-half), ratio * math.exp(half)


# ---------------------------------------------------------------------------------------------------------------
# Mean, std, errors, accept length
# ---------------------------------------------------------------------------------------------------------------

def test_tok_s_mean_and_sample_std(standard_run: Path) -> None:
    """10, 12, 14 tok/s -> mean 12, sample std (ddof=1) 2; 20, 24, 28 -> 24, 4."""
    df = table(load_run(standard_run))
    base = row(df, "h1", "tp1-autoregressive")
    assert base["tok_s_mean"] == pytest.approx(12.0)
    assert base["tok_s_std"] == pytest.approx(2.0)  # ddof=0 would give 1.633
    spec = row(df, "h1", "tp1-dflash")
    assert spec["tok_s_mean"] == pytest.approx(24.0)
    assert spec["tok_s_std"] == pytest.approx(4.0)
    assert spec["n"] == 3


def test_failed_requests_counted_as_errors_not_samples(standard_run: Path) -> None:
    """The ok=false request (50 tok/s) counts in `errors`, not in n or the mean."""
    base = row(table(load_run(standard_run)), "h1", "tp1-autoregressive")
    assert base["n"] == 3
    assert base["errors"] == 1
    assert base["tok_s_mean"] == pytest.approx(12.0)  # with the failed one it would be 21.5
    assert base["status"] == "ok"


def test_accept_length_mean_for_spec_empty_for_baseline(standard_run: Path) -> None:
    """Spec rows average accept_length over ok requests (3, 3.5, 4 -> 3.5); the baseline's is empty."""
    df = table(load_run(standard_run))
    assert row(df, "h1", "tp1-dflash")["accept_length_mean"] == pytest.approx(3.5)
    assert is_empty(row(df, "h1", "tp1-autoregressive")["accept_length_mean"])


# ---------------------------------------------------------------------------------------------------------------
# Speedup and its interval
# ---------------------------------------------------------------------------------------------------------------

def test_speedup_is_ratio_to_baseline_and_one_for_baseline(standard_run: Path) -> None:
    """speedup = 24 / 12 = 2 for the spec row; exactly 1.0 for the baseline row."""
    df = table(load_run(standard_run))
    assert row(df, "h1", "tp1-dflash")["speedup"] == pytest.approx(2.0)
    assert row(df, "h1", "tp1-autoregressive")["speedup"] == pytest.approx(1.0)


def test_speedup_empty_without_ok_baseline(standard_run: Path) -> None:
    """No baseline for the cell (c4 only in dflash; h2's baseline failed): speedup and CI are blank,
    and another host's baseline is never borrowed."""
    df = table(load_run(standard_run))
    for r in (row(df, "h1", "tp1-dflash", concurrency=4), row(df, "h2", "tp1-ngram")):
        assert r["status"] == "ok"
        assert r["tok_s_mean"] == pytest.approx(32.0 if r["host"] == "h1" else 15.0)
        assert is_empty(r["speedup"]), r.to_dict()
        assert is_empty(r["speedup_ci_low"]) and is_empty(r["speedup_ci_high"])


@pytest.mark.parametrize("differs", [None, "host", "engine", "model", "tp", "workload", "max_tokens",
                                     "context_tokens", "concurrency"])
def test_speedup_pairs_only_the_same_cell(tmp_path: Path, differs: Optional[str]) -> None:
    """The baseline is matched on host, engine, model, tp, workload, max_tokens, context_tokens and
    concurrency: changing any one of them in the spec config leaves it without a baseline."""
    run_dir = make_run(tmp_path)
    make_config(run_dir, "h1", "tp1-autoregressive", method="autoregressive", cells=[cell()],
                samples={FIB: [10.0, 12.0, 14.0]})
    key = {"workload": "fib", "max_tokens": MAX_TOKENS, "context_tokens": 0, "concurrency": 1}
    other = {"workload": "qsort", "max_tokens": 256, "context_tokens": 512, "concurrency": 4}
    if differs in key:
        key[differs] = other[differs]
    spec_cell = (key["workload"], key["max_tokens"], key["context_tokens"], key["concurrency"])
    make_config(run_dir, "h2" if differs == "host" else "h1", "tp2-dflash" if differs == "tp" else "tp1-dflash",
                method="dflash", method_params={"num_speculative_tokens": 4}, cells=[cell(**key)],
                samples={spec_cell: [20.0, 24.0, 28.0]}, tp=2 if differs == "tp" else 1,
                engine="sglang" if differs == "engine" else ENGINE,
                model="meta-llama/Llama-3.1-8B" if differs == "model" else MODEL)
    df = table(load_run(run_dir))
    spec = df[df["method"] == "dflash"]
    assert len(spec) == 1
    if differs is None:
        assert spec.iloc[0]["speedup"] == pytest.approx(2.0)
    else:
        assert is_empty(spec.iloc[0]["speedup"]), f"paired across different {differs}"


def test_speedup_ci_hand_checked_equal_relative_errors(standard_run: Path) -> None:
    """Spec 20/24/28 vs baseline 10/12/14: both relative variances are 1/108, so Welch df is exactly 4,
    se(log ratio) = sqrt(1/54), and the 95% interval is 2·exp(±t(0.975, 4)·sqrt(1/54))."""
    r = row(table(load_run(standard_run)), "h1", "tp1-dflash")
    t4 = 2.7764451051977987  # Student t 0.975 quantile, 4 degrees of freedom
    assert stats.t.ppf(0.975, 4) == pytest.approx(t4)
    half = t4 * math.sqrt(1 / 54)
    assert r["speedup_ci_low"] == pytest.approx(2.0 * math.exp(-half), rel=1e-9)
    assert r["speedup_ci_high"] == pytest.approx(2.0 * math.exp(half), rel=1e-9)


def test_speedup_ci_welch_unequal_samples(tmp_path: Path) -> None:
    """Unequal sizes and spreads (spec n=5, baseline n=3): interval matches an independent computation
    with Welch–Satterthwaite df, is reproducible call to call, and brackets the speedup."""
    spec_tok = [40.0, 44.0, 47.0, 52.0, 61.0]
    base_tok = [20.0, 21.0, 25.0]
    run_dir = make_run(tmp_path)
    make_config(run_dir, "h1", "tp1-autoregressive", method="autoregressive", cells=[cell()],
                samples={FIB: base_tok})
    make_config(run_dir, "h1", "tp1-ddtree-b16", method="ddtree", method_params={"budget": 16}, cells=[cell()],
                samples={FIB: spec_tok}, accept=[4.0] * 5)
    first = row(table(load_run(run_dir)), "h1", "tp1-ddtree-b16")
    second = row(table(load_run(run_dir)), "h1", "tp1-ddtree-b16")
    lo, hi = expected_log_ratio_ci(spec_tok, base_tok)
    speedup = (sum(spec_tok) / 5) / (sum(base_tok) / 3)  # 48.8 / 22
    assert first["speedup"] == pytest.approx(speedup)
    assert first["speedup_ci_low"] == pytest.approx(lo, rel=1e-9)
    assert first["speedup_ci_high"] == pytest.approx(hi, rel=1e-9)
    assert (first["speedup_ci_low"], first["speedup_ci_high"]) == (second["speedup_ci_low"],
                                                                   second["speedup_ci_high"])
    assert first["speedup_ci_low"] < first["speedup"] < first["speedup_ci_high"]


# ---------------------------------------------------------------------------------------------------------------
# Failed and skipped configs
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("host", "config_id", "reason", "workloads"), [
    ("h1", "tp1-ddtree-b16", "crashed", ["fib", "qsort"]),
    ("h2", "tp1-autoregressive", "oom", ["fib"]),
    ("h2", "tp1-dflash", "baseline_failed", ["fib"]),
])
def test_failed_and_skipped_configs_get_a_row_per_cell(standard_run: Path, host: str, config_id: str,
                                                       reason: str, workloads: list[str]) -> None:
    """One row per config.json cell, status = the reason, empty numbers."""
    df = table(load_run(standard_run))
    rows = df[(df["host"] == host) & (df["config_id"] == config_id)]
    assert sorted(rows["workload"]) == sorted(workloads)
    assert set(rows["status"]) == {reason}
    assert set(rows["max_tokens"]) == {MAX_TOKENS}
    for col in ("tok_s_mean", "tok_s_std", "speedup", "speedup_ci_low", "speedup_ci_high", "accept_length_mean"):
        assert all(is_empty(v) for v in rows[col]), f"{col} should be empty for a {reason} config"


def test_table_has_one_row_per_config_and_cell(standard_run: Path) -> None:
    """2 (h1 baseline, dflash fib) + 1 (dflash c4) + 2 (ddtree) + 3 (h2) rows, no duplicates."""
    df = table(load_run(standard_run))
    assert len(df) == 8
    keys = df[["host", "config_id", "workload", "concurrency"]].apply(tuple, axis=1)
    assert keys.is_unique


# ---------------------------------------------------------------------------------------------------------------
# Damaged results
# ---------------------------------------------------------------------------------------------------------------

def test_malformed_request_lines_reported_and_skipped(tmp_path: Path) -> None:
    """Truncated JSON (line 3), a missing field (line 4) and tp "1" (line 5) are reported with path:line and
    skipped; the good lines 1, 2 and 6 still count."""
    run_dir = make_run(tmp_path)
    good = {"host": "h1", "config_id": "tp1-autoregressive", "method": "autoregressive", "method_params": {},
            "tp": 1, "workload": "fib", "max_tokens": MAX_TOKENS, "context_tokens": 0, "concurrency": 1,
            "prompt_tokens": 100, "completion_tokens": 128, "ttft_s": 0.05, "e2e_s": 1.0,
            "accept_length": None, "ok": True, "error": None}
    missing = {k: v for k, v in good.items() if k != "workload"}
    lines = [json.dumps({**good, "rep": 0, "output_tok_s": 10.0}),
             json.dumps({**good, "rep": 1, "output_tok_s": 12.0}),
             json.dumps({**good, "rep": 2, "output_tok_s": 99.0})[:40],
             json.dumps({**missing, "rep": 3, "output_tok_s": 99.0}),
             json.dumps({**good, "rep": 4, "output_tok_s": 99.0, "tp": "1"}),
             json.dumps({**good, "rep": 5, "output_tok_s": 14.0})]
    d = make_config(run_dir, "h1", "tp1-autoregressive", method="autoregressive", cells=[cell()],
                    extra_lines=lines)
    run = load_run(run_dir)
    jsonl = d / "requests.jsonl"
    for n in (3, 4, 5):
        assert any(f"{jsonl}:{n}" in p for p in run.problems), (n, run.problems)
    assert not any(f"{jsonl}:{n}:" in p for p in run.problems for n in (1, 2, 6))
    assert any("requests.jsonl:5" in p and "tp" in p for p in run.problems)
    assert any("requests.jsonl:4" in p and "workload" in p for p in run.problems)
    r = row(table(run), "h1", "tp1-autoregressive")
    assert r["n"] == 3
    assert r["tok_s_mean"] == pytest.approx(12.0)
    assert r["tok_s_std"] == pytest.approx(2.0)


def test_config_without_status_json_reported_and_skipped(standard_run: Path) -> None:
    """A config folder with no status.json (interrupted) is reported with its path and left out."""
    d = make_config(standard_run, "h1", "tp1-ngram", method="ngram", method_params={"num_speculative_tokens": 3},
                    cells=[cell()], samples={FIB: [11.0, 11.0]})
    (d / "status.json").unlink()
    run = load_run(standard_run)
    assert any(str(d) in p and "status.json" in p for p in run.problems), run.problems
    df = table(run)
    assert "tp1-ngram" not in set(df[df["host"] == "h1"]["config_id"])
    assert row(df, "h1", "tp1-dflash")["speedup"] == pytest.approx(2.0)  # the rest is untouched


# ---------------------------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------------------------

def test_cli_csv_has_contract_columns_and_values(standard_run: Path) -> None:
    """`python -m collector report DIR --format csv` in a subprocess: every contract column, the known values,
    and blank cells for a failed config."""
    res = subprocess.run([sys.executable, "-m", "collector", "report", str(standard_run), "--format", "csv"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    records = list(csv.DictReader(io.StringIO(res.stdout)))
    header = next(csv.reader(io.StringIO(res.stdout)))
    missing = [c for c in CONTRACT_COLUMNS if c not in header]
    assert not missing, f"CSV header lacks {missing}: {header}"
    by = {(r["host"], r["config_id"], r["workload"], r["concurrency"]): r for r in records}
    spec = by[("h1", "tp1-dflash", "fib", "1")]
    assert float(spec["tok_s_mean"]) == pytest.approx(24.0)
    assert float(spec["speedup"]) == pytest.approx(2.0)
    assert spec["engine"] == ENGINE and spec["model"] == MODEL
    crashed = by[("h1", "tp1-ddtree-b16", "qsort", "1")]
    assert crashed["status"] == "crashed"
    assert crashed["tok_s_mean"] == "" and crashed["speedup"] == ""


def test_cli_json_parses(standard_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`report --format json`: valid JSON with the rows; blanks are null."""
    assert collector_main(["report", str(standard_run), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {(r["host"], r["config_id"], r["workload"], r["concurrency"]): r for r in doc["rows"]}
    assert rows[("h1", "tp1-autoregressive", "fib", 1)]["tok_s_mean"] == pytest.approx(12.0)
    assert rows[("h2", "tp1-dflash", "fib", 1)]["status"] == "baseline_failed"
    assert rows[("h2", "tp1-dflash", "fib", 1)]["speedup"] is None
    assert doc["run"]["run_id"] == "run1"


def test_cli_md_has_hand_run_lines(standard_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`report --format md` prints `fib: 12.0 ± 2.0 tok/s` for the baseline and the reason for a crash."""
    assert collector_main(["report", str(standard_run), "--format", "md"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\s*fib: 12\.0 ± 2\.0 tok/s", out, re.MULTILINE), out
    assert re.search(r"^\s*fib: 24\.0 ± 4\.0 tok/s", out, re.MULTILINE), out
    assert re.search(r"^\s*qsort: crashed$", out, re.MULTILINE), out


def test_cli_survives_damaged_results(standard_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Malformed lines and a config without status.json: every format still renders and lists the problems."""
    d = standard_run / "h1" / "tp1-autoregressive"
    with (d / "requests.jsonl").open("a") as f:
        f.write('{"host": "h1", "config_id": "tp1-aut\n')
    (standard_run / "h1" / "tp1-partial").mkdir()
    for fmt in ("md", "csv", "json"):
        assert collector_main(["report", str(standard_run), "--format", fmt]) == 0
        captured = capsys.readouterr()
        assert "requests.jsonl:5" in captured.err  # 3 ok + 1 failed request, then the truncated line
        assert "tp1-partial" in captured.err
    doc_rows = json.loads(captured.out)["rows"]
    assert any(r["config_id"] == "tp1-autoregressive" and r["n"] == 3 for r in doc_rows)


def test_md_survives_failed_config_with_unreadable_config_json(standard_run: Path) -> None:
    """The loader tolerates a corrupt config.json (reported, treated as {}); the md report must still render."""
    d = standard_run / "h1" / "tp1-ddtree-b16"
    (d / "config.json").write_text('{"engine": "vllm", "cells": [')  # truncated while being written
    run = load_run(standard_run)
    assert any(str(d / "config.json") in p for p in run.problems)
    out = render(run, "md")
    assert "crashed" in out

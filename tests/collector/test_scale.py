"""The collector at scale: the fast reader (msgspec, pieces of the file, several processes) keeps and reports
exactly what the plain reader (json.loads + records.request_problem, line by line) does; the summaries worked out
by column equal what the report works out from the lines; the markdown and JSON writers print what tabulate and
json.dumps print. Expected problems and figures are written out by hand where a test names them.
"""
from __future__ import annotations

import importlib.util
import json
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from scipy import stats

import collector.request_lines as request_lines
from agent import records
from collector.load import load_run
from collector.mdtable import pipe_rows, pipe_table
from collector.outputs.json import dumps_indented
from collector.report import render
from collector.results import Run
from collector.stats import mean_std, t_quantile
from collector.tables.pack_check import pack_check
from collector.tables.speedup import bursts, table
from tests.collector.test_bad_results import BASE, NGRAM, write_run

REPO = Path(__file__).resolve().parents[2]
FORMATS = ("md", "csv", "json")


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")[:-1]


def put_lines(path: Path, lines: list[bytes], end: bytes = b"\n") -> None:
    path.write_bytes(end.join(lines) + end)


def dump(row: dict[str, Any], **kw: Any) -> bytes:
    return json.dumps(row, **kw).encode()


def plain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(request_lines, "msgspec", None)


def both(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Run, Run]:
    """The run read the fast way (small pieces, so that lines fall on both sides of a cut) and the plain way."""
    pytest.importorskip("msgspec")
    with monkeypatch.context() as m:
        m.setattr(request_lines, "CHUNK_BYTES", 700)
        fast = load_run(run_dir)
    with monkeypatch.context() as m:
        plain(m)
        slow = load_run(run_dir)
    return fast, slow


def assert_same_reports(a: Run, b: Run) -> None:
    assert a.problems == b.problems
    for fmt in FORMATS:
        assert render(a, fmt) == render(b, fmt), fmt


# Lines appended to h1's ngram file (its 6 good lines stay): each breaks a different check, the fifth one only the
# plain check makes. Each: what the line is, the problem named.
def damages(row: dict[str, Any]) -> list[tuple[bytes, str]]:
    return [
        (dump(row)[:40], "malformed JSON (Unterminated string starting at, column 38)"),
        (dump({**row, "tp": "1"}), "field 'tp' should be an integer, got '1'"),
        (dump({**row, "max_tokens": 64.0}), "field 'max_tokens' should be an integer, got 64.0"),
        (dump({**row, "ttft_s": float("nan")}), "field 'ttft_s' should be a finite number or null, got nan"),
        (dump({**row, "ok": True, "output_tok_s": None}), "ok request without output_tok_s"),
        (dump({**row, "config_id": "tp1-other"}), "config_id 'tp1-other' is not its folder's ('tp1-ngram-k2')"),
    ]


def test_fast_and_plain_readers_skip_and_name_the_same_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Six damaged lines after six good ones (each damage a different check, one only the plain check makes):
    both readers name them with the same words at lines 7 to 12, keep the six good ones, and every figure of
    every report format is the same."""
    run_dir = write_run(tmp_path)
    path = run_dir / "h1" / NGRAM / "requests.jsonl"
    lines = lines_of(path)
    bad = damages(json.loads(lines[0]))
    put_lines(path, lines + [line for line, _ in bad])
    fast, slow = both(run_dir, monkeypatch)
    assert fast.problems == [f"{path}:{n}: {why}; line skipped" for n, (_, why) in enumerate(bad, 7)]
    assert_same_reports(fast, slow)
    df = table(fast)
    ngram = df[(df["host"] == "h1") & (df["config_id"] == NGRAM)].set_index("workload")
    assert ngram["n"].to_dict() == {"fib": 3, "json": 3}
    assert ngram["tok_s_mean"].to_dict() == pytest.approx({"fib": 18.0, "json": 33.0})


def test_lines_only_the_plain_reader_reads_are_kept_as_it_keeps_them(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Valid lines msgspec refuses (an integer past 64 bits, NaN in a field outside the contract, an escaped lone
    surrogate, \\r\\n line ends), blank lines, a byte-order mark and a line of two objects: kept, skipped or
    named exactly as the plain reader does, at the same line numbers."""
    run_dir = write_run(tmp_path)
    path = run_dir / "h1" / BASE / "requests.jsonl"
    lines = lines_of(path)
    lines[0] = dump({**json.loads(lines[0]), "rep": 10 ** 30})  # valid: rep is any integer
    lines[1] = lines[1][:-1] + b', "extra": NaN}'  # valid: fields outside the contract are not checked
    lines[2] = dump({**json.loads(lines[2]), "note": "\ud800"})  # valid: json reads the escape
    lines[3:3] = [b"", b"   "]  # blank: skipped, not named
    lines[5] = b"\xef\xbb\xbf" + lines[5]  # json rep 1 (22 tok/s) behind a byte-order mark
    lines.append(lines[-1] + b" " + lines[-1])  # two objects on one line
    put_lines(path, lines, b"\r\n")
    fast, slow = both(run_dir, monkeypatch)
    assert fast.problems == [
        f"{path}:6: malformed JSON (Unexpected UTF-8 BOM (decode using utf-8-sig), column 1); line skipped",
        f"{path}:9: malformed JSON (Extra data, column {len(lines[-2]) + 2}); line skipped"]
    assert_same_reports(fast, slow)
    df = table(fast).query("host == 'h1' and config_id == @BASE").set_index("workload")
    assert df["n"].to_dict() == {"fib": 3, "json": 2}
    assert df["tok_s_mean"].to_dict() == pytest.approx({"fib": 12.0, "json": 22.0})  # json: 20 and 24


@pytest.mark.parametrize("breaker", [b"\x0b", b"\x0c", b"\x1c", "\u2028".encode(), "\u0085".encode()])
def test_a_file_with_other_line_breaks_is_numbered_as_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            breaker: bytes) -> None:
    """str.splitlines() breaks lines at \\v, \\f, \\x1c and U+2028 too: such a file is read the plain way, so the
    lines after the break keep the numbers they always had."""
    run_dir = write_run(tmp_path)
    path = run_dir / "h2" / NGRAM / "requests.jsonl"
    lines = lines_of(path)
    lines[1] = lines[1][:30] + breaker + lines[1][30:]
    lines[4] = lines[4][:-1] + b', "x": "' + breaker + b'"}' if breaker[0] > 127 else lines[4]
    put_lines(path, lines)
    fast, slow = both(run_dir, monkeypatch)
    assert [p.split(": ")[0].rsplit(":", 1)[1] for p in fast.problems] == (["2", "3"] if breaker[0] < 127 else
                                                                            ["2", "3", "6", "7"])
    assert_same_reports(fast, slow)


def test_many_processes_read_what_one_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Above PARALLEL_BYTES the files are read by other processes: the same problems, in the same order, and
    the same reports, as in this process."""
    run_dir = write_run(tmp_path)
    path = run_dir / "h2" / BASE / "requests.jsonl"
    lines = lines_of(path)
    lines[2] = b'{"host": "h2"'
    put_lines(path, lines)
    (run_dir / "h1" / NGRAM / "requests.jsonl").write_text("")
    here = load_run(run_dir)
    monkeypatch.setattr(request_lines, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(request_lines, "CHUNK_BYTES", 300)
    seen: list[str] = []
    there = load_run(run_dir, meanwhile=lambda: seen.append("ran"))
    assert seen == ["ran"]
    assert there.problems == here.problems == [
        f"{run_dir / 'h1' / NGRAM / 'requests.jsonl'}: empty, though status.json says ok; its cells have no data",
        f"{path}:3: malformed JSON (Expecting ',' delimiter, column 14); line skipped"]
    assert_same_reports(there, here)


def test_the_request_lines_are_still_there_to_read(tmp_path: Path) -> None:
    """ConfigResult.requests reads the valid lines again, for code that wants them whole."""
    run_dir = write_run(tmp_path)
    (c,) = [c for c in load_run(run_dir).configs if c.host == "h1" and c.config_id == BASE]
    assert [(r["workload"], r["rep"], r["output_tok_s"]) for r in c.requests] == [
        ("fib", 0, 10.0), ("json", 0, 20.0), ("fib", 1, 12.0), ("json", 1, 22.0), ("fib", 2, 14.0), ("json", 2, 24.0)]
    assert c.count == 6 and c.first is not None and c.first["rep"] == 0


# ---------------------------------------------------------------------------------------------------------------
# Bursts and the figures of a cell, by column
# ---------------------------------------------------------------------------------------------------------------

def test_cell_figures_by_column_equal_the_reports_own(tmp_path: Path) -> None:
    """Random rows (reps interleaved across cells, closed and open loop, failed requests, rows without send times, a
    burst whose span is zero, accept lengths and TPOT on some rows only): every cell's n, mean and std of tok/s,
    mean accept length, TTFT and TPOT, the bursts' mean and std, and its serving figures (percentiles, requests
    within limits, goodput, achieved rate, send lag), exactly as worked out from the lines themselves."""
    rng = random.Random(7)
    cells = [("fib", 64, 0, 1, None), ("fib", 64, 0, 4, None), ("json", 128, 512, 2, None), ("fib", 64, 0, 0, 2),
             ("fib", 64, 0, 0, "inf")]
    rows = []
    for rep in range(12):
        for w, mt, ctx, conc, rate in rng.sample(cells, len(cells)):
            t0 = rep * 100.0
            for slot in range(conc or 3):
                ok = rng.random() > 0.08
                timed = rng.random() > 0.05
                due = t0 + (0.0 if rate in (None, "inf") else slot / rate)
                sent = due + rng.uniform(0, 0.2)
                row = {"host": "h", "config_id": "c", "method": "m", "method_params": {}, "tp": 1,
                       "workload": w, "max_tokens": mt, "context_tokens": ctx, "concurrency": conc,
                       "rep": rep, "ok": ok, "output_tok_s": rng.uniform(5, 50) if ok else None,
                       "completion_tokens": mt if ok else None,
                       "tpot_s": rng.uniform(0.01, 0.1) if rng.random() > 0.3 else None,
                       "accept_length": rng.uniform(1, 5) if rng.random() > 0.5 else None,
                       "ttft_s": rng.uniform(0.01, 1) if ok else None, "e2e_s": rng.uniform(1, 9) if ok else None,
                       "chunk_gap_max_s": rng.uniform(0.01, 0.5) if ok and rng.random() > 0.2 else None,
                       **({"sent_s": sent, "done_s": t0 + (rng.uniform(1, 9) if rep else 0.0)} if timed else {})}
                if rate is not None:
                    row.update(request_rate=rate, scheduled_s=due)
                rows.append(row)
    path = tmp_path / "c" / "requests.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = {c.key: c for c in request_lines.read_cells(path).cells}
    assert list(got) == list(dict.fromkeys(records.cell_key(r) for r in rows))
    assert (*cells[-1][:4], math.inf) in got
    slo = {"ttft_ms": 500, "itl_ms": 300, "e2e_ms": 7000}
    for key, c in got.items():
        mine = [r for r in rows if records.cell_key(r) == key]
        oks = [r for r in mine if r["ok"]]
        tok = [r["output_tok_s"] for r in oks]
        assert (c.n_total, c.errors) == (len(mine), len(mine) - len(oks))
        assert c.tok == (len(tok), *mean_std(tok))
        for attr, name in (("acc_mean", "accept_length"), ("ttft_mean", "ttft_s"), ("tpot_mean", "tpot_s")):
            have = [r[name] for r in oks if r.get(name) is not None]
            assert getattr(c, attr) == (sum(have) / len(have) if have else None), attr
        if key[3] > 1 or key[4] is not None:
            want = bursts(mine)
            assert want, "the data should hold whole bursts"
            assert c.bursts == (len(want), *mean_std(want))
        else:
            assert c.bursts == (0, None, None)
        served = c.serving
        assert served is not None
        for name in ("ttft", "tpot", "e2e"):
            have = [r[f"{name}_s"] for r in oks if r.get(f"{name}_s") is not None]
            assert served.percentiles(name) == pytest.approx(tuple(np.percentile(have, (50, 90, 99))))
        within = [r for r in oks if r["ttft_s"] <= 0.5 and r["e2e_s"] <= 7 and (r.get("chunk_gap_max_s") is None
                                                                              or r["chunk_gap_max_s"] <= 0.3)]
        assert served.share(slo) == pytest.approx(len(within) / len(mine))
        good = []
        for rep in sorted({r["rep"] for r in mine}):
            timed = [r for r in mine if r["rep"] == rep and "sent_s" in r]
            span = max(r["done_s"] for r in timed) - min(r["sent_s"] for r in timed) if timed else 0
            if span > 0:
                good.append(sum(r["completion_tokens"] for r in within if r["rep"] == rep) / span)
        assert served.goodput(slo)[1] == pytest.approx((len(good), *mean_std(good)), nan_ok=True)
        if key[4] is None:
            assert served.achieved == [] and served.late() is None
        else:
            lags = [r["sent_s"] - r["scheduled_s"] for r in mine if "sent_s" in r]
            assert served.late() == pytest.approx(float(np.percentile(lags, 99)))


# ---------------------------------------------------------------------------------------------------------------
# Writers
# ---------------------------------------------------------------------------------------------------------------

CELLS = ["", " ", "gpu1", "12", "-3", "007", "1.50", "-0.25", "1e5", "inf", "nan", "True", "1,000", " 12 ", "±",
         "36.0 ± 6.0 (n=3)", "2.25 [1.54, 3.28]", "1.", ".5", "+1", "9" * 320 + ".5", "1" * 5000, "faster"]


def test_pipe_table_prints_what_to_markdown_prints() -> None:
    """Random frames of strings, ints, floats, None, NaN and pd.NA (Int64 columns too), several float formats:
    the same text as DataFrame.to_markdown; and a table written out by hand."""
    rng = random.Random(3)
    values = {"s": lambda: rng.choice(CELLS), "i": lambda: rng.choice([0, 1, -5, 10 ** 20]),
              "f": lambda: rng.choice([0.0, 1.5, -2.25, 1e-7, 123456789.123, float("nan"), float("inf")]),
              "n": lambda: None}
    for _ in range(400):
        data = {f"c{c}" + "x" * rng.randint(0, 9): [values[rng.choice(kinds)]() for _ in range(rng.randint(1, 5))]
                for c, kinds in enumerate(rng.choice(["s", "i", "f", "sn", "in", "fn", "sif"]) for _ in range(4))}
        n = min(map(len, data.values()))
        df = pd.DataFrame({k: v[:n] for k, v in data.items()})
        if rng.random() < 0.3:
            df[df.columns[0]] = pd.array([rng.choice([1, None]) for _ in range(n)], dtype="Int64")
        fmt = rng.choice(["g", ".2f", ".1f"])
        assert pipe_table(df, fmt) == df.to_markdown(index=False, floatfmt=fmt)
    # tabulate's rules, by hand: numbers right-aligned and re-read ("12.30" prints as 12.3); a column holding
    # pd.NA is a column of strings, left-aligned; every column at least two wider than its header
    df = pd.DataFrame({"host": ["h1", "h2"], "n": pd.array([3, 12], dtype="Int64"), "tok": ["12.30", ""]})
    assert pipe_table(df) == ("| host   |   n |   tok |\n|:-------|----:|------:|\n| h1     |   3 |  12.3 |\n"
                              "| h2     |  12 |       |")
    df["n"] = pd.array([3, None], dtype="Int64")
    assert pipe_table(df) == ("| host   | n    |   tok |\n|:-------|:-----|------:|\n| h1     | 3    |  12.3 |\n"
                              "| h2     | <NA> |       |")


def test_pipe_rows_prints_what_a_frame_of_the_rows_prints() -> None:
    rng = random.Random(4)
    for _ in range(200):
        keys = rng.sample(["budget", "config_id", "tok/s", "÷ tp1-a", "status"], rng.randint(1, 5))
        rows = [{k: rng.choice(CELLS[:18]) for k in keys} for _ in range(rng.randint(1, 4))]
        assert pipe_rows(rows) == pd.DataFrame(rows).to_markdown(index=False)


def test_dumps_indented_is_json_dumps_indent_2() -> None:
    rng = random.Random(5)

    def scalar() -> Any:
        return rng.choice([None, True, 0, -3, 10 ** 20, 1.5, float("nan"), 1e16, 1e-7, "", "é±\u2028", 'a"b\\\n'])
    for _ in range(500):
        doc: dict[str, Any] = {}
        for k in range(rng.randint(0, 4)):
            kind = rng.random()
            doc[f"k{k}"] = ([{f"f{i}": scalar() for i in range(rng.randint(0, 3))} for _ in range(rng.randint(0, 3))]
                            if kind < 0.5 else {"x": [1, {"y": []}, {}], "s": scalar()} if kind < 0.7 else
                            [scalar() for _ in range(rng.randint(0, 3))] if kind < 0.9 else scalar())
        assert dumps_indented(doc) == json.dumps(doc, indent=2)


def test_t_quantile_is_scipy_stats_t_ppf() -> None:
    for df in (1.0, 2.5, 4.0, 7.3, 30.0, 1234.5, 1e6):
        assert t_quantile(0.975, df) == float(stats.t.ppf(0.975, df))
    assert t_quantile(0.975, 4.0) == pytest.approx(2.7764451051977987, rel=1e-15)


# ---------------------------------------------------------------------------------------------------------------
# The scale benchmark's run
# ---------------------------------------------------------------------------------------------------------------

def test_the_scale_benchmark_builds_a_valid_run_of_the_rows_asked(tmp_path: Path) -> None:
    """benchmarks/report_scale.py: exactly --rows request lines, every one valid but the --damaged ones, each
    named; one failed config; config.json's repetitions add up to its lines."""
    spec = importlib.util.spec_from_file_location("report_scale", REPO / "benchmarks" / "report_scale.py")
    assert spec is not None and spec.loader is not None
    report_scale = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report_scale)
    facts = report_scale.build(tmp_path / "run-scale", rows=13_001, damaged=3)
    assert (facts["rows"], facts["damaged"], facts["configs"], facts["cells"]) == (13_001, 3, 24, 144)
    run = load_run(tmp_path / "run-scale")
    assert sum(c.count for c in run.configs) == 13_001
    assert len(run.problems) == 3 and all("line skipped" in p for p in run.problems)
    for c in run.configs:
        planned = sum(cell["repetitions"] * cell["concurrency"] for cell in c.config["cells"])
        assert (c.status["status"], c.count) == (("failed", 0) if c.config_id == report_scale.FAILED
                                                 else ("ok", planned))


def test_the_scale_benchmarks_packed_run_has_its_pack_checks(tmp_path: Path) -> None:
    """--packed: each phase's pack check has pack_check_of and no table row; every other config but the
    baselines is flagged packed; the pack checks' section has one row per cell of each (3 phases x 144)."""
    spec = importlib.util.spec_from_file_location("report_scale", REPO / "benchmarks" / "report_scale.py")
    assert spec is not None and spec.loader is not None
    report_scale = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report_scale)
    report_scale.build(tmp_path / "run-packed", rows=2 * 26 * 540, damaged=0, packed=True)  # every cell twice
    run = load_run(tmp_path / "run-packed")
    df = table(run)
    assert not any(cid.endswith("-packed") for cid in df["config_id"])
    flagged = {cid for cid, flags in zip(df["config_id"], df["flags"]) if "packed" in flags}
    assert flagged == {c.config_id for c in run.configs
                       if c.config["method"] != "autoregressive" and c.status["status"] == "ok"}
    checked = pack_check(run)
    assert len(checked) == 3 * 144 and set(checked["baseline_config_id"]) == {
        "tp1-autoregressive", "tp2-autoregressive", "tp4-autoregressive"}
    assert (checked["alone_n"] > 0).all() and (checked["packed_n"] > 0).all()

"""The history store and `specfleet history`, on runs with known trends: request lines written the way the agent
writes them (configs from `matrix.expand`, rows through `records.request_row`, files through the agent's `record`),
each run's tok/s set exactly, the host's engine build and the suite's server arguments changed at known runs.

What the store must hold (every run's cells, configs, hosts and request rows, keyed by run, host and config
digest), when it reads a run again (only when one of its files changed), what an update that fails leaves (the
store as it was), and what history says: each figure with its interval, the changes between consecutive runs, and
the runs whose interval lies outside the spread of the previous ones."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import duckdb
import pytest

from agent import records
from agent.config_run import Host, Result, fresh_folder, record
from agent.engines import ENGINES
from agent.records import Outcome
from agent.store import HostStore, write_json
from collector import history, store, store_rows, store_update
from collector.__main__ import main as collector_main
from collector.history import Filters

HOST, TOKENS, REPS = "cpu1", 64, 4
SPREAD = (0.99, 1.0, 1.01, 1.0)  # each repetition: the run's tok/s × these
# Each run: the baseline's tok/s, the n-gram config's ratio to it, the engine's commit, extra server arguments.
BASE = [100.0, 101.0, 99.0, 100.0, 100.0, 80.0, 80.0, 100.0]  # run 5 falls: outside; run 6 is like run 5
RATIO = [1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 1.2]  # run 7: the n-gram config's speedup falls
COMMIT = ["a1b2c3d4e5f6a7b8"] * 4 + ["d4e5f6a7b8c9d0e1"] * 4  # the engine bump at run 4
ARGS: list[list[str]] = [[]] * 6 + [["--max-num-seqs", "8"]] * 2  # a changed engine flag at run 6


def suite(extra_args: list[str]) -> dict[str, Any]:
    return {"suite_name": "history", "engine": "vllm", "engine_python": "/opt/vllm/bin/python",
            "model": {"name": "tiny", "path": "/models/tiny"}, "repetitions": REPS, "server_args": extra_args,
            "phases": [{"name": "tp1", "configs": [{"method": "autoregressive"},
                                                   {"method": "ngram", "num_speculative_tokens": 2}],
                        "sweeps": [{"name": "short", "workloads": ["fib", "qsort"], "max_tokens": [TOKENS],
                                    "concurrency": [1]}]}]}


def _rows(identity: dict[str, Any], cell: dict[str, Any], tok_s: float, accept: Optional[float]) -> list[dict]:
    out = []
    for rep, s in enumerate(SPREAD):
        e2e = TOKENS / (tok_s * s)
        out.append(records.request_row(identity, cell, rep, {
            "slot": 0, "prompt_tokens": 10, "completion_tokens": TOKENS, "ttft_s": 0.05, "e2e_s": e2e,
            "output_tok_s": TOKENS / e2e, "tpot_s": (e2e - 0.05) / (TOKENS - 1),
            "accept_length": accept * s if accept else None,
            "ok": True, "error": None, "sent_s": rep * 10.0, "done_s": rep * 10.0 + e2e}))
    return out


def write_run(results: Path, i: int, base: float = 0.0, ratio: float = 0.0, commit: str = "",
              args: Optional[list[str]] = None, driver: str = "580.65") -> Path:
    """Run `run-0i`, measured on 2026-11-(i+1): run i of BASE/RATIO/COMMIT/ARGS unless given."""
    base, ratio = base or BASE[i], ratio or RATIO[i]
    commit, args = commit or COMMIT[i], ARGS[i] if args is None else args
    run_dir = results / f"run-{i:02d}"
    st = HostStore(run_dir, HOST)
    host = Host(suite=suite(args), engine=ENGINES["vllm"], store=st, engine_info={"version": "0.20.0"})
    write_json(st.dir / "host.json", {"host": HOST, "gpus": {"count": 1, "driver_version": driver, "devices": [
        {"name": "NVIDIA H100", "memory_total_mib": 81559}]}, "engine": {
        "distribution": "vllm", "version": "0.20.0", "build": {"commit": commit, "ref": "main", "patches": []}}})
    when = f"2026-11-{i + 1:02d}T10:00:00.000+00:00"
    for cfg in __import__("controller.matrix", fromlist=["expand"]).expand(suite(args)):
        folder = fresh_folder(st, cfg["config_id"])
        identity = {"host": HOST, "config_id": cfg["config_id"], "method": cfg["method"],
                    "method_params": cfg["method_params"], "tp": cfg["tp"], "engine": cfg["engine"],
                    "model": cfg["model"]["name"], "phase": cfg["phase"]}
        spec = cfg["method"] != "autoregressive"
        rows = [r for cell in cfg["cells"]
                for r in _rows(identity, cell, base * (ratio if spec else 1.0), 2.5 if spec else None)]
        record(host, cfg, Result(Outcome.OK, rows=rows, argv=cfg["command"], fields={"ready_s": 1.0}), folder, when)
        status = json.loads((folder / "status.json").read_text())
        write_json(folder / "status.json", {**status, "started_at": when, "finished_at": when})
    write_json(run_dir / "run.json", {"run_id": run_dir.name, "started_at": when, "finished_at": when,
                                      "project_version": "abc1234", "suite": "history", "schema_version": 1,
                                      "hosts": [HOST]})
    return run_dir


@pytest.fixture(scope="module")
def eight(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eight runs of known trends and their store."""
    results = tmp_path_factory.mktemp("history") / "results"
    for i in range(len(BASE)):
        write_run(results, i)
    got = store_update.update(results)
    assert got.new == len(BASE) and got.problems == 0
    return results


def pts(results: Path, **kw: Any) -> list[dict[str, Any]]:
    con = store.connect(results / store.DB_FILE, read_only=True)
    try:
        return history.points(con, Filters(**kw))
    finally:
        con.close()


def test_the_store_holds_every_table_keyed_by_run_host_and_config_digest(eight: Path) -> None:
    con = duckdb.connect(str(eight / store.DB_FILE), read_only=True)
    counts = {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in store.schema()}
    assert counts == {"runs": 8, "hosts": 8, "configs": 16, "cells": 32, "requests": 8 * 2 * 2 * REPS, "problems": 0}
    # the request rows are the lines, figure for figure
    got = con.execute("SELECT output_tok_s FROM requests WHERE run_id = 'run-05' AND config_id = "
                      "'tp1-autoregressive' AND workload = 'fib' ORDER BY rep").fetchall()
    assert [round(r[0], 6) for r in got] == [round(80.0 * s, 6) for s in SPREAD]
    # each config's digest is the one status.json records, and it moves with the server arguments
    digests = dict(con.execute("SELECT run_id, config_digest FROM configs WHERE config_id = 'tp1-ngram-k2'").fetchall())
    assert digests["run-00"] == digests["run-05"] != digests["run-06"] == digests["run-07"]
    assert con.execute("SELECT count(DISTINCT config_digest) FROM cells WHERE config_id = 'tp1-ngram-k2'"
                       ).fetchone()[0] == 2
    env = dict(con.execute("SELECT run_id, engine_commit FROM hosts").fetchall())
    assert env["run-03"] == "a1b2c3d4e5f6 (main)" and env["run-04"] == "d4e5f6a7b8c9 (main)"
    # the cells are the report's table, with the tok/s interval mean ± t·s/√n
    row = con.execute("SELECT n, tok_s_mean, tok_s_std, tok_s_ci_low, tok_s_ci_high, speedup FROM cells WHERE "
                      "run_id = 'run-00' AND config_id = 'tp1-ngram-k2' AND workload = 'fib'").fetchone()
    n, mean, std, lo, hi, speedup = row
    half = 3.182446305284263 * std / math.sqrt(n)  # t(0.975, 3)
    assert n == REPS and mean == pytest.approx(150.0) and speedup == pytest.approx(1.5)
    assert (lo, hi) == (pytest.approx(mean - half), pytest.approx(mean + half))
    # and the acceptance length's, from the request rows (2.5 × SPREAD)
    acc = [2.5 * s for s in SPREAD]
    m = sum(acc) / len(acc)
    sd = math.sqrt(sum((a - m) ** 2 for a in acc) / (len(acc) - 1))
    got = con.execute("SELECT accept_length_mean, accept_length_std, accept_length_ci_low, accept_length_ci_high "
                      "FROM cells WHERE run_id = 'run-00' AND config_id = 'tp1-ngram-k2' AND workload = 'fib'"
                      ).fetchone()
    half = 3.182446305284263 * sd / math.sqrt(len(acc))
    assert got == (pytest.approx(m), pytest.approx(sd), pytest.approx(m - half), pytest.approx(m + half))


def test_a_fall_is_flagged_once_against_the_spread_of_the_previous_runs(eight: Path) -> None:
    got = pts(eight, config="tp1-autoregressive", workload="fib", last=0)
    assert [p["run_id"] for p in got] == [f"run-{i:02d}" for i in range(8)]
    assert [p["tok_s_mean"] for p in got] == pytest.approx(BASE)
    flags = {p["run_id"]: p["outside"] for p in got}
    # run 5 falls to 80 against 99..101: below; run 6 is judged with run 5 in its window (no flag); run 7 comes back
    # to 100, within the window's spread (runs 2..6 hold 80 and 100)
    assert flags == {**{f"run-{i:02d}": [] for i in range(8)}, "run-05": ["tok/s below"]}
    # the n-gram config fell with it: its tok/s is outside, its speedup is not; run 7's speedup falls to 1.2
    spec = {p["run_id"]: p["outside"] for p in pts(eight, config="tp1-ngram-k2", workload="fib", last=0)}
    assert spec["run-05"] == ["tok/s below"]
    assert spec["run-07"] == ["speedup below"]
    assert sum(map(bool, spec.values())) == 2
    # a wider window still holds only what the runs before each one say: run 7's tok/s (120 against 120..150) is
    # inside; with a window of 1, run 6 is judged against run 5 alone: too few runs to judge (MIN_PREVIOUS is 2)
    assert {p["run_id"]: p["outside"] for p in pts(eight, config="tp1-autoregressive", workload="fib",
                                                   last=0, window=1)}["run-05"] == []


def test_changes_between_consecutive_runs_name_the_engine_build_and_the_flag(eight: Path) -> None:
    got = {p["run_id"]: p["changes"] for p in pts(eight, config="tp1-ngram-k2", workload="qsort", last=0)}
    assert got["run-00"] == [] and got["run-01"] == [] and got["run-05"] == []
    assert got["run-04"] == ["vllm a1b2c3d4e5f6 (main) → d4e5f6a7b8c9 (main)"]
    assert got["run-06"] == ["server args: added --max-num-seqs 8"]
    assert got["run-07"] == []
    # the baseline's config changed with the suite's server arguments too
    base = {p["run_id"]: p["changes"] for p in pts(eight, config="tp1-autoregressive", workload="qsort", last=0)}
    assert base["run-06"] == ["server args: added --max-num-seqs 8"]


@pytest.mark.parametrize("before,after,said", [
    (["--enforce-eager"], [], ["server args: removed --enforce-eager"]),
    (["--max-num-seqs", "8"], ["--max-num-seqs", "16"], ["server args: --max-num-seqs 8 → 16"]),
    (["--max-num-seqs=8"], ["--max-num-seqs", "8"], []),
    (["--page-size", "1", "--enforce-eager"], ["--enforce-eager", "--page-size", "1"], []),
    ([], ["--speculative-config", '{"k": 2}'], ['server args: added --speculative-config {"k": 2}']),
])
def test_server_argument_changes_read_flag_by_flag(before: list[str], after: list[str], said: list[str]) -> None:
    p = {"previous_digest": "a", "config_digest": "b", "previous_server_args": json.dumps(before),
         "server_args": json.dumps(after), "previous_env": "{}", "env": "{}", "previous_method_params": "{}",
         "method_params": "{}"}
    got = history.config_changes(p)
    assert got == (said or ["config a → b"])


def test_since_last_and_globs_choose_cells_and_runs(eight: Path) -> None:
    since = pts(eight, config="tp1-*", workload="fib", since=history.since("2026-11-06"), last=0)
    assert {p["run_id"] for p in since} == {"run-05", "run-06", "run-07"}
    assert {p["config_id"] for p in since} == {"tp1-autoregressive", "tp1-ngram-k2"}
    # the flags are worked out over every run, whatever is shown: run 5 is still below
    assert [p["outside"] for p in since if p["run_id"] == "run-05" and p["config_id"] == "tp1-autoregressive"] == [
        ["tok/s below"]]
    last = pts(eight, host="cpu?", config="tp1-ngram-k2", last=3)
    assert [(p["workload"], p["run_id"]) for p in last] == [(w, f"run-{i:02d}") for w in ("fib", "qsort")
                                                            for i in (5, 6, 7)]
    assert pts(eight, host="gpu*") == []
    with pytest.raises(ValueError, match="--since 'yesterday'"):
        history.since("yesterday")


def test_history_formats_say_the_same(eight: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["history", "--results", str(eight), "--config", "tp1-ngram-k2", "--workload", "fib", "--last", "0"]
    assert collector_main([*args, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert collector_main([*args, "--format", "csv"]) == 0
    csv_lines = capsys.readouterr().out.splitlines()
    assert collector_main(args) == 0
    md = capsys.readouterr().out
    assert len(doc["points"]) == len(csv_lines) - 1 == 8 and doc["window"] == history.WINDOW
    assert [p["outside"] for p in doc["points"]].count(["speedup below"]) == 1
    run7 = next(line for line in md.splitlines() if line.startswith("| run-07"))
    cells = [c.strip() for c in run7.strip("|").split("|")]
    assert cells[4].startswith("120.0 (") and cells[5].startswith("1.20x (") and cells[6].startswith("2.50")
    assert cells[7] == "speedup below" and cells[8] == ""
    assert "| run-06" in md and "server args: added --max-num-seqs 8" in md
    assert md.startswith("### cpu1 (vllm) · tp1-ngram-k2 · fib, 64 tok\n")


def test_an_unchanged_run_is_not_read_again_and_a_changed_one_replaces_its_rows(tmp_path: Path) -> None:
    results = tmp_path / "results"
    for i in range(3):
        write_run(results, i)
    assert store_update.update(results).new == 3
    # a run whose files keep their names, sizes and times is not read again: its old figures stay
    jsonl = results / "run-01" / HOST / "tp1-autoregressive" / "requests.jsonl"
    st = jsonl.stat()
    data = jsonl.read_bytes()
    jsonl.write_bytes(data.replace(b'"workload": "fib"', b'"workload": "xyz"'))
    os.utime(jsonl, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = store_update.update(results)
    assert (again.read, again.unchanged) == ([], 3)
    sql = "SELECT DISTINCT workload FROM requests WHERE run_id = 'run-01' ORDER BY 1"
    assert _sql(results, sql) == [("fib",), ("qsort",)]
    # touched: read again, its rows replaced (none left twice), the others left alone
    os.utime(jsonl)
    again = store_update.update(results)
    assert (again.read, again.new, again.unchanged) == (["run-01"], 0, 2)
    assert _sql(results, sql) == [("fib",), ("qsort",), ("xyz",)]
    assert _sql(results, "SELECT count(*) FROM requests") == [(3 * 2 * 2 * REPS,)]
    # a run folder that is gone is dropped
    import shutil
    shutil.rmtree(results / "run-02")
    again = store_update.update(results)
    assert again.dropped == ["run-02"] and _sql(results, "SELECT run_id FROM runs ORDER BY 1") == [("run-00",),
                                                                                                   ("run-01",)]


def _sql(results: Path, query: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect(str(results / store.DB_FILE), read_only=True)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


def test_a_damaged_file_is_skipped_and_named_with_its_line(tmp_path: Path) -> None:
    results = tmp_path / "results"
    run = write_run(results, 0)
    jsonl = run / HOST / "tp1-ngram-k2" / "requests.jsonl"
    lines = jsonl.read_text().splitlines()
    jsonl.write_text("\n".join([lines[0], lines[1][:40], *lines[2:]]) + "\n")
    (run / HOST / "tp1-autoregressive" / "config.json").write_text("{not json")
    said: list[str] = []
    got = store_update.update(results, warn=said.append)
    assert got.problems == 2
    assert any(f"{jsonl}:2: " in s for s in said), said
    assert any(f"{run / HOST / 'tp1-autoregressive' / 'config.json'}:1: malformed JSON" in s for s in said), said
    assert _sql(results, "SELECT count(*) FROM requests WHERE config_id = 'tp1-ngram-k2'") == [(2 * REPS - 1,)]
    assert _sql(results, "SELECT count(*) FROM problems") == [(2,)]
    assert _sql(results, "SELECT DISTINCT method FROM cells WHERE config_id = 'tp1-autoregressive'") == [
        ("autoregressive",)]  # its identity from its request lines, as the report takes it


def test_an_update_that_fails_leaves_the_store_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = tmp_path / "results"
    write_run(results, 0)
    store_update.update(results)
    write_run(results, 1)
    os.utime(results / "run-00" / "run.json")  # changed: deleted and read again in the same transaction

    monkeypatch.setattr(store_update, "extract", _broken)
    with pytest.raises(OSError, match="disk gone"):
        store_update.update(results)
    assert _sql(results, "SELECT run_id, count(*) FROM cells GROUP BY ALL") == [("run-00", 4)]
    monkeypatch.undo()
    assert store_update.update(results).read == ["run-00", "run-01"]


_extract = store_update.extract


def _broken(item: tuple[str, str]) -> store_rows.Extract:
    """store_rows.extract, failing on run-01 (after run-00 was read: the update had started to write)."""
    if item[0] == "run-01":
        raise OSError(f"disk gone while reading {item[0]}")
    return _extract(item)


HOLD = """
import sys, duckdb
con = duckdb.connect(sys.argv[1])
print("held", flush=True)
sys.stdin.read()
"""


def test_a_second_writer_waits_for_the_first_then_gives_up_naming_the_store(tmp_path: Path) -> None:
    results = tmp_path / "results"
    write_run(results, 0)
    db = results / store.DB_FILE
    store_update.update(results)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(store.Busy, match=f"{db}: held by another process past 0 s"):
            store_update.update(results, wait_s=0.3)
    finally:
        holder.communicate("", timeout=30)
    assert store_update.update(results, wait_s=5).unchanged == 1


def test_finish_updates_the_store_and_the_page_shows_the_trend(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    for i in range(3):
        write_run(results, i)
    first = ["finish", str(results / "run-00"), "--hosts", HOST]
    assert collector_main(first) == 0
    out = capsys.readouterr().out
    verdict = json.loads(out.splitlines()[-1])
    assert verdict["history"].startswith(f"history store {results / store.DB_FILE}: 3 runs; read 3 (3 new")
    page = (results / "run-00" / "report.html").read_text()
    assert '<h2 id="history">History</h2>' in page and "No earlier run of this run's cells" in page
    assert not list((results / "run-00" / "plots").glob("trend-*"))
    assert collector_main(["finish", str(results / "run-02"), "--hosts", HOST]) == 0
    capsys.readouterr()
    page = (results / "run-02" / "report.html").read_text()
    assert 'id="history-table"' in page and "4 cells of this run were measured by earlier runs" in page
    trend = results / "run-02" / "plots" / f"trend-{HOST}-tp1.svg"
    assert trend.is_file() and (results / "run-02" / "plots" / f"trend-{HOST}-tp1.png").is_file()
    svg = trend.read_text()
    assert 'id="trend-tp1-ngram-k2-fib_64_tok"' in svg  # a line per cell, in a panel per config
    # `specfleet plot` and `report --write` draw the same trend from the store as it is, and leave it alone
    trend.unlink()
    assert collector_main(["plot", str(results / "run-02")]) == 0
    assert trend.is_file() and 'id="trend-tp1-ngram-k2-fib_64_tok"' in trend.read_text()
    assert collector_main(["plot", str(results / "run-02"), "--db", ""]) == 0
    assert not trend.exists()
    assert collector_main(["report", str(results / "run-02"), "--write"]) == 0
    assert trend.is_file() and 'id="history-table"' in (results / "run-02" / "report.html").read_text()
    capsys.readouterr()
    # no store: no history, the report still written
    assert collector_main(["finish", str(results / "run-01"), "--hosts", HOST, "--db", ""]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["history"] == "history store: off"


def _unread(item: tuple[str, str]) -> store_rows.Extract:
    raise AssertionError(f"{item[0]} read again")


def test_finish_stores_the_run_it_read_without_reading_it_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    run = write_run(results, 0)
    jsonl = run / HOST / "tp1-ngram-k2" / "requests.jsonl"
    lines = jsonl.read_text().splitlines()
    jsonl.write_text("\n".join([lines[0], lines[1][:40], *lines[2:]]) + "\n")
    monkeypatch.setattr(store_update, "extract", _unread)
    assert collector_main(["finish", str(run), "--hosts", HOST]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out.splitlines()[-1])["history"].startswith(
        f"history store {results / store.DB_FILE}: 1 runs; read 1 (1 new")
    assert out.err.count(f"{jsonl}:2: ") == 1  # said once, by the report's reading
    assert _sql(results, "SELECT count(*) FROM requests WHERE config_id = 'tp1-ngram-k2'") == [(2 * REPS - 1,)]
    assert _sql(results, "SELECT count(*) FROM problems") == [(1,)]


def test_finish_writes_its_report_when_the_store_cannot_be_updated(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    write_run(results, 0)
    (results / store.DB_FILE).write_text("not a database")
    assert collector_main(["finish", str(results / "run-00"), "--hosts", HOST]) == 0
    out = capsys.readouterr()
    assert "warning: history store not updated: " in out.err
    assert json.loads(out.out.splitlines()[-1])["history"].startswith("history store not updated: ")
    assert (results / "run-00" / "report.html").is_file()


def test_sql_answers_in_each_format_and_names_a_bad_query(eight: Path, capsys: pytest.CaptureFixture[str]) -> None:
    q = "SELECT run_id, round(tok_s_mean, 1) AS tok_s FROM cells WHERE config_id = 'tp1-autoregressive' AND " \
        "workload = 'fib' ORDER BY run_id LIMIT 2"
    assert collector_main(["db", "--results", str(eight), "--sql", q]) == 0
    assert capsys.readouterr().out.splitlines() == ["| run_id | tok_s |", "|--------|-------|",
                                                    "| run-00 | 100   |", "| run-01 | 101   |"]
    assert collector_main(["db", "--results", str(eight), "--sql", q, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"run_id": "run-00", "tok_s": 100.0},
                                                   {"run_id": "run-01", "tok_s": 101.0}]
    assert collector_main(["db", "--results", str(eight), "--sql", q, "--format", "csv"]) == 0
    assert capsys.readouterr().out == "run_id,tok_s\nrun-00,100.0\nrun-01,101.0\n"
    assert collector_main(["db", "--results", str(eight), "--sql", "SELECT nope FROM cells"]) == 2
    assert 'Referenced column "nope" not found' in capsys.readouterr().err


def test_a_file_that_is_no_store_is_named_and_left_as_it_is(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A file at the store's path that specfleet did not make: db, db --rebuild and history refuse it, name it, give
    no advice that would destroy it, and leave it as it was; moved away, db builds the store."""
    results = tmp_path / "results"
    write_run(results, 0)
    db = results / store.DB_FILE
    db.write_text("not a database")
    for args in (["db"], ["db", "--rebuild"], ["history"]):
        assert collector_main([*args, "--results", str(results)]) == 2, args
        err = capsys.readouterr().err
        assert str(db) in err and "--rebuild" not in err, (args, err)
        assert db.read_text() == "not a database"
    assert "not a history store specfleet made; left as it is" in (
        collector_main(["db", "--results", str(results)]), capsys.readouterr().err)[1]
    db.rename(tmp_path / "notes.txt")
    assert collector_main(["db", "--results", str(results)]) == 0
    assert "1 runs; read 1 (1 new, 0 changed)" in capsys.readouterr().out
    assert collector_main(["history", "--results", str(results), "--config", "tp1-ngram-k2"]) == 0


def test_history_without_a_store_says_how_to_build_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert collector_main(["history", "--results", str(tmp_path)]) == 2
    assert f"no history store at {tmp_path / store.DB_FILE}: build it with `specfleet db`" in capsys.readouterr().err


@pytest.mark.parametrize("args,said", [(["--window", "0"], "argument --window: 0 is below 1"),
                                       (["--last", "-1"], "argument --last: -1 is below 0"),
                                       (["--last", "ten"], "argument --last: not a whole number: 'ten'"),
                                       (["--since", "last week"], "--since 'last week': not a date")])
def test_history_refuses_bad_options_naming_them(eight: Path, args: list[str], said: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = collector_main(["history", "--results", str(eight), *args])
    except SystemExit as exc:  # argparse's own refusal
        code = int(exc.code or 0)
    assert code == 2 and said in capsys.readouterr().err


def test_a_new_report_column_reaches_the_store_without_a_manual_schema_change() -> None:
    from collector.tables import COLUMNS

    cells = [c for c, _ in store.schema()["cells"]]
    assert cells[2:2 + len(COLUMNS)] == COLUMNS

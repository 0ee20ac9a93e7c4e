"""The engine is part of a config's identity: `compare`, the history store's series and the table across hosts, on
runs written the way the agent writes them (configs from `matrix.expand` for each host's engine, rows through
`records.request_row`, files through the agent's `record`). One machine may be two inventory hosts on two engines
(`local` on vLLM, `local-llamacpp` on llama.cpp), and a host may change engine between runs: the same config ids,
cells and host names then name measurements that are not of one series.

Each run: per host its engine, the baseline's tok/s and the n-gram config's ratio to it, fib at 64 tokens, four
repetitions within 1% of each other (so a 20% fall is a significant one)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from agent import records
from agent.config_run import Host, Result, fresh_folder, record
from agent.engines import ENGINES
from agent.records import Outcome
from agent.store import HostStore, write_json
from collector import history, store, store_update
from collector.compare import Comparison, compare
from collector.history import Filters
from collector.load import load_run
from collector.report import render
from collector.tables.cross_host import cross_host
from collector.tables.speedup import table
from collector.vocab import CELL
from controller import matrix
from tests.collector.test_history import pts

TOKENS = 64
SPREAD = (0.99, 1.0, 1.01, 1.0)  # each repetition: the run's tok/s × these
BASE, NGRAM = "tp1-autoregressive", "tp1-ngram-k2"
VLLM, LLAMACPP = "vllm", "llamacpp"

Hosts = dict[str, tuple[str, float, float]]  # host -> (engine, the baseline's tok/s, the n-gram config's ratio)


def suite(engine: str) -> dict[str, Any]:
    where = {"engine_binary": "/opt/llama/llama-server"} if engine == LLAMACPP else {
        "engine_python": "/opt/vllm/bin/python"}
    return {"suite_name": "engines", "engine": engine, **where, "model": {"name": "tiny", "path": "/models/tiny"},
            "repetitions": len(SPREAD), "server_args": [],
            "phases": [{"name": "tp1", "configs": [{"method": "autoregressive"},
                                                   {"method": "ngram", "num_speculative_tokens": 2}],
                        "sweeps": [{"name": "short", "workloads": ["fib"], "max_tokens": [TOKENS],
                                    "concurrency": [1]}]}]}


def write_run(results: Path, run_id: str, day: int, hosts: Hosts) -> Path:
    """results/<run_id>, measured on 2026-11-<day>: each host's configs on its engine at its figures."""
    run_dir = results / run_id
    when = f"2026-11-{day:02d}T10:00:00.000+00:00"
    for name, (engine, base, ratio) in hosts.items():
        st = HostStore(run_dir, name)
        host = Host(suite=suite(engine), engine=ENGINES[engine], store=st, engine_info={"version": "1.0"})
        write_json(st.dir / "host.json", {"host": name, "gpus": {"count": 0, "devices": []},
                                          "engine": {"distribution": engine, "version": "1.0"}})
        for cfg in matrix.expand(suite(engine)):
            identity = {"host": name, "config_id": cfg["config_id"], "method": cfg["method"],
                        "method_params": cfg["method_params"], "tp": cfg["tp"], "engine": cfg["engine"],
                        "model": cfg["model"]["name"], "phase": cfg["phase"]}
            tok_s = base * (ratio if cfg["method"] != "autoregressive" else 1.0)
            rows = [records.request_row(identity, cell, rep, {
                "slot": 0, "prompt_tokens": 10, "completion_tokens": TOKENS, "ttft_s": 0.05,
                "e2e_s": TOKENS / (tok_s * s), "output_tok_s": tok_s * s, "ok": True, "error": None,
                "sent_s": rep * 10.0, "done_s": rep * 10.0 + TOKENS / (tok_s * s)})
                for cell in cfg["cells"] for rep, s in enumerate(SPREAD)]
            folder = fresh_folder(st, cfg["config_id"])
            record(host, cfg, Result(Outcome.OK, rows=rows, argv=cfg["command"], fields={"ready_s": 1.0}), folder,
                   when)
            status = json.loads((folder / "status.json").read_text())
            write_json(folder / "status.json", {**status, "started_at": when, "finished_at": when})
    write_json(run_dir / "run.json", {"run_id": run_id, "started_at": when, "finished_at": when,
                                      "project_version": "abc1234", "suite": "engines", "schema_version": 1,
                                      "hosts": list(hosts)})
    return run_dir


def compared(tmp_path: Path, a: Hosts, b: Hosts) -> Comparison:
    results = tmp_path / "results"
    return compare(load_run(write_run(results, "a", 1, a)), load_run(write_run(results, "b", 2, b)))


def verdicts(result: Comparison) -> dict[tuple[str, str], str]:
    return {(c.host, c.config_id): c.verdict for c in result.rows}


# ---------------------------------------------------------------------------------------------------------------
# compare: a cell matches on host, engine, config and cell
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("engine", [VLLM, LLAMACPP])
def test_compare_on_one_engine_in_both_runs_still_finds_a_regression(tmp_path: Path, engine: str) -> None:
    """The n-gram config 20% slower in B on the same host and engine: regressed, its sides and its table named
    with the engine that measured them."""
    result = compared(tmp_path, {"h1": (engine, 100.0, 1.5)}, {"h1": (engine, 100.0, 1.2)})
    assert verdicts(result) == {("h1", BASE): "not_significant", ("h1", NGRAM): "regressed"}
    ngram = next(c for c in result.rows if c.config_id == NGRAM)
    assert ngram.ratio == pytest.approx(0.8)
    assert (ngram.engine, ngram.a.engine, ngram.b.engine) == (engine, engine, engine)
    text = result.text()
    assert f"\n### h1 ({engine}) tp1: fib, 64 tok\n" in text and "Not comparable" not in text
    assert json.loads(result.to_json())["regressed"] == [f"h1 {NGRAM}, fib, 64 tok"]


def test_compare_calls_a_host_that_changed_engine_not_comparable_naming_both(tmp_path: Path) -> None:
    """h1 on vLLM in A, on llama.cpp in B at half the tok/s: no regression and no ratio, each cell once (not
    `only in A` and again `only in B`), listed as not comparable with both engines and what each measured."""
    result = compared(tmp_path, {"h1": (VLLM, 100.0, 1.5)}, {"h1": (LLAMACPP, 50.0, 1.2)})
    assert verdicts(result) == {("h1", BASE): "not_comparable", ("h1", NGRAM): "not_comparable"}
    assert result.regressed == [] and result.broken == [] and all(c.ratio is None for c in result.rows)
    ngram = next(c for c in result.rows if c.config_id == NGRAM)
    assert (ngram.engine, ngram.a.engine, ngram.b.engine) == (VLLM, VLLM, LLAMACPP)
    assert (ngram.a.tok_s_mean, ngram.b.tok_s_mean) == (pytest.approx(150.0), pytest.approx(60.0))
    text = result.text()
    listed = text.split("## Not comparable: another engine\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert listed == [f"- h1 {BASE}, fib, 64 tok: A on vllm: 100.0 ± 0.8 tok/s (n=4); B on llamacpp: 50.0 ± 0.4 "
                      "tok/s (n=4)",
                      f"- h1 {NGRAM}, fib, 64 tok: A on vllm: 150.0 ± 1.2 tok/s (n=4); B on llamacpp: 60.0 ± 0.5 "
                      "tok/s (n=4)"]
    assert "## Regressed" not in text and "## Only in" not in text and "## Cells both runs measured" not in text
    assert "2 not comparable (another engine)" in text
    doc = json.loads(result.to_json())
    assert doc["counts"]["not_comparable"] == 2 and doc["counts"]["only_a"] == doc["counts"]["only_b"] == 0
    assert {(c["a"]["engine"], c["b"]["engine"]) for c in doc["cells"]} == {(VLLM, LLAMACPP)}


def test_compare_sets_two_hosts_on_two_engines_each_against_itself(tmp_path: Path) -> None:
    """`local` on vLLM and `local-llamacpp` on llama.cpp in both runs, llama.cpp 20% slower in B: its cells
    regressed, vLLM's did not move; each host's table names its engine."""
    a = {"local": (VLLM, 100.0, 1.5), "local-llamacpp": (LLAMACPP, 50.0, 1.3)}
    b = {"local": (VLLM, 100.0, 1.5), "local-llamacpp": (LLAMACPP, 40.0, 1.3)}
    result = compared(tmp_path, a, b)
    assert verdicts(result) == {("local", BASE): "not_significant", ("local", NGRAM): "not_significant",
                                ("local-llamacpp", BASE): "regressed", ("local-llamacpp", NGRAM): "regressed"}
    assert {(c.host, c.a.engine, c.b.engine) for c in result.rows} == {("local", VLLM, VLLM),
                                                                        ("local-llamacpp", LLAMACPP, LLAMACPP)}
    text = result.text()
    assert text.index("\n### local (vllm) tp1: fib, 64 tok\n") < text.index(
        "\n### local-llamacpp (llamacpp) tp1: fib, 64 tok\n")
    assert "Not comparable" not in text


# ---------------------------------------------------------------------------------------------------------------
# history: a series is a host's config and cell on one engine
# ---------------------------------------------------------------------------------------------------------------

# h1 on vLLM in runs 0-4 (100 tok/s), on llama.cpp in runs 5-6 (50), back on vLLM in run 7 at 80: a fall
ENGINE_OF = [VLLM] * 5 + [LLAMACPP] * 2 + [VLLM]
BASE_OF = [100.0, 101.0, 99.0, 100.0, 100.0, 50.0, 51.0, 80.0]


@pytest.fixture(scope="module")
def switched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    results = tmp_path_factory.mktemp("engines") / "results"
    for i, (engine, base) in enumerate(zip(ENGINE_OF, BASE_OF)):
        write_run(results, f"run-{i:02d}", i + 1, {"h1": (engine, base, 1.5)})
    assert store_update.update(results).new == len(BASE_OF)
    return results


def test_history_starts_a_new_series_when_a_host_changes_engine(switched: Path) -> None:
    """The first llama.cpp run, at half vLLM's tok/s, is the first of its series: no previous run, nothing outside
    a spread; back on vLLM, run 7 follows run 4 and its fall is judged against the vLLM runs alone."""
    got = pts(switched, config=BASE, last=0)
    run = {p["run_id"]: p for p in got}
    assert (run["run-05"]["previous_run"], run["run-05"]["outside"], run["run-05"]["changes"]) == (None, [], [])
    assert (run["run-06"]["previous_run"], run["run-06"]["outside"]) == ("run-05", [])
    assert (run["run-07"]["previous_run"], run["run-07"]["outside"]) == ("run-04", ["tok/s below"])
    series: dict[str, list[str]] = {}
    for p in got:
        series.setdefault(p["engine"], []).append(p["run_id"])
    assert series == {LLAMACPP: ["run-05", "run-06"], VLLM: [f"run-0{i}" for i in (0, 1, 2, 3, 4, 7)]}
    md = history.render(got, "md", Filters(config=BASE, last=0))
    assert md.count("### h1 (llamacpp) · tp1-autoregressive · fib, 64 tok\n") == 1
    assert md.count("### h1 (vllm) · tp1-autoregressive · fib, 64 tok\n") == 1
    assert [p["engine"] for p in json.loads(history.render(got, "json", Filters()))["points"]] == [
        p["engine"] for p in got]


def test_a_run_on_a_new_engine_has_no_earlier_runs_in_its_report(switched: Path) -> None:
    """The report's history of run 5 (llama.cpp) holds run 5 alone; run 6's, runs 5 and 6."""
    assert {p["run_id"] for p in history.for_run(switched / store.DB_FILE, "run-05")} == {"run-05"}
    assert {p["run_id"] for p in history.for_run(switched / store.DB_FILE, "run-06")} == {"run-05", "run-06"}


# ---------------------------------------------------------------------------------------------------------------
# across hosts: a column per host and engine
# ---------------------------------------------------------------------------------------------------------------

def across(tmp_path: Path, hosts: Hosts) -> tuple[pd.DataFrame, Any]:
    run = load_run(write_run(tmp_path / "results", "run", 1, hosts))
    return cross_host(table(run)), run


def test_across_two_engines_on_one_machine_each_column_names_host_and_engine(tmp_path: Path) -> None:
    """`local` (vLLM) and `local-llamacpp` (llama.cpp): tok/s of each, then each one's speedup over its own
    baseline, then the spread; report.md's section says it sets hosts and engines side by side, report.json's rows
    carry the same columns."""
    got, run = across(tmp_path, {"local": (VLLM, 100.0, 1.5), "local-llamacpp": (LLAMACPP, 50.0, 1.2)})
    sides = ["local (vllm)", "local-llamacpp (llamacpp)"]
    columns = [*(f"{s} tok_s" for s in sides), *(f"{s} speedup" for s in sides), "tok_s_spread"]
    assert list(got.columns) == ["config_id", *CELL, *columns]
    ngram = got[got["config_id"] == NGRAM].iloc[0]
    assert [ngram[c] for c in columns] == [pytest.approx(v) for v in (150.0, 60.0, 1.5, 1.2, 1.5)]
    md = render(run, "md")
    assert "\n## Across hosts and engines\n\nPer config and cell, the hosts and their engines side by side" in md
    assert " local (vllm) tok_s |" in md and " local-llamacpp (llamacpp) speedup |" in md
    rows = json.loads(render(run, "json"))["cross_host"]
    assert [list(r) for r in rows] == [["config_id", *CELL, *columns]] * 2


def test_across_two_hosts_on_one_engine_and_a_host_alone(tmp_path: Path) -> None:
    """th1 and th2 on vLLM: a column each named with the engine; one host alone: no table."""
    got, _ = across(tmp_path / "two", {"th1": (VLLM, 100.0, 1.5), "th2": (VLLM, 120.0, 1.25)})
    assert list(got.columns)[len(CELL) + 1:] == ["th1 (vllm) tok_s", "th2 (vllm) tok_s", "th1 (vllm) speedup",
                                                 "th2 (vllm) speedup", "tok_s_spread"]
    base = got[got["config_id"] == BASE].iloc[0]
    assert base["tok_s_spread"] == pytest.approx(0.2)
    alone, run = across(tmp_path / "one", {"local-llamacpp": (LLAMACPP, 50.0, 1.2)})
    assert alone.empty and "## Across hosts" not in render(run, "md")

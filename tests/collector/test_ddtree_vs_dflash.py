"""The report's view of DDTree budgets against every DFlash config, on records written the way the agent writes
them: configs expanded by `matrix.expand` from a ct200-shaped matrix (SGLang; one DFlash config with spec v2, one
with --disable-overlap-schedule; ids that are not ct200's, so nothing keys on them), config.json, status.json and
requests.jsonl through the agent's own `record`, request lines through `records.request_row`, run.json from
`collector stamp`. Every expected number below is worked out by hand.
"""
from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any, Optional

import pandas as pd
import pytest

from agent import records
from agent.classify import Reason
from agent.config_run import Host, Result, fresh_folder, record
from agent.engines import ENGINES
from agent.records import Outcome
from agent.store import HostStore, write_json
from collector import VS_FILE
from collector.__main__ import main as collector_main
from collector.load import load_run
from collector.report import render
from collector.tables.ddtree_vs_dflash import VS_COLUMNS, ddtree_vs_dflash, scheduling
from controller import matrix
from tests.controller.test_matrix import suite_from_host_vars

HOST, MAX_TOKENS = "gpu1", 64
DFLASH = [{"method": "dflash", "block_size": 16, "id": "spec2"},
          {"method": "dflash", "block_size": 16, "id": "plain", "server_args": ["--disable-overlap-schedule"]}]
DDTREE = [{"method": "ddtree", "budget": b, "block_size": 16, "server_args": ["--page-size", "1"]} for b in (8, 16, 32)]
# Every sample list is mean × (5/6, 1, 7/6): relative std 1/6, so each mean's squared relative standard error is
# 1/108 and every ratio of two of them has the interval ratio · exp(±t(0.975, 4) · sqrt(1/54)) (Welch df exactly 4).
TOK = {
    ("autoregressive", "fib"): [10.0, 12.0, 14.0],  # 12
    ("spec2", "fib"): [20.0, 24.0, 28.0],  # 24
    ("plain", "fib"): [15.0, 18.0, 21.0],  # 18
    ("ddtree-b8", "fib"): [30.0, 36.0, 42.0],  # 36
    ("ddtree-b16", "fib"): [22.5, 27.0, 31.5],  # 27
    ("ddtree-b32", "fib"): [17.5, 21.0, 24.5],  # 21
    ("autoregressive", "qsort"): [10.0, 12.0, 14.0],  # 12
    ("plain", "qsort"): [25.0, 30.0, 35.0],  # 30
    ("ddtree-b16", "qsort"): [20.0, 24.0, 28.0],  # 24
    ("autoregressive", "json"): [10.0, 12.0, 14.0],
    ("spec2", "json"): [20.0, 24.0, 28.0],
}
T4 = 2.7764451051977987  # Student t 0.975 quantile, 4 degrees of freedom
HALF = T4 * math.sqrt(1 / 54)


def suite(ddtree: list[dict[str, Any]] = DDTREE) -> dict[str, Any]:
    b16 = ["ddtree-b16"] if any(c["budget"] == 16 for c in ddtree) else []
    return {
        "suite_name": "vs", "engine": "sglang", "engine_python": "/opt/sglang/bin/python", "gpu_count": 1,
        "model": {"name": "Qwen3.6-27B", "path": "/models/Qwen3.6-27B", "max_model_len": 4096},
        "draft_model": {"name": "Qwen3.6-27B-DFlash", "path": "/models/Qwen3.6-27B-DFlash"},
        "env": {"HF_HUB_OFFLINE": "1"},
        "phases": [{"name": "tp1", "tp": 1, "configs": [{"method": "autoregressive"}, *DFLASH, *ddtree],
                    "sweeps": [{"workloads": ["fib"], "max_tokens": [MAX_TOKENS]},
                               # only the non-overlap DFlash and one budget: a group with one DFlash config
                               {"workloads": ["qsort"], "max_tokens": [MAX_TOKENS],
                                "methods": ["plain", *b16]},
                               # DFlash without DDTree: no comparison for this cell
                               {"workloads": ["json"], "max_tokens": [MAX_TOKENS], "methods": ["spec2"]}]}],
    }


def write_run(root: Path, ddtree: list[dict[str, Any]] = DDTREE,
              failed: Optional[dict[str, tuple[Reason, str]]] = None) -> Path:
    """results/<run>/gpu1/<config>/ for every config of the matrix; `failed` maps a label to the reason and
    detail it ends with instead of measuring."""
    run_dir = root / "results" / "run-vs"
    store = HostStore(run_dir, HOST)
    host = Host(suite=suite(ddtree), engine=ENGINES["sglang"], store=store, engine_info={"version": "0.5.10"})
    write_json(store.dir / "host.json", {"host": HOST, "hostname": HOST, "gpus": {"count": 1, "devices": []},
                                         "engine": {"name": "sglang", "version": "0.5.10"}})
    for cfg in matrix.expand(suite(ddtree)):
        lab = cfg["config_id"].removeprefix("tp1-")
        folder = fresh_folder(store, cfg["config_id"])
        (folder / "server.log").write_text("INFO The server is fired up and ready to roll!\n")
        if failed and lab in failed:
            record(host, cfg, Result.failed(*failed[lab]), folder, "2026-12-01T10:00:00.000+00:00")
            continue
        identity = {"host": HOST, "config_id": cfg["config_id"], "method": cfg["method"],
                    "method_params": cfg["method_params"], "tp": cfg["tp"], "engine": cfg["engine"],
                    "model": cfg["model"]["name"], "phase": cfg["phase"]}
        rows = []
        for cell in cfg["cells"]:
            for rep, tok in enumerate(TOK[(lab, cell["workload"])]):
                rows.append(records.request_row(identity, cell, rep, {
                    "prompt_tokens": 40, "completion_tokens": MAX_TOKENS, "ttft_s": 0.05,
                    "e2e_s": MAX_TOKENS / tok, "output_tok_s": tok, "ok": True, "error": None,
                    "accept_length": None if cfg["method"] == "autoregressive" else 4.0}))
        record(host, cfg, Result(Outcome.OK, rows=rows, argv=cfg["command"],
                                 fields={"ready_s": 60.0, "timed_s": 30.0, "wall_s": 100.0}),
               folder, "2026-12-01T10:00:00.000+00:00")
    assert collector_main(["stamp", str(run_dir), "start", "--suite", "vs", "--hosts", HOST]) == 0
    assert collector_main(["stamp", str(run_dir), "finish", "--suite", "vs", "--hosts", HOST]) == 0
    return run_dir


def pairs(vs: pd.DataFrame, workload: str) -> dict[tuple[str, str], pd.Series]:
    g = vs[vs["workload"] == workload]
    return {(r["ddtree_config_id"], r["dflash_config_id"]): r for _, r in g.iterrows()}


def view_of(md: str) -> str:
    """The md report's DDTree-against-DFlash section, up to the next section."""
    start = md.index("## DDTree budgets against DFlash")
    end = md.find("\n## ", start)
    return md[start:] if end < 0 else md[start:end]


def test_three_budgets_against_two_dflash_configs(tmp_path: Path) -> None:
    """fib: baseline 12, DFlash spec2 24 (overlap) and plain 18 (no overlap), DDTree b8/b16/b32 36/27/21 tok/s:
    speedups 3, 2.25, 1.75; DDTree ÷ spec2 1.5, 1.125, 0.875; ÷ plain 2, 1.5, 7/6; every interval the ratio
    · exp(±t(0.975, 4) · sqrt(1/54))."""
    vs = ddtree_vs_dflash(load_run(write_run(tmp_path)))
    fib = pairs(vs, "fib")
    assert list(fib) == [(f"tp1-ddtree-b{b}", f"tp1-{d}") for b in (8, 16, 32) for d in ("plain", "spec2")]
    want = {8: (36.0, 3.0, {"spec2": 1.5, "plain": 2.0}), 16: (27.0, 2.25, {"spec2": 1.125, "plain": 1.5}),
            32: (21.0, 1.75, {"spec2": 0.875, "plain": 7 / 6})}
    for budget, (mean, speedup, ratios) in want.items():
        for dflash, ratio in ratios.items():
            r = fib[(f"tp1-ddtree-b{budget}", f"tp1-{dflash}")]
            assert r["budget"] == budget and r["ddtree_n"] == 3 and r["ddtree_status"] == "ok"
            assert r["ddtree_tok_s_mean"] == pytest.approx(mean)
            assert r["ddtree_tok_s_std"] == pytest.approx(mean / 6)  # mean × 1/6, ddof=1
            assert r["speedup"] == pytest.approx(speedup)
            assert r["speedup_ci_low"] == pytest.approx(speedup * math.exp(-HALF), rel=1e-9)
            assert r["speedup_ci_high"] == pytest.approx(speedup * math.exp(HALF), rel=1e-9)
            assert r["ddtree_over_dflash"] == pytest.approx(ratio)
            assert r["ddtree_over_dflash_ci_low"] == pytest.approx(ratio * math.exp(-HALF), rel=1e-9)
            assert r["ddtree_over_dflash_ci_high"] == pytest.approx(ratio * math.exp(HALF), rel=1e-9)
            assert r["dflash_tok_s_mean"] == pytest.approx(24.0 if dflash == "spec2" else 18.0)
            assert r["dflash_n"] == 3 and r["dflash_status"] == "ok"
    # exp(HALF) = 1.459: 2 [1.37, 2.92] and 1.5 [1.03, 2.19] are faster, 1.125 [0.77, 1.64] is not
    assert fib[("tp1-ddtree-b8", "tp1-plain")]["ddtree_over_dflash_significant"] == "faster"
    assert fib[("tp1-ddtree-b8", "tp1-spec2")]["ddtree_over_dflash_significant"] == "faster"
    assert fib[("tp1-ddtree-b16", "tp1-spec2")]["ddtree_over_dflash_significant"] == "no"
    # the scheduling path, read from config.json: plain has --disable-overlap-schedule, spec2 spec v2 on
    for (_, dflash), r in fib.items():
        assert r["dflash_scheduling"] == ("no_overlap" if dflash == "tp1-plain" else "overlap")
        assert bool(r["same_path_as_ddtree"]) is (dflash == "tp1-plain")
    # qsort has only the non-overlap DFlash and b16: 24 / 30 = 0.8, speedup 24 / 12 = 2; json has no DDTree
    assert list(pairs(vs, "qsort")) == [("tp1-ddtree-b16", "tp1-plain")]
    assert pairs(vs, "qsort")[("tp1-ddtree-b16", "tp1-plain")]["ddtree_over_dflash"] == pytest.approx(0.8)
    assert pairs(vs, "qsort")[("tp1-ddtree-b16", "tp1-plain")]["speedup"] == pytest.approx(2.0)
    assert pairs(vs, "json") == {}
    assert len(vs) == 7


def test_markdown_table_per_cell(tmp_path: Path) -> None:
    """The md report: one table per cell group holding both methods, a row per budget, a ratio column per DFlash
    config with the non-overlap one marked; none for json."""
    md = render(load_run(write_run(tmp_path)), "md", wide=True)  # each table whole (by default split to fit)
    view = view_of(md)
    assert "### gpu1 tp1: fib, 64 tok" in view and "### gpu1 tp1: qsort, 64 tok" in view
    assert "json" not in view
    fib = view[view.index("### gpu1 tp1: fib"):view.index("### gpu1 tp1: qsort")]
    assert "- DFlash `tp1-plain`: 18.0 ± 3.0 tok/s (n=3); overlap off: same path as DDTree" in fib
    assert "- DFlash `tp1-spec2`: 24.0 ± 4.0 tok/s (n=3); overlap on" in fib
    lines = [line for line in fib.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["budget", "config_id", "tok/s", "speedup", "÷ tp1-plain (same path)", "÷ tp1-spec2", "status"]
    b8 = [c.strip() for c in lines[2].strip("|").split("|")]
    lo, hi = math.exp(-HALF), math.exp(HALF)
    assert b8 == ["8", "tp1-ddtree-b8", "36.0 ± 6.0 (n=3)", f"3.00 [{3 * lo:.2f}, {3 * hi:.2f}]",
                  f"2.00 [{2 * lo:.2f}, {2 * hi:.2f}]", f"1.50 [{1.5 * lo:.2f}, {1.5 * hi:.2f}]", "ok"]
    assert [c.strip() for c in lines[3].strip("|").split("|")][:2] == ["16", "tp1-ddtree-b16"]
    assert [c.strip() for c in lines[4].strip("|").split("|")][:2] == ["32", "tp1-ddtree-b32"]


def test_csv_file_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`report --write` writes the comparison's CSV beside report.csv; report.csv keeps its rows; the JSON report
    carries the same rows under ddtree_vs_dflash."""
    run_dir = write_run(tmp_path)
    assert collector_main(["report", str(run_dir), "--format", "json", "--write"]) == 0
    doc = json.loads(capsys.readouterr().out)
    got = list(csv.DictReader(io.StringIO((run_dir / VS_FILE).read_text())))
    assert len(got) == len(doc["ddtree_vs_dflash"]) == 7
    first = got[0]
    assert (first["ddtree_config_id"], first["dflash_config_id"], first["budget"]) == ("tp1-ddtree-b8", "tp1-plain",
                                                                                       "8")
    assert float(first["ddtree_over_dflash"]) == pytest.approx(2.0)
    assert first["same_path_as_ddtree"] == "True" and first["dflash_scheduling"] == "no_overlap"
    assert doc["ddtree_vs_dflash"][0]["ddtree_over_dflash"] == pytest.approx(2.0)
    assert doc["ddtree_vs_dflash"][0]["same_path_as_ddtree"] is True
    table_rows = list(csv.DictReader(io.StringIO((run_dir / "report.csv").read_text())))
    assert len(table_rows) == 6 + 3 + 2  # fib: 6 configs; qsort: baseline, plain, b16; json: baseline, spec2


def test_failed_budget_is_shown_with_its_reason(tmp_path: Path) -> None:
    """A DDTree budget that did not fit keeps its rows (one per DFlash config) with the reason and no numbers,
    and its md row says failed: does_not_fit; the other budgets are unchanged."""
    run_dir = write_run(tmp_path, failed={"ddtree-b32": (Reason.DOES_NOT_FIT, "KV cache 30.1 GiB > 21.0 GiB")})
    run = load_run(run_dir)
    vs = ddtree_vs_dflash(run)
    fib = pairs(vs, "fib")
    for dflash in ("tp1-plain", "tp1-spec2"):
        r = fib[("tp1-ddtree-b32", dflash)]
        assert r["ddtree_status"] == "does_not_fit" and r["ddtree_n"] == 0 and r["budget"] == 32
        assert all(pd.isna(r[c]) for c in ("ddtree_tok_s_mean", "speedup", "ddtree_over_dflash",
                                            "ddtree_over_dflash_ci_low"))
    assert fib[("tp1-ddtree-b8", "tp1-plain")]["ddtree_over_dflash"] == pytest.approx(2.0)
    md = render(run, "md", wide=True)
    view = view_of(md)
    b32 = [line for line in view.splitlines() if "tp1-ddtree-b32" in line]
    assert len(b32) == 1  # fib only: b32 is not in the qsort sweep
    cells = [c.strip() for c in b32[0].strip("|").split("|")]
    assert cells == ["32", "tp1-ddtree-b32", "", "", "", "", "failed: does_not_fit"]


def test_failed_dflash_config_keeps_its_column(tmp_path: Path) -> None:
    """A DFlash config that crashed is still listed, with its reason; its ratios are blank, the other's are kept."""
    run = load_run(write_run(tmp_path, failed={"spec2": (Reason.CRASHED, "exit 1")}))
    fib = pairs(ddtree_vs_dflash(run), "fib")
    assert fib[("tp1-ddtree-b8", "tp1-spec2")]["dflash_status"] == "crashed"
    assert pd.isna(fib[("tp1-ddtree-b8", "tp1-spec2")]["ddtree_over_dflash"])
    assert fib[("tp1-ddtree-b8", "tp1-plain")]["ddtree_over_dflash"] == pytest.approx(2.0)
    view = view_of(render(run, "md", wide=True))
    assert "- DFlash `tp1-spec2`: failed: crashed; overlap on" in view
    b8 = next(line for line in view.splitlines() if "tp1-ddtree-b8" in line)
    assert [c.strip() for c in b8.strip("|").split("|")][4:] == [
        f"2.00 [{2 * math.exp(-HALF):.2f}, {2 * math.exp(HALF):.2f}]", "", "ok"]


def test_dflash_without_ddtree_is_named_with_its_engine(tmp_path: Path) -> None:
    """A run with DFlash but no DDTree: no pair, no CSV file (an earlier one removed), an empty list in JSON; the
    section names each DFlash config and the engine and version that measured it (its rows are the table's)."""
    run_dir = write_run(tmp_path, ddtree=[])
    (run_dir / VS_FILE).write_text(",".join(VS_COLUMNS) + "\n")  # an earlier report's (its header)
    run = load_run(run_dir)
    assert ddtree_vs_dflash(run).empty
    md = render(run, "md")
    section = md.split("## DDTree budgets against DFlash\n", 1)[1].split("\n## ", 1)[0]
    assert "No DDTree config was measured beside these DFlash configs" in section
    version = run.hosts[HOST]["engine"]["version"]
    dflash = sorted({c.config_id for c in run.configs if c.config["method"] == "dflash"})
    assert dflash and [line for line in section.splitlines() if line.startswith("- ")] == [
        f"- {HOST} `{cid}` (tp1): sglang {version}" for cid in dflash]
    doc = json.loads(render(run, "json"))
    assert doc["ddtree_vs_dflash"] == []
    assert [(a["config_id"], a["engine"], a["engine_version"]) for a in doc["dflash_without_ddtree"]] == [
        (cid, "sglang", version) for cid in dflash]
    assert collector_main(["report", str(run_dir), "--write"]) == 0
    assert not (run_dir / VS_FILE).exists()
    assert (run_dir / "report.csv").is_file()


@pytest.mark.parametrize(("server_args", "env", "engine", "features", "want"), [
    (["--disable-overlap-schedule"], {}, "sglang", {"dflash_overlap": True}, "no_overlap"),  # the flag
    ([], {}, "sglang", {"dflash_overlap": True}, "overlap"),  # 0.5.14 on: overlapped by default
    ([], {}, "sglang", None, "overlap"),  # a host.json without the build's features: the default of today's builds
    ([], {}, "sglang", {"dflash_overlap": False}, "no_overlap"),  # up to 0.5.13 the server forces it off
    ([], {"SGLANG_ENABLE_SPEC_V2": "0"}, "sglang", {"dflash_overlap": True}, "overlap"),  # never read for DFlash
    ([], {"SGLANG_ENABLE_SPEC_V2": "1"}, "sglang", {"dflash_overlap": False}, "no_overlap"),
    ([], {}, "vllm", None, None),  # not an SGLang config: cannot be told
    (None, None, "sglang", None, None),  # config.json lost
])
def test_scheduling_path_from_the_records(tmp_path: Path, server_args: Optional[list[str]],
                                          env: Optional[dict[str, str]], engine: str,
                                          features: Optional[dict[str, bool]], want: Optional[str]) -> None:
    """The path is read from config.json's server_args and the host's build, never from the config's id or from
    SGLANG_ENABLE_SPEC_V2 (which DFlash never read, and which 0.5.14 removed)."""
    run_dir = write_run(tmp_path, ddtree=[])
    path = run_dir / HOST / "tp1-plain" / "config.json"
    config = json.loads(path.read_text())
    assert config["server_args"][-1] == "--disable-overlap-schedule"  # as the agent recorded it
    if server_args is None:
        path.unlink()
    else:
        write_json(path, {**config, "engine": engine, "server_args": server_args, "environment": env,
                          "command": [a for a in config["command"] if a != "--disable-overlap-schedule"]})
    loaded = load_run(run_dir)
    c = next(c for c in loaded.configs if c.config_id == "tp1-plain")
    host = {"engine": {"features": features}} if features is not None else loaded.hosts.get(HOST)
    assert scheduling(c, host) == want


def test_ct200_profile_pairs_ddtree_with_its_non_overlap_dflash(tmp_path: Path) -> None:
    """The ct200 profile's records, as the agent writes them: in every phase the DFlash config with
    --disable-overlap-schedule is on DDTree's path, the other is not (the pull request's build: 0.5.15)."""
    configs = matrix.expand(suite_from_host_vars("ct200"))
    store = HostStore(tmp_path / "results" / "run-ct200", "ct200")
    host = Host(suite={}, engine=ENGINES["sglang"], store=store, engine_info={"version": "0.5.10"})
    for cfg in configs:
        if cfg["method"] == "dflash":
            record(host, cfg, Result(Outcome.OK, argv=cfg["command"]), fresh_folder(store, cfg["config_id"]),
                   "2026-12-01T10:00:00.000+00:00")
    paths = {c.config_id: scheduling(c) for c in load_run(store.dir.parent).configs}
    assert paths == {f"{tp}-{lab}": ("overlap" if lab == "dflash" else "no_overlap")
                     for tp in ("tp1", "tp4", "tp8") for lab in ("dflash", "dflash-nooverlap")}


def test_time_per_config_shows_where_startup_went_where_a_log_told(tmp_path: Path) -> None:
    """status.json `startup` (agent.startup, from each server's log) becomes the columns of the phases found."""
    from collector.tables.timing import timing
    run_dir = write_run(tmp_path, ddtree=[])
    assert [c for c in timing(load_run(run_dir)).columns if c.endswith("_s")] == [
        "ready_s", "warmup_s", "timed_s", "stop_s", "specfleet_overhead_s", "wall_s"]  # no log told: no startup columns
    path = run_dir / HOST / "tp1-plain" / "status.json"
    write_json(path, {**json.loads(path.read_text()), "startup": {"weights": 40.0, "kv_cache": 52.5, "graphs": 180.0,
                                                                   "serving": 200.0}})
    t = timing(load_run(run_dir))
    assert list(t.columns) == ["host", "config_id", "status", "weights_s", "kv_cache_s", "graphs_s", "ready_s",
                               "warmup_s", "timed_s", "stop_s", "specfleet_overhead_s", "wall_s"]
    row = t[t["config_id"] == "tp1-plain"].iloc[0]
    assert (row["weights_s"], row["kv_cache_s"], row["graphs_s"]) == (40.0, 52.5, 180.0)
    assert t[t["config_id"] == "tp1-autoregressive"]["weights_s"].isna().all()
    assert "its KV cache allocated (kv_cache_s)" in " ".join(render(load_run(run_dir), "md").split())


def test_specfleet_overhead_is_what_the_wall_time_leaves_of_the_recorded_phases(tmp_path: Path) -> None:
    """wall_s - (ready_s + warmup_s + timed_s + stop_s), each as status.json records it; missing, never worked out,
    where the config did not record one of them (report.md blank, report.json null)."""
    from collector.tables.timing import OVERHEAD, overhead
    st = {"ready_s": 16.541, "warmup_s": 0.202, "timed_s": 19.976, "stop_s": 0.418, "wall_s": 37.209}
    assert overhead(st) == 0.072
    for k in st:
        assert overhead({**st, k: None}) is None
        assert overhead({f: v for f, v in st.items() if f != k}) is None
    run_dir = write_run(tmp_path, ddtree=[])
    path = run_dir / HOST / "tp1-plain" / "status.json"
    write_json(path, {**json.loads(path.read_text()), **st})
    times = {r["config_id"]: r for r in json.loads(render(load_run(run_dir), "json"))["time_per_config"]}
    assert times["tp1-plain"][OVERHEAD] == 0.072 and times["tp1-plain"]["warmup_s"] == 0.202
    assert times["tp1-autoregressive"]["warmup_s"] is None and times["tp1-autoregressive"][OVERHEAD] is None

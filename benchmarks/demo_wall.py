"""The embedded suite as `make demo` runs it (`ansible-playbook bench.yml -l local`) with this checkout's profile
against the profile of another commit (its `host_vars/local.yml`, passed as extra vars: the same code runs both),
alternated, each pair in one invocation of this script. Prints each run's wall (the playbook's, and the agent's
suite from its first start to its last end), its requests, and the new/peer ratio of the playbook's wall per
pair and overall: how much a change of the demo's matrix costs.

Usage: python benchmarks/demo_wall.py --peer <git ref> [--pairs N]
Run it with the project's virtualenv active, on an otherwise idle machine.
"""
from __future__ import annotations

import argparse
import json
import os
import runpy
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]


# The playbook run and the suite's wall as benchmarks/pack_wall.py times them (a script, not a module: loaded by path)
_PACK_WALL = runpy.run_path(str(ROOT / "benchmarks" / "pack_wall.py"))
play: Callable[[str, list[str]], tuple[float, float | None]] = _PACK_WALL["play"]


def requests_of(run_id: str) -> int:
    """Timed requests the run recorded, over its configs."""
    return sum(int(json.loads(p.read_text()).get("requests") or 0)
               for p in (ROOT / "results" / run_id / "local").glob("*/status.json"))


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

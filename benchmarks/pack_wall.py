"""The embedded suite one config at a time against packed on CPU slots: `ansible-playbook bench.yml -l local` both
ways, alternated, each pair in one invocation of this script. Prints each run's wall (the playbook's, and the
agent's suite from its first start to its last end) and the packed/serial ratio per pair and overall.

Usage: python benchmarks/pack_wall.py [--pairs N] [--slots 0,1] [--check]
(`--check` adds the pack check: the baseline measured again while the other slot is busy.)
Run it with the project's virtualenv active, on an otherwise idle machine.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def suite_wall(run_id: str) -> float | None:
    """Seconds from the agent's suite start to its end, from the run's events."""
    path = ROOT / "results" / run_id / "local" / "events.jsonl"
    if not path.exists():
        return None
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    times = {e["event"]: datetime.fromisoformat(e["t"]) for e in events if e["event"] in ("suite_start", "suite_end")}
    if len(times) != 2:
        return None
    return (times["suite_end"] - times["suite_start"]).total_seconds()


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
    p.add_argument("--pairs", type=int, default=1)
    p.add_argument("--slots", default="0,1", help="one CPU per slot, comma-separated")
    p.add_argument("--check", action="store_true", help="with the pack check")
    args = p.parse_args()
    slots = [{"cpus": c} for c in args.slots.split(",")]
    packed = ["-e", "bench_pack=true", "-e", json.dumps({"bench_slots": slots})]
    if args.check:
        packed += ["-e", "bench_pack_check=true"]
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    print(f"{os.cpu_count()} CPUs; slots {args.slots}; {args.pairs} pair(s), alternating serial and packed")
    print(f"{'run':34} {'playbook s':>10} {'suite s':>8}")
    ratios = []
    for k in range(args.pairs):
        order = [("serial", []), ("packed", packed)]
        if k % 2:
            order.reverse()
        walls = {}
        for name, extra in order:
            run_id = f"wall-{stamp}-{k}-{name}"
            walls[name] = play(run_id, extra)
            print(f"{run_id:34} {walls[name][0]:10.1f} {walls[name][1] or float('nan'):8.1f}")
        ratios.append(walls["packed"][0] / walls["serial"][0])
        print(f"pair {k}: packed / serial = {ratios[-1]:.2f} (playbook walls)")
    print(f"packed / serial over {len(ratios)} pair(s): " + ", ".join(f"{r:.2f}" for r in ratios))


if __name__ == "__main__":
    main()

"""Where a run's time went: per config, the engine's own startup, the prompt building, the warmup request, the
wait for a packed phase's baseline, the timed requests, the stop, and the rest (flag and memory checks, records).

Prints figures for one run folder and three medians per ok config:
  formula   wall - ready - timed, as the packing issue first wrote it: the engine's first request (warmup) and
            its stop count as ours;
  overhead  wall - startup - timed - gate, where the engine's startup runs from its launch until it has
            answered its first request (ready + warmup): an engine that still compiles kernels on its first
            request (vLLM's n-gram proposer compiles its numba kernels then) has not finished starting, and
            every benchmark client sends such a request untimed. The wait of a packed config for its phase's
            baseline (gate) is another config's time. This is the figure held to 1 s;
  ours      what remains without the engine's stop too: specfleet's own work alone.

Usage: python benchmarks/overhead.py results/<run_id>
"""
from __future__ import annotations

import json
import statistics
import sys
from datetime import datetime
from pathlib import Path

COLUMNS = ("wall_s", "ready_s", "prompts_s", "warmup_s", "gate_wait_s", "timed_s", "stop_s")


def main(run_dir: Path) -> None:
    meta = json.loads((run_dir / "run.json").read_text())
    if meta.get("started_at") and meta.get("finished_at"):
        wall = datetime.fromisoformat(meta["finished_at"]) - datetime.fromisoformat(meta["started_at"])
        print(f"run {meta['run_id']}: {wall.total_seconds():.0f} s from the first start to the last finish")
    print(f"{'host/config':40} {'wall':>7} {'ready':>7} {'prompts':>8} {'warmup':>7} {'gate':>6} {'timed':>7} "
          f"{'stop':>6} {'rest':>6} {'formula':>8} {'overhead':>9}")
    formula, overheads, ours = [], [], []
    for status_path in sorted(run_dir.glob("*/*/status.json")):
        st = json.loads(status_path.read_text())
        wall, ready, prompts, warmup, gate, timed, stop = (float(st.get(k) or 0.0) for k in COLUMNS)
        rest = wall - ready - prompts - warmup - gate - timed - stop
        overhead = wall - (ready + warmup) - timed - gate
        name = f"{status_path.parent.parent.name}/{status_path.parent.name}"
        print(f"{name:40} {wall:7.2f} {ready:7.2f} {prompts:8.2f} {warmup:7.2f} {gate:6.2f} {timed:7.2f} "
              f"{stop:6.2f} {rest:6.2f} {wall - ready - timed:8.2f} {overhead:9.2f}  "
              f"{st['status'] if st['status'] == 'ok' else st.get('reason')}")
        if st["status"] == "ok":
            formula.append(wall - ready - timed)
            overheads.append(overhead)
            ours.append(overhead - stop)
    if overheads:
        print(f"median per ok config ({len(ours)} configs): overhead (wall - startup to the first answer - timed "
              f"- gate) {statistics.median(overheads):.2f} s (max {max(overheads):.2f} s); formula (wall - ready "
              f"- timed) {statistics.median(formula):.2f} s; ours without the engine's stop "
              f"{statistics.median(ours):.2f} s (max {max(ours):.2f} s)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))

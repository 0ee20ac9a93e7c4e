"""Where a run's time went: per config, the engine's own startup, the prompt building, the warmup request, the
timed requests, the stop, and the rest (flag and memory checks, records). Prints figures for one run folder, and
the median per config of the overhead as the packing issue defines it (wall - engine startup - timed requests)
and of what remains of it once the engine's own first request (warmup) and stop are set aside.

Usage: python benchmarks/overhead.py results/<run_id>
"""
from __future__ import annotations

import json
import statistics
import sys
from datetime import datetime
from pathlib import Path

COLUMNS = ("wall_s", "ready_s", "prompts_s", "warmup_s", "timed_s", "stop_s")


def main(run_dir: Path) -> None:
    meta = json.loads((run_dir / "run.json").read_text())
    if meta.get("started_at") and meta.get("finished_at"):
        wall = datetime.fromisoformat(meta["finished_at"]) - datetime.fromisoformat(meta["started_at"])
        print(f"run {meta['run_id']}: {wall.total_seconds():.0f} s from the first start to the last finish")
    print(f"{'host/config':40} {'wall':>7} {'startup':>8} {'prompts':>8} {'warmup':>7} {'timed':>7} {'stop':>6} "
          f"{'rest':>6} {'overhead':>9}")
    overheads, ours = [], []
    for status_path in sorted(run_dir.glob("*/*/status.json")):
        st = json.loads(status_path.read_text())
        wall, ready, prompts, warmup, timed, stop = (float(st.get(k) or 0.0) for k in COLUMNS)
        rest = wall - ready - prompts - warmup - timed - stop
        overhead = wall - ready - timed
        name = f"{status_path.parent.parent.name}/{status_path.parent.name}"
        print(f"{name:40} {wall:7.2f} {ready:8.2f} {prompts:8.2f} {warmup:7.2f} {timed:7.2f} {stop:6.2f} "
              f"{rest:6.2f} {overhead:9.2f}  {st['status'] if st['status'] == 'ok' else st.get('reason')}")
        if st["status"] == "ok":
            overheads.append(overhead)
            ours.append(overhead - warmup - stop)
    if overheads:
        print(f"median per ok config: overhead (wall - startup - timed) {statistics.median(overheads):.2f} s; "
              f"without the engine's warmup request and stop {statistics.median(ours):.2f} s "
              f"(max {max(ours):.2f} s, {len(ours)} configs)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))

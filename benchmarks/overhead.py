"""Where a run's time went: per config, the engine's own startup, the timed requests, the stop,
and the rest (flag check, prompt building, warmup, records). Prints figures for one run folder.

Usage: python benchmarks/overhead.py results/<run_id>
"""
from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path


def main(run_dir: Path) -> None:
    meta = json.loads((run_dir / "run.json").read_text())
    if meta.get("started_at") and meta.get("finished_at"):
        wall = datetime.fromisoformat(meta["finished_at"]) - datetime.fromisoformat(meta["started_at"])
        print(f"run {meta['run_id']}: {wall.total_seconds():.0f} s from the first start to the last finish")
    print(f"{'host/config':40} {'wall':>7} {'startup':>8} {'timed':>7} {'stop':>6} {'other':>7} {'overhead':>9}")
    totals = [0.0] * 5
    for status_path in sorted(run_dir.glob("*/*/status.json")):
        st = json.loads(status_path.read_text())
        wall, ready, timed, stop = (st.get(k) or 0.0 for k in ("wall_s", "ready_s", "timed_s", "stop_s"))
        other = wall - ready - timed - stop
        name = f"{status_path.parent.parent.name}/{status_path.parent.name}"
        print(f"{name:40} {wall:7.1f} {ready:8.1f} {timed:7.1f} {stop:6.1f} {other:7.1f} {wall - timed:9.1f}"
              f"  {st['status'] if st['status'] == 'ok' else st.get('reason')}")
        for i, v in enumerate((wall, ready, timed, stop, other)):
            totals[i] += v
    wall, ready, timed, stop, other = totals
    print(f"{'total':40} {wall:7.1f} {ready:8.1f} {timed:7.1f} {stop:6.1f} {other:7.1f} {wall - timed:9.1f}")
    if wall:
        print(f"overhead (wall - timed) is {100 * (wall - timed) / wall:.0f}% of config time; the engine's own "
              f"startup is {100 * ready / max(wall - timed, 1e-9):.0f}% of that overhead")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))

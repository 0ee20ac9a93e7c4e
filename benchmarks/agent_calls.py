"""CPU of one agent call on the host: the archive with its bytecode against the same archive without it.

Every progress poll, hostlock question and pack is a fresh `python agent.pyz ...` on the host, and during a suite
the polls run beside the engine being measured. Python never caches what it compiles from a zip, so an archive of
sources alone compiles the modules it imports on every call; controller.agent_archive adds each module's pyc for
the controller's Python. This script builds both archives from the project's agent/ (the peer: the pyc entries
removed), answers `progress` on a finished run's events (made here) with each in turn, and prints the CPU time
(user + system, from the kernel's accounting of the child) per call: pairs alternate which archive goes first, and
each pair's ratio is with / without over `--calls` calls of each.

    .venv/bin/python benchmarks/agent_calls.py [--pairs 5] [--calls 20] [--python /usr/bin/python3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from controller import agent_archive

ROOT = Path(__file__).resolve().parents[1]


def source_only(archive: Path, out: Path) -> Path:
    """The same archive less its pyc entries (what hosts got before the bytecode)."""
    with zipfile.ZipFile(archive) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if not info.filename.endswith(".pyc"):
                dst.writestr(info, src.read(info))
    return out


def cpu_per_call(python: str, archive: Path, run: Path, calls: int) -> float:
    """Mean CPU seconds (user + system) of one `progress` call."""
    before = os.times()
    for _ in range(calls):
        subprocess.run([python, str(archive), "progress", "--events", str(run / "events.jsonl"), "--offset", "0",
                        "--state", str(run / "agent.json"), "--wait", "0"], check=True, stdout=subprocess.DEVNULL)
    after = os.times()
    return ((after.children_user - before.children_user) + (after.children_system - before.children_system)) / calls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=5, help="alternated pairs (at least 3)")
    ap.add_argument("--calls", type=int, default=20, help="calls of each archive per pair")
    ap.add_argument("--python", default=sys.executable, help="the host's Python (default: this one)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="agent-calls-") as tmp:
        folder = Path(tmp)
        with_pyc = agent_archive.build(ROOT, folder / "cache")
        without = source_only(with_pyc, folder / "source-only.pyz")
        run = folder / "run"
        run.mkdir()
        events = [{"event": "suite_start", "t": 0}, *({"event": "config_end", "config_id": f"c{i}", "status": "ok"}
                                                      for i in range(20)), {"event": "suite_end"}]
        (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        (run / "agent.json").write_text(json.dumps({"state": "finished", "pid": 1, "run_id": "bench"}))
        print(f"{'pair':>4}  {'with pyc (ms)':>13}  {'without (ms)':>12}  {'ratio':>6}")
        ratios = []
        for k in range(max(args.pairs, 3)):
            order = [with_pyc, without] if k % 2 == 0 else [without, with_pyc]
            cpu = {a: cpu_per_call(args.python, a, run, args.calls) for a in order}
            ratios.append(cpu[with_pyc] / cpu[without])
            print(f"{k + 1:>4}  {cpu[with_pyc] * 1000:>13.1f}  {cpu[without] * 1000:>12.1f}  {ratios[-1]:>6.2f}")
        mean, sd = statistics.mean(ratios), statistics.stdev(ratios)
        sizes = f"{with_pyc.stat().st_size // 1024} KiB against {without.stat().st_size // 1024} KiB"
        print(f"CPU per call, with bytecode / without: {mean:.2f} (sd {sd:.2f} over {len(ratios)} pairs; "
              f"{args.python}, archive {sizes})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

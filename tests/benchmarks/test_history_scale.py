"""The history store's scale benchmark, small: its runs keep the results contract (the report reads them without a
problem), and it times the build, the updates and the queries and judges them against its targets."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.readme import ROOT


def test_the_benchmark_builds_a_set_and_times_the_store_against_its_targets(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "benchmarks/history_scale.py", "--runs", "8", "--rows", "80", "--pairs",
                          "1", "--out", str(tmp_path), "--keep"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    out = res.stdout
    assert "built 8 runs, 640 request rows" in out
    assert re.search(r"pair 0: store build [\d.]+ s, peer .* ratio [\d.]+ .*8 runs; read 8 \(8 new", out), out
    assert "update, nothing changed" in out and "read 0 (0 new, 0 changed), 8 unchanged" in out
    assert "update, one run changed" in out and "read 1 (0 new, 1 changed), 7 unchanged" in out
    assert re.search(r"store build: median [\d.]+ s \(target 60 s\): met", out), out
    assert re.search(r"history query: slowest median [\d.]+ s \(target 1 s\): met", out), out
    # the runs are read by the report as they would be from a host: no damaged file
    report = subprocess.run([sys.executable, "-m", "collector", "report", str(tmp_path / "results" / "run-0003")],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert report.returncode == 0 and "warning" not in report.stderr, report.stderr

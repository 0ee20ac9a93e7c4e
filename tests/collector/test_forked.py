"""The collector's forked pools end, whatever SIGTERM handler their parent had: a pool that closed its workers by
terminating them could stop one while it held the pool's queue lock, and when the parent's handler swallowed
SIGTERM (a test process, a host agent's) the other worker waited on that lock forever and the read never ended
(it hung within 100 pools in 3 of 4 tries). Each reader that forks goes through `collector.forked`."""
from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import json, signal, sys, tempfile
    from pathlib import Path
    signal.signal(signal.SIGTERM, lambda *_: None)  # a parent that swallows SIGTERM
    from collector import forked, request_lines

    def double(x):
        return 2 * x

    for _ in range(100):
        with forked.pool(4) as pool:
            assert pool.map_async(double, range(8), chunksize=1).get() == list(range(0, 16, 2))
    folder = Path(tempfile.mkdtemp())
    row = {"ok": True, "workload": "fib"}
    paths = []
    for i in range(4):
        paths.append(folder / f"{i}.jsonl")
        paths[-1].write_text(json.dumps(row) + "\\n")
    request_lines.PARALLEL_BYTES = 0  # the parallel read, on small files
    for _ in range(20):
        assert len(request_lines.read_all(paths, None)) == 4
    print("ended")
""")


def test_pools_end_in_a_process_that_swallows_sigterm() -> None:
    res = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ended", res.stderr[-3000:]


def test_no_collector_module_makes_a_pool_of_its_own() -> None:
    """Every process pool in collector/ is `forked.pool`'s (a new reader that forks joins the family by using it)."""
    found = []
    for path in sorted((ROOT / "collector").rglob("*.py")):
        if path.name == "forked.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("Pool", "ProcessPoolExecutor"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []

"""Integration fixtures: real ansible-playbook runs against the real CPU engine on this machine."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ENGINE_PY = ROOT / ".cache/engine-venv/bin/python"
MODELS = ROOT / ".cache/models"


def reduced_matrix(configs: list[dict[str, Any]], **sweep: Any) -> dict[str, Any]:
    grid = {"workloads": ["fib", "json"], "max_tokens": [32], "context_tokens": [0, 256], "concurrency": [1, 2]}
    grid.update(sweep)
    return {"bench_phases": [{"name": "tp1", "tp": 1, "configs": configs, "sweeps": [grid]}],
            "bench_repetitions": 2}


class Bench:
    """ansible-playbook bench.yml -l local with its own host folder and controller results folder."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.host_dir = tmp / "host"
        self.results = tmp / "results"

    def vars_file(self, extra: dict[str, Any], local: bool) -> Path:
        """Extra vars: this test's controller results folder and, on this machine, its own host folder
        (remote hosts keep their default folder)."""
        path = self.tmp / f"vars-{len(list(self.tmp.glob('vars-*')))}.yml"
        own = {"bench_controller_results": str(self.results)}
        if local:
            own["bench_host_dir"] = str(self.host_dir)
        path.write_text(yaml.safe_dump({**own, **extra}))
        return path

    def command(self, extra: dict[str, Any], *args: str, limit: str = "local") -> list[str]:
        return [str(BIN / "ansible-playbook"), "bench.yml", "-l", limit, "-e",
                f"@{self.vars_file(extra, limit == 'local')}", *args]

    def env(self) -> dict[str, str]:
        return {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", "ANSIBLE_NOCOLOR": "1",
                "ANSIBLE_FORCE_COLOR": "0", "PYTHONUNBUFFERED": "1"}

    def run(self, extra: dict[str, Any], *args: str, limit: str = "local",
            timeout: float = 900) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(extra, *args, limit=limit), cwd=ROOT, env=self.env(),
                              capture_output=True, text=True, timeout=timeout)

    def start(self, extra: dict[str, Any], *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(self.command(extra, *args), cwd=ROOT, env=self.env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    def host_run(self, run_id: str) -> Path:
        return self.host_dir / "results" / run_id / "local"

    def events(self, run_id: str) -> list[dict[str, Any]]:
        path = self.host_run(run_id) / "events.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _kill_leftovers(marker: str) -> None:
    """Kill any agent or engine process started under this test's folder (none should be left)."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmd and int(proc.name) != os.getpid():
            try:
                os.kill(int(proc.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture(scope="session", autouse=True)
def engine_ready() -> None:
    if not ENGINE_PY.exists() or not (MODELS / "target/config.json").exists():
        pytest.fail("the CPU engine and tiny models are missing: run `make engine models` first")


@pytest.fixture
def bench(tmp_path: Path):
    b = Bench(tmp_path)
    yield b
    _kill_leftovers(str(tmp_path))


@pytest.fixture(scope="module")
def module_bench(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("bench")
    b = Bench(tmp)
    yield b
    _kill_leftovers(str(tmp))

"""Integration fixtures: real ansible-playbook runs on this machine, against the real CPU engine where the claim is
the engine's and the stand-in engine (tests/standin) where it is specfleet's, and the two test hosts
(systemd-nspawn machines) that the test-host tests share."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from tests import playbook
from tests.conftest import short_tmp
from tests.hosts.testhosts import TestHosts
from tests.readme import typed
from tests.standin import write_python

ROOT = playbook.ROOT
BIN = playbook.BIN
ENGINE_PY = ROOT / ".cache/engine-venv/bin/python"
MODELS = ROOT / ".cache/models"
WHEELHOUSE = ROOT / ".cache/wheelhouse"
LOCAL_HOSTS = ("local", "local-llamacpp")  # the inventory's hosts on this machine (vLLM, llama.cpp)


def reduced_matrix(configs: list[dict[str, Any]], **sweep: Any) -> dict[str, Any]:
    grid = {"workloads": ["fib", "json"], "max_tokens": [32], "context_tokens": [0, 256], "concurrency": [1, 2]}
    grid.update(sweep)
    return {"bench_phases": [{"name": "tp1", "tp": 1, "configs": configs, "sweeps": [grid]}],
            "bench_repetitions": 2}


class Bench:
    """ansible-playbook bench.yml -l local (or another host) with its own host folder and controller results
    folder."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        # short: vLLM's IPC sockets live in <host_dir>/tmp/<uuid>, and a Unix socket path holds 107 bytes at most
        self.host_dir = tmp / "h"
        self.results = tmp / "results"

    def vars_file(self, extra: dict[str, Any], local: bool) -> Path:
        """Extra vars: this test's controller results folder and, on this machine, its own host folder and machine
        lock (remote hosts keep their defaults): a test's suite does not wait for the turns of another test's."""
        path = self.tmp / f"vars-{len(list(self.tmp.glob('vars-*')))}.yml"
        # no plots: no test of this helper looks at them (the demo's tests do), and drawing them costs seconds a run
        own: dict[str, Any] = {"bench_controller_results": str(self.results), "bench_report_plots": False}
        if local:
            own["bench_host_dir"] = str(self.host_dir)
            own["bench_machine_lock"] = str(self.tmp / "machine.lock")
        path.write_text(yaml.safe_dump({**own, **extra}))
        return path

    def args(self, extra: dict[str, Any], *args: str, limit: str = "local") -> list[str]:
        return ["bench.yml", "-l", limit, "-e", f"@{self.vars_file(extra, limit in LOCAL_HOSTS)}", *args]

    def run(self, extra: dict[str, Any], *args: str, limit: str = "local",
            timeout: float = 900) -> subprocess.CompletedProcess[str]:
        return playbook.play(self.args(extra, *args, limit=limit), timeout=timeout).proc

    def start(self, extra: dict[str, Any], *args: str) -> subprocess.Popen[str]:
        return playbook.start(self.args(extra, *args))

    def standin(self, **env: str) -> dict[str, str]:
        """Extra vars that make the stand-in engine (tests/standin) every server of the run, with these knobs for
        all of them (a config's own `env` adds more)."""
        return {"bench_engine_python": str(write_python(self.tmp / "standin", env))}

    def host_run(self, run_id: str, host: str = "local") -> Path:
        return self.host_dir / "results" / run_id / host

    def seed_engine_help(self, kept: Path) -> None:
        """This host folder's engine cache starts with the engine's `--help` as a host keeps it after one run
        (agent/probe.py): a test whose claim is not reading it does not pay the seconds of reading it again."""
        (self.host_dir / "cache").mkdir(parents=True, exist_ok=True)
        shutil.copy(kept, self.host_dir / "cache" / kept.name)

    def events(self, run_id: str, host: str = "local") -> list[dict[str, Any]]:
        path = self.host_run(run_id, host) / "events.jsonl"
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


# What each real engine's tests need built, and the make targets that build it (`engine` marks vLLM's by default,
# `engine("llamacpp")` llama.cpp's).
ENGINE_BUILT = {
    "vllm": ((ENGINE_PY, MODELS / "target/config.json"), "make engine models"),
    "llamacpp": ((ROOT / ".cache/llama.cpp/llama-server", MODELS / "gguf/.built"), "make llamacpp gguf-models"),
}


@pytest.fixture(autouse=True)
def engine_ready(request: pytest.FixtureRequest) -> None:
    """Tests marked `engine` run a real engine on this machine: it and its tiny models must be built."""
    marker = request.node.get_closest_marker("engine")
    if marker:
        name = marker.args[0] if marker.args else "vllm"
        paths, make = ENGINE_BUILT[name]
        if not all(p.exists() for p in paths):
            pytest.fail(f"{name} and its tiny models are missing: run `{make}` first")


@pytest.fixture
def bench() -> Iterator[Bench]:
    with short_tmp() as tmp:
        b = Bench(tmp)
        yield b
        _kill_leftovers(str(tmp))


@pytest.fixture(scope="module")
def module_bench() -> Iterator[Bench]:
    with short_tmp() as tmp:
        b = Bench(tmp)
        yield b
        _kill_leftovers(str(tmp))


@pytest.fixture(scope="session")
def testhosts() -> Iterator[TestHosts]:
    """The test-hosts block of the README as typed, once for every test that uses th1 and th2:
    `make testhosts`, then the engine role twice (the second run changes nothing); `make testhosts-down` at the end."""
    if not (WHEELHOUSE / ".complete").exists():
        pytest.fail("the offline wheelhouse is missing: run `make wheelhouse` first")
    try:
        up = typed("make testhosts", timeout=900)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        th = TestHosts(ROOT / ".work/testhosts")  # the state `make testhosts` wrote: ssh into th1, th2
        for _attempt in ("install", "again"):
            res = typed("ansible-playbook playbooks/engine.yml -l testhosts", timeout=900)
            assert res.returncode == 0, res.stdout[-3000:]
        assert re.search(r"th1\s+: ok=\d+\s+changed=0 ", res.stdout), res.stdout[-1500:]
        assert re.search(r"th2\s+: ok=\d+\s+changed=0 ", res.stdout), res.stdout[-1500:]
        yield th
    finally:
        down = subprocess.run(["make", "testhosts-down"], cwd=ROOT, capture_output=True, text=True, timeout=300)
        if down.returncode != 0:  # reported, without hiding a failure of the setup above
            print("make testhosts-down failed:", down.stdout[-2000:], down.stderr[-2000:])

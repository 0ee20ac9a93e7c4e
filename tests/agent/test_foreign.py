"""agent.foreign: what else runs on the host, read from the real /proc (real processes started by the test) and
from nvidia-smi's compute-apps answer: another engine by its command line, another run's server by its mark, a
GPU process; never this config's server or a server of this run."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from agent import foreign
from agent.leftovers import MARK

SLEEP = "import sys, time; time.sleep(60)"


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait(timeout=30)


def start(procs: list[subprocess.Popen[bytes]], *args: str, mark: str | None = None) -> int:
    env = {"PATH": "/usr/bin:/bin", **({MARK: mark} if mark else {})}
    p = subprocess.Popen([sys.executable, "-c", SLEEP, *args], env=env)
    procs.append(p)
    end = time.monotonic() + 30  # until it has exec'd: before that /proc shows the parent's command line
    while SLEEP.encode() not in Path(f"/proc/{p.pid}/cmdline").read_bytes():
        assert time.monotonic() < end, "the process did not start"
        time.sleep(0.01)
    return p.pid


@pytest.mark.parametrize("argv", [
    ["-m", "vllm.entrypoints.openai.api_server", "--model", "m"], ["vllm", "serve", "m"],
    ["-m", "sglang.launch_server", "--model-path", "m"], ["text-generation-launcher", "--model-id", "m"],
    ["llama-server", "-m", "m.gguf"], ["ollama", "serve"], ["tritonserver", "--model-repository=/m"],
    ["lmdeploy", "serve", "api_server", "m"], ["trtllm-serve", "m"],
])
def test_other_engines_are_found_by_their_command_line(started: list[subprocess.Popen[bytes]],
                                                        argv: list[str]) -> None:
    pid = start(started, *argv)
    quiet = start(started, "--model", "m")  # a plain process with an engine-like flag is not an engine
    found = {p["pid"]: p for p in foreign.scan(lambda _: False, "run-a", compute_apps="")}
    assert found[pid]["why"] == "engine" and found[pid]["cmd"].endswith(" ".join(argv))
    assert quiet not in found


def test_marks_of_another_run_are_foreign_and_this_runs_own_are_not(started: list[subprocess.Popen[bytes]]) -> None:
    other = start(started, mark="run-b/tp1-dflash/abc123")
    mine = start(started, "-m", "vllm.entrypoints.openai.api_server", mark="run-a/tp1-ngram/def456")  # a neighbour
    owned = start(started, "-m", "vllm.entrypoints.openai.api_server")  # this config's server
    found = {p["pid"]: p for p in foreign.scan(lambda pid: pid == owned, "run-a", compute_apps="")}
    assert found[other]["why"] == "specfleet" and found[other]["run"] == "run-b"
    assert mine not in found and owned not in found


# Listeners of every kind, each a real process with a real socket: (what it serves, on which address, foreign?)
SERVE = r"""
import http.server, json, socket, sys, time
kind, host = sys.argv[1], sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = {"openai": {"object": "list", "data": [{"id": "m", "object": "model"}]},
                "other-json": {"status": "ok"}}.get(kind)
        if kind == "error" or body is None:
            self.send_error(404); return
        data = json.dumps(body).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(data))); self.end_headers()
        self.wfile.write(data)
    def log_message(self, *a): pass
if kind in ("silent", "banner"):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family); s.bind((host, 0)); s.listen(8)
    print(s.getsockname()[1], flush=True)
    while True:
        c, _ = s.accept()
        if kind == "banner":
            c.sendall(b"SSH-2.0-OpenSSH_9.2\r\n"); c.close()
else:
    class S(http.server.ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
    srv = S((host, 0), H)
    print(srv.server_address[1], flush=True)
    srv.serve_forever()
"""
LISTENERS = [("openai", "127.0.0.1", True), ("openai", "0.0.0.0", True), ("openai", "::1", True),
             ("openai", "::", True), ("other-json", "127.0.0.1", False), ("error", "127.0.0.1", False),
             ("banner", "127.0.0.1", False), ("silent", "127.0.0.1", False)]


@pytest.mark.parametrize("kind, host, is_foreign", LISTENERS)
def test_a_listener_is_foreign_when_it_answers_as_an_openai_style_server(
        started: list[subprocess.Popen[bytes]], kind: str, host: str, is_foreign: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever its command line: a process listening on a TCP port (any address, IPv4 or IPv6) that answers
    `GET /v1/models` with a model list is an engine; an HTTP server of another kind, an error, a non-HTTP banner
    or a listener that never answers is not (the last within the probe's deadline). This config's server and a
    server of this run are never foreign."""
    p = subprocess.Popen([sys.executable, "-c", SERVE, kind, host], stdout=subprocess.PIPE)
    started.append(p)
    assert p.stdout is not None
    port = int(p.stdout.readline())
    if is_foreign:  # its answer is waited for however slow the machine (the probe's 0.5 s is the scan's pace)
        probe = foreign.openai_style

        def patient(address: str, at: int, timeout: float = 0.5) -> bool:
            return probe(address, at, 60.0 if at == port else timeout)
        monkeypatch.setattr(foreign, "openai_style", patient)
    t0 = time.monotonic()
    found = {q["pid"]: q for q in foreign.scan(lambda _: False, "run-a", compute_apps="")}
    assert (p.pid in found) == is_foreign, found.get(p.pid)
    if is_foreign:
        assert found[p.pid]["why"] == "openai" and found[p.pid]["port"] == port and SERVE[:20] in found[p.pid]["cmd"]
        assert p.pid not in {q["pid"] for q in foreign.scan(lambda pid: pid == p.pid, "run-a", compute_apps="")}
    assert time.monotonic() - t0 < 120  # a hang detector: a listener that never answers does not hold the scan


def test_a_daemon_of_another_runtime_is_never_asked(started: list[subprocess.Popen[bytes]], tmp_path: Path) -> None:
    """Only processes of a serving runtime (Python, uvicorn, Node, ...) are asked for their models: the same
    OpenAI-style server run as `redis-server` (a copy of the interpreter under that name) is sent nothing."""
    daemon = tmp_path / "redis-server"
    shutil.copy(sys.executable, daemon)
    p = subprocess.Popen([str(daemon), "-c", SERVE, "openai", "127.0.0.1"], stdout=subprocess.PIPE,
                         env={**os.environ, "PYTHONHOME": sys.base_prefix})
    started.append(p)
    assert p.stdout is not None and int(p.stdout.readline()) > 0
    assert p.pid not in {q["pid"] for q in foreign.scan(lambda _: False, "run-a", compute_apps="")}


def test_gpu_compute_processes_from_nvidia_smi(started: list[subprocess.Popen[bytes]]) -> None:
    mine = start(started, mark="run-a/tp1-x/1")
    apps = f"99999999, /usr/bin/python3, 30512\n{mine}, python3, 1024\n7, [Not Found], [N/A]\nnot, a, line\n\n"
    found = {p["pid"]: p for p in foreign.scan(lambda pid: pid == 7, "run-a", compute_apps=apps)}
    assert found[99999999] == {"pid": 99999999, "why": "gpu", "cmd": "/usr/bin/python3", "used_mib": 30512}
    assert mine not in found and 7 not in found


def test_merge_keeps_each_process_once_with_the_moments_it_was_there() -> None:
    a = {"pid": 5, "why": "engine", "cmd": "vllm serve m"}
    seen = foreign.merge([], [a], "before")
    seen = foreign.merge(seen, [a, {"pid": 3, "why": "gpu", "cmd": "x"}], "timed")
    assert [(p["pid"], p["when"]) for p in seen] == [(3, ["timed"]), (5, ["before", "timed"])]
    assert foreign.merge(seen, [a], "timed") == seen


def test_a_proc_tree_that_vanishes_midway_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "12").mkdir()  # a process gone between the listing and the read: no cmdline file
    (tmp_path / "13").mkdir()
    (tmp_path / "13" / "cmdline").write_bytes(b"python3\0-m\0sglang.launch_server\0")
    found = foreign.scan(lambda _: False, "r", proc=tmp_path, compute_apps="")
    assert [(p["pid"], p["why"]) for p in found] == [(13, "engine")]

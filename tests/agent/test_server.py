"""The process backend with real processes: readiness, crash detection, stop and release."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agent.server import ProcessServer, StartupFailed, _group_alive, free_port, port_in_use

# A minimal HTTP server: /health answers 200 once READY (a file, or "-": at once) exists, 503 before, and logs
# each answer. With STUBBORN_CHILD it also forks a child in its process group that ignores SIGTERM.
SERVER = r"""
import http.server, os, signal, sys, time
port, ready = int(sys.argv[1]), sys.argv[2]
if os.environ.get("STUBBORN_CHILD") and os.fork() == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(1)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        code = 200 if ready == "-" or os.path.exists(ready) else 503
        print("request", self.path, code, flush=True)
        self.send_response(code)
        self.end_headers()
    def log_message(self, *a):
        pass
srv = http.server.HTTPServer(("127.0.0.1", port), H)
print("listening", port, flush=True)
srv.serve_forever()
"""


def make(tmp_path: Path, argv_tail: list[str], env: dict[str, str] | None = None) -> ProcessServer:
    port = free_port()
    argv = [sys.executable, "-c", SERVER, str(port), *argv_tail]
    return ProcessServer(argv, {**os.environ, **(env or {})}, tmp_path / "server.log", port)


def test_ready_then_stop_frees_port_and_group(tmp_path: Path) -> None:
    """Not ready while /health answers 503 (it asked twice and waits on); ready once it answers 200, with the
    seconds it waited; stopped, the port and the process group are gone."""
    latch = tmp_path / "ready"
    s = make(tmp_path, [str(latch)])
    s.start()
    with ThreadPoolExecutor(1) as pool:
        t0 = time.monotonic()
        waiting = pool.submit(s.wait_ready, "/health", 60)
        end = time.monotonic() + 30
        while (tmp_path / "server.log").read_text().count("request /health 503") < 2:
            assert time.monotonic() < end and not waiting.done(), (tmp_path / "server.log").read_text()
            time.sleep(0.02)
        assert not waiting.done()  # two answers of 503 and still waiting
        latch.touch()
        ready = waiting.result(timeout=60)
        took = time.monotonic() - t0
    assert 0 < ready <= took
    assert "request /health 200" in (tmp_path / "server.log").read_text()
    assert port_in_use(s.port)
    pid = s.pid
    s.stop(10)
    assert not _group_alive(pid) and not port_in_use(s.port)
    assert "listening" in (tmp_path / "server.log").read_text()


def test_exit_during_startup_is_detected_at_once(tmp_path: Path) -> None:
    s = ProcessServer([sys.executable, "-c", "import time, sys; time.sleep(0.5); print('fatal: boom'); sys.exit(3)"],
                      dict(os.environ), tmp_path / "server.log", free_port())
    s.start()
    t0 = time.monotonic()
    with pytest.raises(StartupFailed) as exc:
        s.wait_ready("/health", 60)
    assert exc.value.reason == "crashed" and "code 3" in exc.value.detail
    assert time.monotonic() - t0 < 30  # a hang detector: the exit ends the wait, not its deadline of 60 s
    assert "fatal: boom" in (tmp_path / "server.log").read_text()


def test_never_healthy_times_out_at_the_deadline(tmp_path: Path) -> None:
    s = make(tmp_path, [str(tmp_path / "never")])
    s.start()
    t0 = time.monotonic()
    with pytest.raises(StartupFailed) as exc:
        s.wait_ready("/health", 1.5)
    elapsed = time.monotonic() - t0
    s.stop(5)
    assert exc.value.reason == "health_timeout"
    assert elapsed >= 1.5  # not before its deadline
    assert elapsed < 30  # a hang detector: it gives up (a poll in flight at the deadline may add its own 2 s)


def test_stubborn_group_member_is_killed(tmp_path: Path) -> None:
    s = make(tmp_path, ["-"], {"STUBBORN_CHILD": "1"})
    s.start()
    s.wait_ready("/health", 30)
    pgid = s.pid
    t0 = time.monotonic()
    s.stop(1.0)  # SIGTERM ends the leader; the child ignores it and needs SIGKILL
    assert not _group_alive(pgid)
    assert time.monotonic() - t0 < 30  # a hang detector: the kill after 1 s, not a wait for the child


def test_port_already_taken_is_refused_before_start(tmp_path: Path) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        s = ProcessServer([sys.executable, "-c", "pass"], dict(os.environ), tmp_path / "server.log", port)
        with pytest.raises(StartupFailed) as exc:
            s.start()
        assert exc.value.reason == "port_in_use"
        assert s.proc is None
        other.getsockname()  # the other process's socket is untouched


def test_port_taken_after_the_check_is_not_mistaken_for_our_server(tmp_path: Path) -> None:
    """Another program binds the port between the check and the engine's bind, and answers /health:
    readiness is refused because the listener is not in the server's process group."""
    port = free_port()
    s = ProcessServer([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ),
                      tmp_path / "server.log", port)
    s.start()  # the port is free now; our "engine" never binds it
    other = subprocess.Popen([sys.executable, "-c", SERVER, str(port), "-"], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout and other.stdout.readline().startswith("listening")
        with pytest.raises(StartupFailed) as exc:
            s.wait_ready("/health", 10)
        assert exc.value.reason == "port_in_use" and str(other.pid) in exc.value.detail
        assert other.poll() is None  # the other program is left alone
    finally:
        s.stop(5)
        other.kill()
        other.wait()

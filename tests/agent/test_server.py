"""The process backend with real processes: readiness, crash detection, stop and release."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.server import ProcessServer, StartupFailed, _group_alive, free_port, port_in_use

# A minimal HTTP server: /health answers 503 until READY_AFTER seconds, then 200. With
# STUBBORN_CHILD it also forks a child in its process group that ignores SIGTERM.
SERVER = r"""
import http.server, os, signal, sys, time
port, ready_after = int(sys.argv[1]), float(sys.argv[2])
t0 = time.monotonic()
if os.environ.get("STUBBORN_CHILD") and os.fork() == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(1)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if time.monotonic() - t0 >= ready_after else 503)
        self.end_headers()
    def log_message(self, *a):
        print("request", self.path, flush=True)
print("listening", port, flush=True)
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def make(tmp_path: Path, argv_tail: list[str], env: dict[str, str] | None = None) -> ProcessServer:
    port = free_port()
    argv = [sys.executable, "-c", SERVER, str(port), *argv_tail]
    return ProcessServer(argv, {**os.environ, **(env or {})}, tmp_path / "server.log", port)


def test_ready_then_stop_frees_port_and_group(tmp_path: Path) -> None:
    s = make(tmp_path, ["0.5"])
    s.start()
    ready = s.wait_ready("/health", 30)
    assert 0.5 <= ready < 10
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
    assert time.monotonic() - t0 < 2.5  # within 2 s of the exit, not at the 60 s deadline
    assert "fatal: boom" in (tmp_path / "server.log").read_text()


def test_never_healthy_times_out_at_the_deadline(tmp_path: Path) -> None:
    s = make(tmp_path, ["1000"])
    s.start()
    t0 = time.monotonic()
    with pytest.raises(StartupFailed) as exc:
        s.wait_ready("/health", 1.5)
    elapsed = time.monotonic() - t0
    s.stop(5)
    assert exc.value.reason == "health_timeout"
    assert 1.5 <= elapsed < 5


def test_stubborn_group_member_is_killed(tmp_path: Path) -> None:
    s = make(tmp_path, ["0"], {"STUBBORN_CHILD": "1"})
    s.start()
    s.wait_ready("/health", 30)
    pgid = s.pid
    t0 = time.monotonic()
    s.stop(1.0)  # SIGTERM ends the leader; the child ignores it and needs SIGKILL
    assert not _group_alive(pgid)
    assert time.monotonic() - t0 < 10


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
    other = subprocess.Popen([sys.executable, "-c", SERVER, str(port), "0"], stdout=subprocess.PIPE, text=True)
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

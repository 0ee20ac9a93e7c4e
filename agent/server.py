"""Server lifecycle: start one engine server, wait until it is ready, stop it and verify release.

`ProcessServer` runs the engine as a child in its own process group with its whole output in
`server.log`. Another backend (a systemd unit, say) implements the same four methods.
Every wait polls a real condition against a deadline.
"""
from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, Protocol

from .classify import Reason
from .logbound import DEFAULT_MAX_BYTES, BoundedLog
from .sweep import MARK, stat_fields, sweep

POLL_S = 0.25


class StartupFailed(Exception):
    """The server did not become ready; `reason` is the classified word."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class Backend(Protocol):
    """What the suite needs from a way of running a server (a child process group, a systemd unit)."""

    port: int
    log_path: Path
    pid: int | None
    survivors: list[dict[str, object]]  # marked processes that outlived the stop, killed by it

    def start(self) -> None: ...
    def wait_ready(self, health_path: str, deadline_s: float) -> float: ...
    def alive(self) -> bool: ...
    def stop(self, deadline_s: float) -> None: ...
    def log_text(self) -> str: ...
    def exit_detail(self) -> str: ...


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def wait_until(cond: Callable[[], bool], deadline_s: float, interval: float = POLL_S) -> bool:
    end = time.monotonic() + deadline_s
    while True:
        if cond():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(interval)


def connect_host(bind_host: str) -> str:
    """Where the client reaches a server bound to `bind_host` (a wildcard bind is reached on loopback)."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(bind_host, bind_host)


def http_status(port: int, path: str, host: str = "127.0.0.1", timeout: float = 5.0,
                headers: dict[str, str] | None = None) -> int | None:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


class ProcessServer:
    """The engine as a child process group of the agent."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path, port: int,
                 host: str = "127.0.0.1", headers: dict[str, str] | None = None,
                 log_max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.argv, self.env, self.log_path, self.port, self.host = argv, env, log_path, port, host
        self.headers = headers or {}
        self.log_max_bytes = log_max_bytes
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: BoundedLog | None = None
        self.survivors: list[dict[str, object]] = []

    def start(self) -> None:
        if port_in_use(self.port, self.host):
            raise StartupFailed(Reason.PORT_IN_USE, f"port {self.port} on {self.host} is already taken")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = BoundedLog(self.log_path, self.log_max_bytes)
        try:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            self.log.close()
            raise
        assert self.proc.stdout is not None
        self.log.pump(self.proc.stdout)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        if self.log is not None:
            if not self.alive():
                self.log.drain(2.0)  # the last output of a dead server may still be in the pipe
            return self.log.text()
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def exit_detail(self) -> str:
        return f"exited with code {self.proc.returncode if self.proc else None}"

    def wait_ready(self, health_path: str, deadline_s: float) -> float:
        """Seconds from launch to a 200 on the health endpoint; fails at once if the process exits."""
        t0 = time.monotonic()
        end = t0 + deadline_s
        while True:
            if not self.alive():
                code = self.proc.returncode if self.proc else None
                raise StartupFailed(Reason.CRASHED, f"server exited with code {code} during startup")
            if http_status(self.port, health_path, self.host, 2.0, self.headers) == 200:
                holders = listener_pids(self.port)
                if holders and not any(_pgid(p) == self.proc.pid for p in holders):
                    raise StartupFailed(Reason.PORT_IN_USE, f"port {self.port} answers, but from pid(s) "
                                                       f"{sorted(holders)}, not this server")
                return time.monotonic() - t0
            if time.monotonic() >= end:
                raise StartupFailed(Reason.HEALTH_TIMEOUT, f"{health_path} not 200 within {deadline_s:.0f} s")
            time.sleep(POLL_S)

    def stop(self, deadline_s: float) -> None:
        """SIGTERM the group, SIGKILL it after the deadline, then verify process and port are gone; kill what
        left the group but carries the config's mark; close the log."""
        if self.proc is None:
            return
        try:
            self._stop_group(deadline_s)
        finally:
            if self.env.get(MARK):
                self.survivors = sweep(self.env[MARK])
            if self.log is not None:
                self.log.close()

    def _stop_group(self, deadline_s: float) -> None:
        assert self.proc is not None
        pgid = self.proc.pid
        _signal_group(pgid, signal.SIGTERM)
        _signal_group(pgid, signal.SIGCONT)  # a stopped (frozen) server handles the SIGTERM only once resumed
        try:
            self.proc.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            pass
        # The leader may be gone while workers of its group still hold memory or the port.
        if not wait_until(lambda: not _group_alive(pgid), 1.0 if self.proc.returncode is not None else 0):
            _signal_group(pgid, signal.SIGKILL)
            self.proc.wait(timeout=30)
            if not wait_until(lambda: not _group_alive(pgid), 30):
                raise RuntimeError(f"process group {pgid} survived SIGKILL")
        if not wait_until(lambda: not port_in_use(self.port, self.host)
                          or not any(_pgid(p) == pgid for p in listener_pids(self.port)), 30):
            raise RuntimeError(f"port {self.port} still in use after the server stopped")


def listener_pids(port: int) -> set[int]:
    """Processes holding a listening TCP socket on `port` (from /proc; those this user can see)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{f[9]}]")
    pids = set()
    if not inodes:
        return pids
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            for fd in fd_dir.iterdir():
                if os.readlink(fd) in inodes:
                    pids.add(int(fd_dir.parent.name))
                    break
        except OSError:
            continue
    return pids


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is left in the group; reaps our own zombies."""
    _reap(pgid)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = stat_fields(stat)
        if fields and len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def _reap(pgid: int) -> None:
    """Collect exited members of the group that were re-parented to us (see `become_subreaper`)."""
    while True:
        try:
            pid, _ = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def become_subreaper() -> None:
    """Adopt orphaned engine workers so they can be reaped and waited for (Linux prctl)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass

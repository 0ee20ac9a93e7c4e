"""Server lifecycle: start one engine server, wait until it is ready, stop it and verify release.

`Server` is the lifecycle every backend shares (a context manager: start on entry, stop on exit; the
readiness wait and the "this listener is ours" check). `ProcessServer` runs the engine as a child in its
own process group with its whole output in `server.log`; `systemd.SystemdServer` runs it as a unit.
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
from typing import Callable

from .classify import Reason
from .leftovers import MARK, kill_leftovers, stat_fields
from .logbound import DEFAULT_MAX_BYTES, BoundedLog

POLL_S = 0.25


class StartupFailed(Exception):
    """The server did not become ready; `reason` is the classified word."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class HeldBack(Exception):
    """The server is not to be used after all (a packed phase's baseline failed while it started)."""


class Server:
    """One engine server, as a context manager: entering starts it, leaving stops it (errors of the stop are
    kept in `stop_error`, its duration in `stop_s`). `wait_ready` and the port checks are shared; a backend
    supplies how to start, stop and observe its process and which pids are its own (`owns`)."""

    port: int
    host: str
    headers: dict[str, str]
    log_path: Path
    pid: int | None
    stop_deadline_s: float = 60.0
    survivors: list[dict[str, object]]  # marked processes that outlived the stop, killed by it
    stop_error: str | None = None
    stop_s: float = 0.0

    # -- what a backend implements -------------------------------------------------------------
    def start(self) -> None: raise NotImplementedError
    def stop(self, deadline_s: float) -> None: raise NotImplementedError
    def alive(self) -> bool: raise NotImplementedError
    def owns(self, pid: int) -> bool: raise NotImplementedError
    def startup_failure(self) -> str | None: raise NotImplementedError
    def log_text(self) -> str: raise NotImplementedError
    def exit_detail(self) -> str: raise NotImplementedError

    # -- shared ----------------------------------------------------------------------------------
    def __enter__(self) -> Server:
        try:
            self.start()
        except BaseException:
            self.__exit__(None, None, None)  # a half-started server is stopped and swept all the same
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        t0 = time.monotonic()
        try:
            self.stop(self.stop_deadline_s)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:  # e.g. systemctl or journalctl hung
            self.stop_error = f"{type(err).__name__}: {err}" if not isinstance(err, RuntimeError) else str(err)
        self.stop_s = time.monotonic() - t0

    def check_port_free(self) -> None:
        if port_in_use(self.port, self.host):
            raise StartupFailed(Reason.PORT_IN_USE, f"port {self.port} on {self.host} is already taken")

    def wait_ready(self, health_path: str, deadline_s: float, held_back: Callable[[], bool] = lambda: False) -> float:
        """Seconds from now to a 200 on the health endpoint from this server's own listener; fails at once
        when the server dies, when another program answers on the port, or at the deadline; raises HeldBack
        as soon as `held_back()` is true."""
        t0 = time.monotonic()
        end = t0 + deadline_s
        while True:
            if held_back():
                raise HeldBack()
            dead = self.startup_failure()
            if dead:
                raise StartupFailed(Reason.CRASHED, dead)
            if http_status(self.port, health_path, self.host, 2.0, self.headers) == 200:
                holders = listener_pids(self.port)
                if holders and not any(self.owns(p) for p in holders):
                    raise StartupFailed(Reason.PORT_IN_USE, f"port {self.port} answers, but from pid(s) "
                                                            f"{sorted(holders)}, not this server")
                return time.monotonic() - t0
            if time.monotonic() >= end:
                raise StartupFailed(Reason.HEALTH_TIMEOUT, f"{health_path} not 200 within {deadline_s:.0f} s")
            time.sleep(POLL_S)

    def wait_port_released(self, deadline_s: float = 30) -> None:
        """The port free, or held by nobody of this server (another program may have taken it since)."""
        if not wait_until(lambda: not port_in_use(self.port, self.host)
                          or not any(self.owns(p) for p in listener_pids(self.port)), deadline_s):
            raise RuntimeError(f"port {self.port} still in use after the server stopped")


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


class ProcessServer(Server):
    """The engine as a child process group of the agent."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path, port: int,
                 host: str = "127.0.0.1", headers: dict[str, str] | None = None,
                 log_max_bytes: int = DEFAULT_MAX_BYTES, stop_deadline_s: float = 60.0) -> None:
        self.argv, self.env, self.log_path, self.port, self.host = argv, env, log_path, port, host
        self.headers = headers or {}
        self.log_max_bytes = log_max_bytes
        self.stop_deadline_s = stop_deadline_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: BoundedLog | None = None
        self.survivors: list[dict[str, object]] = []

    def start(self) -> None:
        self.check_port_free()
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

    def owns(self, pid: int) -> bool:
        return self.proc is not None and _pgid(pid) == self.proc.pid

    def startup_failure(self) -> str | None:
        if self.alive():
            return None
        return f"server exited with code {self.proc.returncode if self.proc else None} during startup"

    def stop(self, deadline_s: float) -> None:
        """SIGTERM the group, SIGKILL it after the deadline, then verify process and port are gone; kill what
        left the group but carries the config's mark; close the log."""
        if self.proc is None:
            return
        try:
            self._stop_group(deadline_s)
        finally:
            if self.env.get(MARK):
                self.survivors = kill_leftovers(self.env[MARK])
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
        self.wait_port_released()


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

"""Processes that outlive their config: found by a mark in their environment, killed, and reported.

Every server is started with `SPECFLEET_CONFIG=<mark>` in its environment, which its children inherit,
including those that leave its process group (`setsid`, daemonising helpers) or its unit. After the
server is stopped, any process still carrying the mark would hold memory, a GPU or a port into the
next config: it is SIGKILLed and listed in the config's status.json. A process that clears its own
environment cannot be found this way.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

MARK = "SPECFLEET_CONFIG"
POLL_S = 0.05


def marked(mark: str) -> list[int]:
    """Live processes whose environment holds MARK=mark (those this user may read)."""
    needle = f"{MARK}={mark}".encode()
    own = os.getpid()
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        pid = int(proc.name)
        if pid == own:
            continue
        try:
            if needle in (proc / "environ").read_bytes().split(b"\0") and not _zombie(pid):
                pids.append(pid)
        except OSError:
            continue
    return sorted(pids)


def stat_fields(stat: Path) -> list[str] | None:
    """The fields of a /proc/<pid>/stat after the command name (state, ppid, pgrp, ...); None when gone."""
    try:
        data = stat.read_text()
    except OSError:
        return None
    return data[data.rfind(")") + 2:].split()


def _zombie(pid: int) -> bool:
    fields = stat_fields(Path(f"/proc/{pid}/stat"))
    return not fields or fields[0] in ("Z", "X")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def kill_leftovers(mark: str, deadline_s: float = 10.0) -> list[dict[str, Any]]:
    """Kill every process still marked with `mark`; [{pid, cmdline, gone}] of those found."""
    found = [{"pid": pid, "cmdline": _cmdline(pid)[:300]} for pid in marked(mark)]
    for entry in found:
        try:
            os.kill(entry["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass
    end = time.monotonic() + deadline_s
    left = [e["pid"] for e in found]
    while left and time.monotonic() < end:
        for pid in left:
            _reap(pid)  # adopted by the agent (a subreaper): collect it
        left = [pid for pid in left if not _zombie(pid)]
        if left:
            time.sleep(POLL_S)
    for entry in found:
        entry["gone"] = entry["pid"] not in left
    return found

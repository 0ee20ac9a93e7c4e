"""`python -m agent progress`: what the controller reads on each poll of a running suite — the complete
event lines after an offset, the agent's state file, whether its process lives, the starts that were refused
because another held the run (`attached`: invocation → the invocation to follow) and the free space of the
results filesystem — as one JSON object on stdout. With `--wait S` it answers as soon as a new whole line is
there or the agent's process is gone, and after S seconds at the latest: the controller asks once per event,
not once per interval."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable

ATTACH = "agent.attach.jsonl"  # beside the state file: one line per start refused because the run was held


def wait(events: Path, offset: int, state_path: Path, wait_s: float, every_s: float = 0.2,
         clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """`read`, once there is news (a new whole line, or the agent's process gone) or `wait_s` has passed. Between
    reads only the events file's size is looked at, every `every_s` seconds: next to nothing."""
    end = clock() + wait_s
    seen: object = object()  # the size at the last read
    while True:
        size = _size(events)
        if size != seen:
            out, seen = read(events, offset, state_path), size
            if out["lines"]:
                return out
        left = end - clock()
        if left <= 0 or not _alive(out["state"].get("pid")):
            return read(events, offset, state_path)
        time.sleep(min(every_s, left))


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def read(events: Path, offset: int, state_path: Path) -> dict[str, Any]:
    """New whole lines of `events` from `offset` (a line still being written waits for the next poll)."""
    data = b""
    try:
        with open(events, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        pass
    data = data[: data.rfind(b"\n") + 1]
    try:
        state = json.loads(state_path.read_text())
    except (OSError, ValueError):
        state = {}
    if not isinstance(state, dict):
        state = {}
    try:
        st = os.statvfs(events.parent)
        free: int | None = st.f_bavail * st.f_frsize
    except OSError:
        free = None
    return {"lines": data.decode(errors="replace"), "offset": offset + len(data), "state": state,
            "alive": _alive(state.get("pid")), "attached": _attached(state_path.parent / ATTACH),
            "free_bytes": free}


def _attached(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("invocation"), str) and isinstance(rec.get("follow"), str):
            out[rec["invocation"]] = rec["follow"]
    return out


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True

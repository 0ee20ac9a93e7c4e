"""`python -m agent progress`: what the controller reads on each poll of a running suite — the complete
event lines after an offset, the agent's state file, whether its process lives, the starts that were refused
because another held the run (`attached`: invocation → the invocation to follow) and the free space of the
results filesystem — as one JSON object on stdout. With `--wait S` it answers as soon as a new whole line is
there or the agent's process is gone, and after S seconds at the latest: the controller asks once per event,
not once per interval.

The three files lie in the host folder the user names, so each is read through agent.bounded: a FIFO there does
not block a poll, a device is not read without end. The events are read at most EVENTS_PIECE past the offset a
poll (the rest on the next); events.jsonl that is not a regular file within its limit fails the poll
(BoundError); the state and the refused starts, which the agent rewrites, read as absent with the one line in
`problems`."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from . import bounded

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
    """New whole lines of `events` from `offset`, at most EVENTS_PIECE of them (a line still being written waits for
    the next poll); BoundError when events.jsonl is not a regular file within its limit. `problems`, only when there
    are some: the state file or the refused starts that could not be read, one line each."""
    data = b""
    try:
        data = bounded.lines_from(events, bounded.EVENTS, offset, bounded.EVENTS_PIECE)
    except FileNotFoundError:
        pass
    problems: list[str] = []
    state = _json(state_path, problems)
    if not isinstance(state, dict):
        state = {}
    try:
        st = os.statvfs(events.parent)
        free: int | None = st.f_bavail * st.f_frsize
    except OSError:
        free = None
    out = {"lines": data.decode(errors="replace"), "offset": offset + len(data), "state": state,
           "alive": _alive(state.get("pid")), "attached": _attached(state_path.parent / ATTACH, problems),
           "free_bytes": free}
    return {**out, "problems": problems} if problems else out


def _text(path: Path, problems: list[str]) -> str | None:
    """A small file the agent writes, as text; None when it is not there or cannot be read (a FIFO, a device, one
    over RECORD's limit: said in `problems`)."""
    try:
        return bounded.read_text(path, bounded.RECORD, errors="replace")
    except bounded.BoundError as exc:
        problems.append(str(exc))
    except OSError:
        pass
    return None


def _json(path: Path, problems: list[str]) -> Any:
    try:
        return json.loads(_text(path, problems) or "null")
    except ValueError:
        return None


def _attached(path: Path, problems: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (_text(path, problems) or "").splitlines():
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

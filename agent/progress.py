"""`python -m agent progress`: what the controller reads on each poll of a running suite — the complete
event lines after an offset, the agent's state file, whether its process lives and the free space of the
results filesystem — as one JSON object on stdout."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


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
            "alive": _alive(state.get("pid")), "free_bytes": free}


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

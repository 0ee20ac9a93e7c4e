"""One line for a controller step that stopped on something other than its own answer (a full disk, a missing
permission, a file named that is no file, a fault in specfleet): the path and the system's reason, or the fault,
and what to do."""
from __future__ import annotations

import errno
import functools
import os
import traceback
from typing import Any, Callable, Dict, Optional

from agent.bounded import BoundError

Run = Callable[[Any, Any, Optional[Dict[str, Any]]], Dict[str, Any]]

SPACE = (errno.ENOSPC, errno.EDQUOT)
# What to do about a system error, by its errno; any other: "fix it"
TODO = {**dict.fromkeys(SPACE, "free space on its filesystem"), errno.EACCES: "give this user access to it",
        errno.EPERM: "give this user access to it", errno.EROFS: "make its filesystem writable",
        errno.ENOENT: "check that it exists"}


def line(what: str, exc: BaseException, after: str, where: Optional[str] = None) -> str:
    """`what` stopped by `exc`; `after`: what holds meanwhile and how to go on (e.g. 'nothing was started');
    `where`: the path to name when the system named none (a full disk fails a write, not a name)."""
    if isinstance(exc, BoundError):  # a file the user named that is no file, or past its limit
        return f"{what} refused {exc}; move it away, then run the same command again ({after})"
    if isinstance(exc, OSError) and exc.errno is not None:
        path = exc.filename if exc.filename is not None else where or "(the system named no file)"
        return (f"{what} failed: {path}: {os.strerror(exc.errno)}; {TODO.get(exc.errno, 'fix it')}, then run the "
                f"same command again ({after})")
    return (f"{what} stopped on an unexpected error, {type(exc).__name__}: {exc} (a fault in specfleet: -vvv shows "
            f"its traceback, please report it; {after})")


def guard(what: str, after: str, passes: tuple[type[BaseException], ...]) -> Callable[[Run], Run]:
    """For an Ansible action's run(self, tmp, task_vars): an error other than `passes` (Ansible's own) ends the task
    failed with `line` for `what` on its host, the traceback kept for -vvv."""
    def wrap(run: Run) -> Run:
        @functools.wraps(run)
        def guarded(self: Any, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
            try:
                return run(self, tmp, task_vars)
            except passes:
                raise
            except Exception as exc:  # noqa: BLE001  (said as itself)
                host = (task_vars or {}).get("inventory_hostname", "?")
                return {"failed": True, "msg": line(what.format(host=host), exc, after),
                        "exception": traceback.format_exc()}
        return guarded
    return wrap


def archive_failure(exc: OSError, cache: str) -> str:
    """The bench_agent lookup's line for an OSError building the agent's archive into the cache folder `cache`."""
    if exc.errno is None:  # its own words, naming the folder (no agent package under the project folder)
        return (f"building the agent's archive for the hosts failed: {exc}; run from specfleet's project folder, then "
                "run the same command again (nothing was sent to a host)")
    return line("building the agent's archive for the hosts", exc, "nothing was sent to a host", where=cache)

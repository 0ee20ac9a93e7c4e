"""One line for a controller step that stopped on something other than its own answer (a full disk, a missing
permission, a fault in specfleet): the path and the system's reason, or the fault, and what to do."""
from __future__ import annotations

import errno
import functools
import os
import traceback
from typing import Any, Callable, Dict, Optional

Run = Callable[[Any, Any, Optional[Dict[str, Any]]], Dict[str, Any]]

SPACE = (errno.ENOSPC, errno.EDQUOT)


def line(what: str, exc: BaseException, after: str) -> str:
    """`what` stopped by `exc`; `after`: what holds meanwhile and how to go on (e.g. 'nothing was started')."""
    if isinstance(exc, OSError) and exc.errno is not None:
        todo = "free space on its filesystem, then run" if exc.errno in SPACE else "fix it, then run"
        return (f"{what} failed: {exc.filename or '(the system named no file)'}: {os.strerror(exc.errno)}; "
                f"{todo} the same command again ({after})")
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

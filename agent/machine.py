"""Turns on a machine that several suites share (inventory hosts that are one machine, e.g. one engine each): a
config's server runs only while its suite holds the machine, and suites waiting for it take turns config by config.

Two locks make the turns fair: a waiter first takes the queue (`<path>.queue`), then waits for the machine
(`<path>`) and lets the queue go once it has it. A suite that finishes a config and wants the machine again finds
the queue held by the suite waiting behind it, so the machine goes to that one first: with two suites, their
configs alternate. The holder is written beside (`<path>.json`) for the waiters' progress lines. Locks are
`flock`s: the kernel lets them go with the process, whatever ends it.
"""
from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, TextIO, Tuple

from . import bounded
from .store import read_json, write_json


class Machine:
    """The machine lock at `path` (None or "": the suite has the machine to itself, nothing is locked)."""

    def __init__(self, path: Optional[str]) -> None:
        self.path = Path(path) if path else None

    @contextmanager
    def turn(self, who: Dict[str, Any], waiting: Callable[[Dict[str, Any]], None]) -> Iterator[None]:
        """Hold the machine for one config (or one packed phase) while the block runs.
        `who` (host, run_id, config_id) is written as the holder; `waiting(holder)` is called once when the
        machine is held by another suite, before waiting."""
        if self.path is None:
            yield
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        queue = self._open(Path(f"{self.path}.queue"))
        machine = self._open(self.path)
        try:
            fcntl.flock(queue, fcntl.LOCK_EX)
            try:
                fcntl.flock(machine, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                problems, holder = self.holder()
                waiting({**holder, "problems": problems} if problems else holder)
                fcntl.flock(machine, fcntl.LOCK_EX)
            # written before the queue goes: the next waiter, who takes the queue first, reads this holder
            write_json(self.holder_path, {**who, "pid": os.getpid(), "since": time.time()})
            fcntl.flock(queue, fcntl.LOCK_UN)
            yield
        finally:
            queue.close()
            machine.close()  # lets the machine go (and the queue, when an exception came while waiting)

    def holder(self) -> Tuple[List[str], Dict[str, Any]]:
        """The suite holding the machine as its holder file says ({} when unknown), and why it could not be read
        (a file that is no regular one within bounds is never read)."""
        try:
            got = read_json(self.holder_path)
        except bounded.BoundError as exc:
            return [str(exc)], {}
        return [], got if isinstance(got, dict) else {}

    @property
    def holder_path(self) -> Path:
        assert self.path is not None
        return Path(f"{self.path}.json")

    @staticmethod
    def _open(path: Path) -> TextIO:
        return open(path, "a")


def holder_words(holder: Dict[str, Any]) -> str:
    """The suite holding the machine in words, for a progress line."""
    if not holder.get("host"):
        return "another suite" + (f" ({'; '.join(holder['problems'])})" if holder.get("problems") else "")
    return (f"{holder.get('host') or '?'} (run {holder.get('run_id') or '?'}, config "
            f"{holder.get('config_id') or '?'})")


"""A call run in a forked child with a deadline and a cap on the memory it may map: a read that would block (a FIFO
without a writer) or have no end (/dev/zero) fails the test instead of holding or exhausting the machine."""
from __future__ import annotations

import multiprocessing
import resource
import time
from typing import Any, Callable

import pytest

DEADLINE_S = 10.0  # a case reads a handful of small files; a reader that blocks or reads without end takes forever
MEMORY_HEADROOM = 2 << 30  # above what the test process already maps: reading /dev/zero fails there, not the host


def _capped(target: Callable[[], Any], conn: Any, headroom: int) -> None:
    """In the child: the memory it may map is capped, then the result (or the error) goes back."""
    with open("/proc/self/status") as f:
        mapped = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = mapped + headroom
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    try:
        conn.send(("ok", target()))
    except BaseException as exc:  # noqa: B036 (the child reports whatever ended it)
        conn.send(("raised", f"{type(exc).__name__}: {exc}"))


def within_deadline(target: Callable[[], Any], deadline_s: float = DEADLINE_S,
                    headroom: int = MEMORY_HEADROOM) -> tuple[Any, float]:
    """`target()` in a forked child (so that a read that blocks can be ended): its result and the seconds it took;
    the test fails when no answer came within `deadline_s`, or when the child raised."""
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_capped, args=(target, send, headroom), daemon=True)
    t0 = time.monotonic()
    proc.start()
    send.close()
    try:
        if not recv.poll(deadline_s):
            pytest.fail(f"no answer within {deadline_s} s: the read blocks or has no end")
        how, value = recv.recv()
    finally:
        proc.kill()
        proc.join()
    assert how == "ok", value
    return value, time.monotonic() - t0

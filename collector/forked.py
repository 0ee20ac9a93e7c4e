"""A pool of forked processes that ends cleanly: its workers take the default SIGTERM (a handler the parent had
installed is not theirs), and a pool whose work is done is closed and joined rather than terminated, so that no
worker is ever stopped while it holds the pool's queue lock (a worker waiting on that lock never ends)."""
from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.pool
import os
import signal
from typing import Iterator


def _worker_start() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def cpus() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def available() -> bool:
    """Whether this platform forks (the pool needs it: the workers inherit what the parent has loaded)."""
    return "fork" in multiprocessing.get_all_start_methods()


@contextlib.contextmanager
def pool(workers: int) -> Iterator[multiprocessing.pool.Pool]:
    """`workers` forked processes; on leaving, closed and joined once their work is done, or terminated when the
    block raised (or a generator using it was closed early)."""
    p = multiprocessing.get_context("fork").Pool(workers, initializer=_worker_start)
    try:
        yield p
    except BaseException:
        p.terminate()
        p.join()
        raise
    p.close()
    p.join()

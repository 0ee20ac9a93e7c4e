"""Files read because a user named them (a workloads file, a results folder's records, the engine's help kept in the
host folder): each must be a regular file of at most its limit, checked before it is read, so that a device
without end (/dev/zero), a FIFO without a writer or a folder fails at once, in one line naming the file and the
limit, instead of being read until memory runs out or waited on forever.

Standard library only and without project imports: the agent, the controller and the collector all read through
here. A name is judged by `os.stat` before it is opened (a device or FIFO is never opened), opened with
O_NONBLOCK (a FIFO swapped in meanwhile does not block the open) and judged again by `os.fstat`; then at most
limit + 1 bytes are read, so that a file that grows while it is read fails too.
"""
from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from typing import BinaryIO, Iterator, Optional

MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True)
class Bound:
    """What a kind of user-named file is, and the most bytes it may hold."""

    what: str
    limit: int


# A prompt is at most settings.MAX_PROMPT_CHARS (1 Mi characters): 8 MiB holds a few prompts of that length, even
# JSON-escaped, while every config carries the file's workloads to the host.
WORKLOADS_FILE = Bound("a workloads file", 8 * MiB)
# run.json, host.json, config.json, status.json: kilobytes; the largest, a config of thousands of cells or a
# host.json with the engine's whole parsed --help, stays within a few MiB.
RECORD = Bound("a results record", 64 * MiB)
# requests.jsonl is the data: about 1 KiB a request, so 16 GiB is some 17 million requests in one config (a day at
# 200 requests a second), 17 times the million rows benchmarks/report_scale.py reads in one run.
REQUESTS = Bound("a requests.jsonl", 16 * GiB)
# The engine's --help as agent.probe keeps it: its flags, choices and stated defaults, tens of KiB.
HELP_CACHE = Bound("a kept engine help", 16 * MiB)
# The agent's events.jsonl, followed from an offset a piece at a time (EVENTS_PIECE). The agent writes some five
# events a config and a config_progress (about 300 bytes) per server every progress_s (10 s by default): some 3 MB a
# day a server, so 16 GiB is years of eight packed servers. With progress_s 0 (one event a burst of requests) the
# events stay fewer bytes than the request rows (about 1 KiB each), whose 16 GiB limit a config holds (REQUESTS).
EVENTS = Bound("an events.jsonl", 16 * GiB)
# What one poll of the follow reads past its offset: 16 MiB of event lines is some 50,000 events, sent back in one
# JSON answer; the rest comes on the next poll. An event line is a few hundred bytes, so no line is near it.
EVENTS_PIECE = 16 * MiB
# What Ansible reads in its own process before the playbook: an -e @file, an inventory file, a host_vars/ or
# group_vars/ file (plugins/inventory/specfleet_guard.py). A matrix, an inventory, a host's variables are KiB;
# 64 MiB holds eight workloads files' worth of prompts written inline, or an inventory of a hundred thousand hosts.
ANSIBLE_FILE = Bound("an Ansible extra-vars, inventory or vars file", 64 * MiB)
BOUNDS = (WORKLOADS_FILE, RECORD, REQUESTS, HELP_CACHE, EVENTS, ANSIBLE_FILE)

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))
_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)


def size_text(n: int) -> str:
    """A limit in words: 8 MiB, 16 GiB, or bytes."""
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (1 << 10, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {name}"
    return f"{n} bytes"


class BoundError(OSError):
    """A user-named file that is not a regular file within its limit: `strerror` says what it is and the limit,
    `filename` names it, str() is the one line of both."""

    def __str__(self) -> str:
        name = str(self.filename)
        return f"{name if name.isprintable() else repr(name)}: {self.strerror}"


def _error(path: str | os.PathLike[str], why: str, bound: Bound) -> BoundError:
    return BoundError(errno.EINVAL, f"{why}; allowed: a regular file of at most {size_text(bound.limit)}",
                      os.fspath(path))


def of_mode(mode: int) -> Optional[str]:
    """What a file of this mode is, in words (`a FIFO`); None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def kind(path: str | os.PathLike[str], follow: bool = True) -> Optional[str]:
    """What `path` is when it is not a regular file (`follow` false: a symbolic link is judged as itself), by its
    status alone: nothing is opened. OSError (no such file) as `os.stat` raises it."""
    return of_mode((os.stat(path) if follow else os.lstat(path)).st_mode)


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """`path` open for reading once it is a regular file, whatever its size (for files read in part, or by pages:
    a log's tail, the history store, an archive): judged by its status, opened without blocking (a FIFO put there
    meanwhile does not hold the open), judged again by what was opened; BoundError otherwise."""
    why = kind(path)
    if why is None:
        fd = os.open(path, _FLAGS)
        why = of_mode(os.fstat(fd).st_mode)
        if why is None:
            os.set_blocking(fd, True)
            return os.fdopen(fd, "rb")
        os.close(fd)
    raise BoundError(errno.EINVAL, f"{why}, not a regular file", os.fspath(path))


def _judge(path: str | os.PathLike[str], st: os.stat_result, bound: Bound) -> None:
    why = of_mode(st.st_mode)
    if why is not None:
        raise _error(path, f"{why}, not a regular file", bound)
    if st.st_size > bound.limit:
        raise _error(path, f"{st.st_size} bytes, larger than {size_text(bound.limit)}", bound)


def _open(path: str | os.PathLike[str], bound: Bound) -> tuple[int, int]:
    """A descriptor open for reading on `path`, and its size, once it is a regular file within `bound`."""
    _judge(path, os.stat(path), bound)
    fd = os.open(path, _FLAGS)
    try:
        st = os.fstat(fd)
        _judge(path, st, bound)  # what was opened, should the name have changed since
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def chunks(path: str | os.PathLike[str], bound: Bound, size: Optional[int] = None) -> Iterator[bytes]:
    """The file's bytes, `size` at a time (None: the whole file in one piece, as its size says); raises
    BoundError before reading anything that is not a regular file within `bound`, and once more than its limit
    has been read (it grew). Other OSErrors as reading raises them."""
    fd, now = _open(path, bound)
    with os.fdopen(fd, "rb", buffering=0) as f:
        seen = 0
        while True:
            block = f.read(min(size or (now + 1 if not seen else MiB), bound.limit + 1 - seen))
            if not block:
                return
            seen += len(block)
            if seen > bound.limit:
                raise _error(path, f"grew past {size_text(bound.limit)} while read", bound)
            yield block


def read_bytes(path: str | os.PathLike[str], bound: Bound) -> bytes:
    """The whole file, as Path.read_bytes gives it, once it is a regular file within `bound` (BoundError)."""
    return b"".join(chunks(path, bound))


def read_text(path: str | os.PathLike[str], bound: Bound, errors: str = "strict") -> str:
    """The whole file as Path.read_text gives it (UTF-8, universal newlines), once it is a regular file within
    `bound` (BoundError)."""
    text = read_bytes(path, bound).decode("utf-8", errors=errors)
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def check(path: str | os.PathLike[str], bound: Bound) -> None:
    """Raises BoundError unless `path` is now a regular file within `bound`, opening nothing: for a file another
    program reads (Ansible). Other OSErrors (no such file) as `os.stat` raises them."""
    _judge(path, os.stat(path), bound)


def lines_from(path: str | os.PathLike[str], bound: Bound, offset: int, most: int) -> bytes:
    """The whole lines of a file that is being written, from byte `offset`, at most `most` bytes of them (the rest
    for the next call; a line still being written waits for it too), once the file is a regular file within
    `bound` (BoundError; also when it holds more than its limit, or when `most` bytes from `offset` hold no line
    end: a line longer than that would keep the reader at `offset` for good)."""
    fd, _ = _open(path, bound)
    with os.fdopen(fd, "rb", buffering=0) as f:
        f.seek(offset)
        data = f.read(max(0, min(most, bound.limit + 1 - offset)))
    if offset + len(data) > bound.limit:
        raise _error(path, f"grew past {size_text(bound.limit)} while read", bound)
    end = data.rfind(b"\n") + 1
    if not end and len(data) >= most:
        raise _error(path, f"no line end in the {size_text(most)} from byte {offset}", bound)
    return data[:end]

"""A server log of bounded size: the first and the last part of the output kept, what lay between counted.

An engine that floods its output (1.5 GB before it serves, say) must not fill the host's disk, nor the
controller's after the pull. The log is written whole while it is under the bound; past it, the first half
stays in the file, the last half is kept in memory (and written at the end) and a line in between says how
many bytes were dropped. The classifier reads `text()`, which always holds the end of the output.
"""
from __future__ import annotations

import os
import threading
from collections import deque
from pathlib import Path
from typing import IO

CHUNK = 1 << 20
DEFAULT_MAX_BYTES = 64 << 20   # bench_server_log_max_mib: 64


def _marker(dropped: int, head: int, tail: int) -> bytes:
    return (f"\n[specfleet] {dropped} bytes of the server's output dropped here: server.log keeps the first "
            f"{head} and the last {tail} bytes (bench_server_log_max_mib)\n").encode()


class BoundedLog:
    """Copies a stream (the engine's stdout and stderr) into `path`, bounded to `max_bytes`."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path, self.max_bytes = path, max_bytes
        self.head_max = max_bytes // 2
        self.tail_max = max_bytes - self.head_max
        self.file = open(path, "ab")
        self.written = self.file.tell()
        self.tail: deque[bytes] = deque()
        self.tail_len = 0
        self.dropped = 0
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.closed = False
        self.after_close = 0   # bytes read after close (a writer outlived the server): drained, not kept

    def feed(self, data: bytes) -> None:
        with self.lock:
            if self.closed:
                self.after_close += len(data)
                return
            if not self.tail and self.written + len(data) <= self.max_bytes:
                self.file.write(data)
                self.file.flush()
                self.written += len(data)
                return
            if not self.tail and self.written > self.head_max:
                self._move_past_head_to_tail()
            room = max(self.head_max - self.written, 0)
            if room:
                self.file.write(data[:room])
                self.file.flush()
                self.written += room
                data = data[room:]
            self.tail.append(data)
            self.tail_len += len(data)
            while self.tail_len > self.tail_max:
                extra = self.tail_len - self.tail_max
                first = self.tail[0]
                if len(first) <= extra:
                    self.tail.popleft()
                    self.tail_len -= len(first)
                    self.dropped += len(first)
                else:
                    self.tail[0] = first[extra:]
                    self.tail_len -= extra
                    self.dropped += extra

    def _move_past_head_to_tail(self) -> None:
        """The file just outgrew the bound: what lies past the head becomes the start of the tail."""
        self.file.flush()
        with open(self.path, "rb") as f:
            f.seek(self.head_max)
            rest = f.read()
        self.file.truncate(self.head_max)
        self.file.seek(0, os.SEEK_END)
        self.written = self.head_max
        self.tail.append(rest)
        self.tail_len += len(rest)

    def pump(self, stream: IO[bytes]) -> None:
        """Copy `stream` until its end in a thread of its own."""
        def run() -> None:
            fd = stream.fileno()
            try:
                while True:
                    try:
                        data = os.read(fd, CHUNK)
                    except OSError:
                        break
                    if not data:
                        break
                    self.feed(data)  # after close() too: a late writer is drained, never blocked
            finally:
                stream.close()

        self.thread = threading.Thread(target=run, name="server-log", daemon=True)
        self.thread.start()

    def drain(self, wait_s: float) -> None:
        """Wait up to `wait_s` for the stream's end (what the server wrote before it died is then all here)."""
        if self.thread is not None:
            self.thread.join(wait_s)

    def text(self) -> str:
        """The log as it will be: head, the drop marker, the tail so far."""
        with self.lock:
            if self.closed:
                return self.path.read_text(errors="replace")
            self.file.flush()
            head = self.path.read_bytes()[:self.written]
            if not self.tail:
                return head.decode(errors="replace")
            return (head + self._marker() + b"".join(self.tail)).decode(errors="replace")

    def _marker(self) -> bytes:
        return _marker(self.dropped, self.head_max, self.tail_max) if self.dropped else b""

    def close(self, wait_s: float = 10.0) -> None:
        """Wait for the stream's end (every writer gone), then write the tail after the head."""
        self.drain(wait_s)
        with self.lock:
            if self.closed:
                return
            self.closed = True
            if self.tail:
                self.file.write(self._marker() + b"".join(self.tail))
                self.tail.clear()
                self.tail_len = 0
            self.file.close()

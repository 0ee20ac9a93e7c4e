"""A server that went away during the timed requests: its exit is waited for once a request lost its connection,
because a killed server's sockets close before the kernel lets its process be reaped; the requests of every later
burst can fail in that window (connection refused takes a millisecond), and a sample of the process then would say
it still runs, recording a crashed server's config `ok`."""
from __future__ import annotations

import time
from typing import Any

import pytest

from agent import measure


class Dying:
    """A server process that is reaped `after_s` seconds after the first question (None: never)."""

    def __init__(self, after_s: float | None) -> None:
        self.after_s, self.t0 = after_s, None

    def alive(self) -> bool:
        now = time.monotonic()
        self.t0 = self.t0 or now
        return self.after_s is None or now - self.t0 < self.after_s


def row(error: str | None) -> dict[str, Any]:
    return {"ok": error is None, "error": error}


@pytest.mark.parametrize("error", ["ConnectionRefusedError: [Errno 111] Connection refused",
                                   "ConnectionResetError: [Errno 104] Connection reset by peer",
                                   "RemoteDisconnected: Remote end closed connection without response",
                                   "IncompleteRead: IncompleteRead(12 bytes read)",
                                   "BrokenPipeError: [Errno 32] Broken pipe"])
def test_a_lost_connection_waits_for_the_exit_to_be_seen(error: str) -> None:
    server = Dying(after_s=0.2)
    t0 = time.monotonic()
    assert measure.gone(server, [row(None), row(error)])  # type: ignore[arg-type]
    assert 0.15 < time.monotonic() - t0 < measure.LOST_WAIT_S


def test_a_server_still_running_after_a_lost_connection_is_not_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(measure, "LOST_WAIT_S", 0.3)
    assert not measure.gone(Dying(after_s=None), [row("ConnectionResetError: reset")])  # type: ignore[arg-type]


@pytest.mark.parametrize("rows", [[row(None)], [row("HTTP 500: boom")], [row("malformed stream chunk: b'x'")],
                                  [row("TimeoutError: timed out")]])
def test_other_errors_do_not_wait(rows: list[dict[str, Any]]) -> None:
    t0 = time.monotonic()
    assert not measure.gone(Dying(after_s=0.2), rows)  # type: ignore[arg-type]
    assert time.monotonic() - t0 < 0.1


def test_an_exited_server_is_gone_at_once() -> None:
    assert measure.gone(Dying(after_s=0.0), [row(None)])  # type: ignore[arg-type]

"""A server that went away during the timed requests: its exit is waited for once a request lost its connection,
because a killed server's sockets close before the kernel lets its process be reaped; the requests of every later
burst can fail in that window (connection refused takes a millisecond), and a sample of the process then would say
it still runs, recording a crashed server's config `ok`."""
from __future__ import annotations

from typing import Any

import pytest

from agent import measure


class Dying:
    """A server process that is seen reaped from the question after `alive_for` questions on (None: never)."""

    def __init__(self, alive_for: int | None) -> None:
        self.alive_for, self.asked = alive_for, 0

    def alive(self) -> bool:
        self.asked += 1
        return self.alive_for is None or self.asked <= self.alive_for


def row(error: str | None) -> dict[str, Any]:
    return {"ok": error is None, "error": error}


@pytest.mark.parametrize("error", ["ConnectionRefusedError: [Errno 111] Connection refused",
                                   "ConnectionResetError: [Errno 104] Connection reset by peer",
                                   "RemoteDisconnected: Remote end closed connection without response",
                                   "IncompleteRead: IncompleteRead(12 bytes read)",
                                   "BrokenPipeError: [Errno 32] Broken pipe"])
def test_a_lost_connection_waits_for_the_exit_to_be_seen(error: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Still running at the first two questions, reaped at the third: gone, asked until then and no more (the wait
    made long enough that only the exit can end it)."""
    monkeypatch.setattr(measure, "LOST_WAIT_S", 600.0)
    server = Dying(alive_for=2)
    assert measure.gone(server, [row(None), row(error)])  # type: ignore[arg-type]
    assert server.asked == 3


def test_a_server_still_running_after_a_lost_connection_is_not_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(measure, "LOST_WAIT_S", 0.3)
    server = Dying(alive_for=None)
    assert not measure.gone(server, [row("ConnectionResetError: reset")])  # type: ignore[arg-type]
    assert server.asked >= 2  # it waited, asking again, before it said so


@pytest.mark.parametrize("rows", [[row(None)], [row("HTTP 500: boom")], [row("malformed stream chunk: b'x'")],
                                  [row("TimeoutError: timed out")]])
def test_other_errors_do_not_wait(rows: list[dict[str, Any]]) -> None:
    server = Dying(alive_for=1)
    assert not measure.gone(server, rows)  # type: ignore[arg-type]
    assert server.asked == 1  # asked once: no waiting for an exit


def test_an_exited_server_is_gone_at_once() -> None:
    server = Dying(alive_for=0)
    assert measure.gone(server, [row(None)])  # type: ignore[arg-type]
    assert server.asked == 1


@pytest.mark.parametrize("capture,reason", [("vllm-0.32.0-dflash-past-layers.log", "incompatible_config"),
                                            ("vllm-0.32.0-dflash-other-vocab.log", "incompatible_config"),
                                            (None, "warmup_failed")])
def test_a_failed_warmup_is_classified_from_the_engines_log(capture: str | None, reason: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A server healthy until its first request, whose engine then says why it cannot serve (vLLM's DFlash with a
    drafter that does not fit its target): the warmup's failure carries the engine's reason, else warmup_failed."""
    from tests.conftest import ROOT

    log = (ROOT / "tests/fixtures" / capture).read_text() if capture else "INFO: Application startup complete.\n"

    class Up(Dying):
        def log_text(self) -> str:
            return log

    monkeypatch.setattr(measure, "prompts", lambda cfg, ep: {("fib", 0): None})
    monkeypatch.setattr(measure, "burst", lambda *a, **k: ([row("HTTP 500: EngineCore encountered an issue")], 0.1))
    cfg = {"cells": [{"workload": "fib", "context_tokens": 0}], "warmup_max_tokens": 4}
    got = measure.measure(cfg, {}, Up(alive_for=None), None)  # type: ignore[arg-type]
    assert got.reason is not None and got.reason.value == reason and got.rows == []

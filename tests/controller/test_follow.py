"""Following a suite (controller/follow.py): each event kind as a progress line, attaching to the agent, collecting
the configs' outcomes, and an agent that died reported once its last events were read."""
from __future__ import annotations

import json
from typing import Any

import pytest

from agent.records import Event
from controller import follow
from controller.follow import Follow, render


def ev(kind: Event, invocation: str = "inv-1", **fields: Any) -> dict[str, Any]:
    return {"t": "2025-01-01T00:00:00.000+00:00", "event": kind.value, "invocation": invocation, **fields}


def lines_of(*events: dict[str, Any] | str) -> str:
    return "".join((e if isinstance(e, str) else json.dumps(e)) + "\n" for e in events)


def probe(lines: str = "", offset: int = 0, state: dict[str, Any] | None = None, alive: bool = True,
          free_bytes: int | None = 10 << 30, attached: dict[str, str] | None = None) -> dict[str, Any]:
    state = {"pid": 4242, "state": "running", "invocation": "inv-1"} if state is None else state
    return {"lines": lines, "offset": offset, "state": state, "alive": alive, "free_bytes": free_bytes,
            "attached": attached or {}}


def attached(invocation: str = "inv-1") -> Follow:
    f = Follow("gpu-01", invocation, "/srv/results/r1/gpu-01/agent.log")
    assert f.attach(probe()) is None
    return f


# --- render ---------------------------------------------------------------------------------------------------

def test_render_suite_start() -> None:
    assert render(ev(Event.SUITE_START, n=12, run_id="r1", estimate_s=3725.4)) == \
        "suite r1: 12 configs, estimated 1:02:05"


def test_render_suite_start_without_an_estimate() -> None:
    assert render(ev(Event.SUITE_START, n=1, run_id="r1")) == "suite r1: 1 configs, estimated ?"


def test_render_config_start() -> None:
    assert render(ev(Event.CONFIG_START, k=3, n=12, config_id="tp1-ngram-k2", elapsed_s=61, eta_s=None)) == \
        "[3/12] tp1-ngram-k2  elapsed 0:01:01  ETA ?"
    assert render(ev(Event.CONFIG_START, k=1, n=2, config_id="tp1-autoregressive", elapsed_s=0.2,
                     eta_s=36000)) == "[1/2] tp1-autoregressive  elapsed 0:00:00  ETA 10:00:00"


def test_render_config_kept() -> None:
    assert render(ev(Event.CONFIG_KEPT, k=2, n=4, config_id="tp1-autoregressive", elapsed_s=0, eta_s=0)) == \
        "[2/4] tp1-autoregressive  already ok in this run, kept"


def test_render_machine_wait() -> None:
    assert render(ev(Event.MACHINE_WAIT, config_id="tp1-ngram-k2", holder="local (run r1, config tp1-dflash-b4)")) \
        == "      tp1-ngram-k2: waiting for the machine, held by local (run r1, config tp1-dflash-b4)"


def test_render_config_end_ok() -> None:
    assert render(ev(Event.CONFIG_END, k=1, n=2, config_id="c", status="ok", reason=None, ready_s=4.04,
                     requests_ok=9, requests=9, duration_s=123.456)) == \
        "      ok in 123.5 s (ready 4.0 s, 9/9 requests ok)"


def test_render_config_end_failed_without_readiness() -> None:
    assert render(ev(Event.CONFIG_END, k=1, n=2, config_id="c", status="failed", reason="startup_timeout",
                     ready_s=None, requests_ok=None, requests=None, duration_s=900)) == \
        "      failed: startup_timeout in 900.0 s (0/0 requests ok)"


def test_render_config_end_skipped() -> None:
    assert render(ev(Event.CONFIG_END, k=2, n=2, config_id="c", status="skipped", reason="baseline_failed")) == \
        "      skipped: baseline_failed in 0.0 s (0/0 requests ok)"


def test_render_suite_end() -> None:
    assert render(ev(Event.SUITE_END, elapsed_s=7261.6)) == "suite finished in 2:01:02"
    assert render(ev(Event.SUITE_END)) == "suite finished in ?"


@pytest.mark.parametrize("event", [
    ev(Event.CONFIG_READY, config_id="c", ready_s=1.0, port=1234, server_pid=5),
    ev(Event.LEFTOVER_UNIT_STOPPED, unit="engine@x.service"),
    {"event": "something_new"},
    {},
])
def test_render_hides_other_events(event: dict[str, Any]) -> None:
    assert render(event) is None


def test_every_event_kind_is_either_shown_or_deliberately_hidden() -> None:
    """A new event kind is a decision: shown events render, the hidden ones are listed here."""
    fields = dict(k=1, n=1, config_id="c", status="ok", run_id="r", elapsed_s=1, eta_s=1, duration_s=1, done=1,
                  total=2, tok_s=1.0, window_s=10.0)
    hidden = {Event.CONFIG_READY, Event.LEFTOVER_UNIT_STOPPED}
    for kind in Event:
        assert (render(ev(kind, **fields)) is None) == (kind in hidden), kind


def test_hms() -> None:
    assert follow.hms(None) == "?"
    assert follow.hms(0) == "0:00:00"
    assert follow.hms(59.6) == "0:01:00"
    assert follow.hms(90061) == "25:01:01"


# --- attach ---------------------------------------------------------------------------------------------------

def test_attach_waits_until_the_state_names_this_invocation() -> None:
    f = Follow("gpu-01", "inv-2")
    with pytest.raises(LookupError):
        f.attach(probe(state={}, alive=False))
    # a finished earlier start, or one that died while running: not this start, nothing to attach to
    with pytest.raises(LookupError):
        f.attach(probe(state={"pid": 1, "state": "finished", "invocation": "inv-1"}, alive=False))
    with pytest.raises(LookupError):
        f.attach(probe(state={"pid": 1, "state": "running", "invocation": "inv-1"}, alive=False))
    with pytest.raises(LookupError):
        f.attach(probe(state={"pid": 1, "state": "failed", "invocation": "inv-1"}, alive=True))
    assert f.followed is None
    assert f.attach(probe(state={"pid": 7, "state": "running", "invocation": "inv-2"})) is None
    assert f.followed == "inv-2"


def test_attach_to_this_invocation_even_when_it_already_ended() -> None:
    f = Follow("gpu-01", "inv-2")
    assert f.attach(probe(state={"pid": 7, "state": "failed", "invocation": "inv-2"}, alive=False)) is None
    assert f.followed == "inv-2"


def test_attach_to_a_live_run_already_in_progress() -> None:
    f = Follow("gpu-01", "inv-2")
    note = f.attach(probe(state={"pid": 4242, "state": "running", "invocation": "inv-1"}, alive=True))
    assert note == "attaching to the run already in progress (pid 4242)"
    assert f.followed == "inv-1"
    lines, done = f.step(probe(lines_of(ev(Event.SUITE_END, "inv-2", elapsed_s=1),
                                        ev(Event.SUITE_END, "inv-1", elapsed_s=2)), offset=10))
    assert lines == ["suite finished in 0:00:02"]
    assert done == {"changed": True, "configs": [], "elapsed_s": 2}


# --- step -----------------------------------------------------------------------------------------------------

def test_step_collects_config_ends_and_returns_the_result_at_suite_end() -> None:
    f = attached()
    first = lines_of(ev(Event.SUITE_START, n=2, run_id="r1", estimate_s=300),
                     ev(Event.CONFIG_START, k=1, n=2, config_id="tp1-autoregressive", elapsed_s=0, eta_s=300))
    lines, done = f.step(probe(first, offset=len(first.encode())))
    assert done is None
    assert lines == ["suite r1: 2 configs, estimated 0:05:00", "[1/2] tp1-autoregressive  elapsed 0:00:00  ETA 0:05:00"]
    assert f.offset == len(first.encode())
    second = lines_of(
        ev(Event.CONFIG_READY, config_id="tp1-autoregressive", ready_s=3.0, port=1, server_pid=2),
        ev(Event.CONFIG_END, k=1, n=2, config_id="tp1-autoregressive", status="ok", reason=None, ready_s=3.0,
           requests_ok=3, requests=3, duration_s=40.5),
        ev(Event.CONFIG_START, k=2, n=2, config_id="tp1-ngram-k2", elapsed_s=41, eta_s=120),
        ev(Event.CONFIG_END, k=2, n=2, config_id="tp1-ngram-k2", status="failed", reason="server_crash",
           ready_s=None, requests_ok=1, requests=3, duration_s=12),
    )
    lines, done = f.step(probe(second, offset=999))
    assert done is None and f.offset == 999
    assert lines == ["      ok in 40.5 s (ready 3.0 s, 3/3 requests ok)",
                     "[2/2] tp1-ngram-k2  elapsed 0:00:41  ETA 0:02:00",
                     "      failed: server_crash in 12.0 s (1/3 requests ok)"]
    lines, done = f.step(probe(lines_of(ev(Event.SUITE_END, elapsed_s=53.2)), offset=1200))
    assert lines == ["suite finished in 0:00:53"]
    assert done == {"changed": True, "elapsed_s": 53.2, "configs": [
        {"config_id": "tp1-autoregressive", "status": "ok", "reason": None, "duration_s": 40.5},
        {"config_id": "tp1-ngram-k2", "status": "failed", "reason": "server_crash", "duration_s": 12},
    ]}


def test_step_ignores_other_invocations_and_garbage() -> None:
    f = attached()
    text = lines_of(
        ev(Event.CONFIG_END, "inv-0", k=1, n=1, config_id="old", status="ok", duration_s=1),
        "not json at all",
        '{"truncated": ',
        "[1, 2, 3]",
        "42",
        "null",
        '"a string"',
        {"event": "config_end", "config_id": "no-invocation", "status": "ok"},
        ev(Event.CONFIG_END, k=1, n=1, config_id="mine", status="ok", reason=None, duration_s=2.0),
        ev(Event.SUITE_END, "inv-0", elapsed_s=1),
    ) + "\n   \n"
    lines, done = f.step(probe(text, offset=len(text)))
    assert done is None
    assert lines == ["      ok in 2.0 s (0/0 requests ok)"]
    assert f.summary == [{"config_id": "mine", "status": "ok", "reason": None, "duration_s": 2.0}]


def test_step_stops_at_suite_end() -> None:
    f = attached()
    text = lines_of(ev(Event.SUITE_END, elapsed_s=5),
                    ev(Event.CONFIG_END, k=1, n=1, config_id="after", status="ok", duration_s=1))
    lines, done = f.step(probe(text, alive=False))
    assert lines == ["suite finished in 0:00:05"]
    assert done is not None and done["configs"] == [] and not done.get("failed")


def test_step_with_nothing_new_polls_again() -> None:
    f = attached()
    for _ in range(3):
        assert f.step(probe("", offset=0)) == ([], None)


def test_a_died_agent_is_reported_on_the_second_poll_after_death() -> None:
    f = attached()
    lines, done = f.step(probe(lines_of(ev(Event.SUITE_START, n=1, run_id="r1", estimate_s=1))))
    assert done is None
    dead_state = {"pid": 4242, "state": "running", "invocation": "inv-1"}
    # the first poll after death may still carry the last events: shown, and one more poll follows
    last = lines_of(ev(Event.CONFIG_START, k=1, n=1, config_id="c", elapsed_s=0, eta_s=1))
    lines, done = f.step(probe(last, state=dead_state, alive=False))
    assert lines == ["[1/1] c  elapsed 0:00:00  ETA 0:00:01"]
    assert done is None
    lines, done = f.step(probe("", state=dead_state, alive=False))
    assert lines == []
    assert done is not None and done["failed"] is True
    assert done["msg"] == ("the agent on gpu-01 died without finishing the suite: no error recorded; see "
                           "/srv/results/r1/gpu-01/agent.log; re-run with the same run_id to resume")


def test_a_finished_suite_on_the_final_poll_is_not_a_death() -> None:
    f = attached()
    assert f.step(probe("", alive=False)) == ([], None)
    lines, done = f.step(probe(lines_of(ev(Event.SUITE_END, elapsed_s=3)), alive=False))
    assert done == {"changed": True, "configs": [], "elapsed_s": 3}


def test_a_dead_agent_names_a_full_disk() -> None:
    f = attached()
    state = {"pid": 4242, "state": "failed", "invocation": "inv-1", "error": "OSError: [Errno 28] No space left"}
    assert f.step(probe(state=state, alive=False, free_bytes=4096)) == ([], None)
    _, done = f.step(probe(state=state, alive=False, free_bytes=4096))
    assert done is not None and done["failed"] is True
    assert done["msg"].startswith("the agent on gpu-01 ended (failed) without finishing the suite: "
                                  "OSError: [Errno 28] No space left (the results filesystem on gpu-01 is full: "
                                  "4096 bytes free); see ")


@pytest.mark.parametrize("free_bytes", [None, follow.DISK_FULL_BYTES, 10 << 30])
def test_a_dead_agent_with_disk_space_left_does_not_blame_the_disk(free_bytes: int | None) -> None:
    f = attached()
    state = {"pid": 4242, "state": "running", "invocation": "inv-1"}
    f.step(probe(state=state, alive=False, free_bytes=free_bytes))
    _, done = f.step(probe(state=state, alive=False, free_bytes=free_bytes))
    assert done is not None and done["failed"] is True
    assert "full" not in done["msg"] and "died without finishing the suite" in done["msg"]


def test_died_names_the_state_the_agent_left() -> None:
    f = Follow("h", "inv-1")
    msg = f.died(probe(state={"state": "finished", "invocation": "inv-1"}, alive=False))
    assert msg.startswith("the agent on h ended (finished) without finishing the suite: no error recorded; "
                          "see its log")


def test_a_refused_start_follows_the_holder_even_after_the_holder_ended() -> None:
    """This start found the run held and exited; the holder then finished before the first poll: the refusal's
    note says whom to follow, and the holder's events end the task."""
    f = Follow("gpu-01", "inv-2")
    finished = {"pid": 4242, "state": "finished", "invocation": "inv-1"}
    with pytest.raises(LookupError):
        f.attach(probe(state=finished, alive=False))
    assert f.attach(probe(state=finished, alive=False, attached={"inv-2": "inv-1"})) == \
        "attaching to the run already in progress (pid 4242)"
    lines, done = f.step(probe(lines_of(ev(Event.SUITE_END, "inv-1", elapsed_s=2)), state=finished, alive=False,
                               offset=10))
    assert lines == ["suite finished in 0:00:02"] and done is not None and done["changed"]
    # another start's note is not this one's
    g = Follow("gpu-01", "inv-3")
    with pytest.raises(LookupError):
        g.attach(probe(state=finished, alive=False, attached={"inv-2": "inv-1"}))

"""`python -m agent progress` (agent/progress.py): whole event lines after an offset, the agent's state, whether its
process lives and the free space, as the controller's follow reads them on each poll."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agent import progress
from agent.__main__ import main
from agent.records import Event
from agent.store import HostStore, write_json

ROOT = Path(__file__).resolve().parents[2]


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


@pytest.fixture()
def host(tmp_path: Path) -> Path:
    d = tmp_path / "r1" / "gpu-01"
    d.mkdir(parents=True)
    return d


def test_only_whole_lines_are_returned_and_a_partial_line_waits(host: Path) -> None:
    events, state = host / "events.jsonl", host / "agent.json"
    append(events, b'{"a": 1}\n{"b": ')
    first = progress.read(events, 0, state)
    assert first["lines"] == '{"a": 1}\n'
    assert first["offset"] == len(b'{"a": 1}\n')
    # nothing complete since: the same offset, no lines
    again = progress.read(events, first["offset"], state)
    assert again["lines"] == "" and again["offset"] == first["offset"]
    append(events, b'2}\n{"c": 3}\n{"d"')
    second = progress.read(events, first["offset"], state)
    assert second["lines"] == '{"b": 2}\n{"c": 3}\n'
    assert second["offset"] == first["offset"] + len(b'{"b": 2}\n{"c": 3}\n')
    append(events, b": 4}\n")
    third = progress.read(events, second["offset"], state)
    assert third["lines"] == '{"d": 4}\n'
    assert third["offset"] == os.path.getsize(events)
    assert [json.loads(x) for x in (first["lines"] + second["lines"] + third["lines"]).splitlines()] == \
        [{"a": 1}, {"b": 2}, {"c": 3}, {"d": 4}]


def test_a_file_without_any_newline_gives_nothing(host: Path) -> None:
    events = host / "events.jsonl"
    append(events, b'{"partial": true')
    out = progress.read(events, 0, host / "agent.json")
    assert out["lines"] == "" and out["offset"] == 0


def test_the_offset_counts_bytes_not_characters(host: Path) -> None:
    events = host / "events.jsonl"
    line = json.dumps({"reason": "héllo — wörld"}, ensure_ascii=False) + "\n"
    append(events, line.encode())
    out = progress.read(events, 0, host / "agent.json")
    assert out["lines"] == line
    assert out["offset"] == len(line.encode()) > len(line)
    assert progress.read(events, out["offset"], host / "agent.json")["lines"] == ""


def test_reading_from_the_middle_of_the_file(host: Path) -> None:
    events = host / "events.jsonl"
    append(events, b"one\ntwo\nthree\n")
    assert progress.read(events, 4, host / "agent.json")["lines"] == "two\nthree\n"
    past = progress.read(events, 1000, host / "agent.json")
    assert past["lines"] == "" and past["offset"] == 1000


def test_events_written_by_the_store(host: Path) -> None:
    store = HostStore(host.parent, host.name, invocation="inv-1")
    store.event(Event.SUITE_START, n=1, run_id="r1", estimate_s=10)
    store.event(Event.CONFIG_START, k=1, n=1, config_id="c", elapsed_s=0, eta_s=10)
    out = progress.read(store.dir / "events.jsonl", 0, store.dir / "agent.json")
    evs = [json.loads(x) for x in out["lines"].splitlines()]
    assert [e["event"] for e in evs] == ["suite_start", "config_start"]
    assert all(e["invocation"] == "inv-1" for e in evs)
    assert out["offset"] == os.path.getsize(store.dir / "events.jsonl")


def test_missing_files_give_empty_answers(tmp_path: Path) -> None:
    out = progress.read(tmp_path / "nowhere" / "events.jsonl", 0, tmp_path / "nowhere" / "agent.json")
    assert out == {"lines": "", "offset": 0, "state": {}, "alive": False, "attached": {}, "free_bytes": None}
    out = progress.read(tmp_path / "events.jsonl", 17, tmp_path / "agent.json")
    assert out["lines"] == "" and out["offset"] == 17 and out["state"] == {} and out["alive"] is False
    assert isinstance(out["free_bytes"], int) and out["free_bytes"] >= 0


def test_the_state_and_this_process_alive(host: Path) -> None:
    state = {"pid": os.getpid(), "state": "running", "invocation": "inv-1", "run_id": "r1"}
    write_json(host / "agent.json", state)
    out = progress.read(host / "events.jsonl", 0, host / "agent.json")
    assert out["state"] == state
    assert out["alive"] is True


def dead_pid() -> int:
    """The pid of a real process that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    assert proc.wait(timeout=30) == 0
    return proc.pid


def test_a_dead_pid_is_not_alive(host: Path) -> None:
    pid = dead_pid()
    write_json(host / "agent.json", {"pid": pid, "state": "running", "invocation": "inv-1"})
    assert progress.read(host / "events.jsonl", 0, host / "agent.json")["alive"] is False


@pytest.mark.parametrize("pid", [None, 0, -1, True, "1", "own-pid-as-text", 1.0, [1]])
def test_a_pid_that_is_not_a_positive_int_is_not_alive(host: Path, pid: Any) -> None:
    pid = str(os.getpid()) if pid == "own-pid-as-text" else pid  # a live pid, as a string (ids stay the same)
    write_json(host / "agent.json", {"pid": pid, "state": "running"})
    assert progress.read(host / "events.jsonl", 0, host / "agent.json")["alive"] is False


@pytest.mark.parametrize("text", ["[1, 2]", '"running"', "42", "null", "true", "{not json", "", "\x00\x01"])
def test_a_state_file_that_is_not_a_mapping_gives_an_empty_state(host: Path, text: str) -> None:
    (host / "agent.json").write_text(text)
    out = progress.read(host / "events.jsonl", 0, host / "agent.json")
    assert out["state"] == {} and out["alive"] is False


def test_a_state_path_that_is_a_folder_gives_an_empty_state(host: Path) -> None:
    (host / "agent.json").mkdir()
    assert progress.read(host / "events.jsonl", 0, host / "agent.json")["state"] == {}


def test_free_bytes_of_the_results_filesystem(host: Path) -> None:
    st = os.statvfs(host)
    free = progress.read(host / "events.jsonl", 0, host / "agent.json")["free_bytes"]
    assert isinstance(free, int) and free > 0
    # the same filesystem, give or take what others write meanwhile
    assert abs(free - st.f_bavail * st.f_frsize) < 1 << 30


def test_the_answer_is_json(host: Path) -> None:
    append(host / "events.jsonl", b'{"x": "\\u00e9"}\n')
    out = progress.read(host / "events.jsonl", 0, host / "agent.json")
    assert json.loads(json.dumps(out)) == out


# --- the CLI --------------------------------------------------------------------------------------------------

def without_free(answer: dict[str, Any]) -> dict[str, Any]:
    """The answer less free_bytes, which other writers on the filesystem may change between two reads."""
    assert isinstance(answer["free_bytes"], int)
    return {k: v for k, v in answer.items() if k != "free_bytes"}


@pytest.fixture()
def running(host: Path) -> Path:
    write_json(host / "agent.json", {"pid": os.getpid(), "state": "running", "invocation": "inv-1"})
    append(host / "events.jsonl", b'{"event": "suite_start", "invocation": "inv-1"}\n{"event": "config_start", "in')
    return host


def test_the_cli_prints_the_same_json(running: Path) -> None:
    events, state = running / "events.jsonl", running / "agent.json"
    res = subprocess.run([sys.executable, "-m", "agent", "progress", "--events", str(events), "--offset", "0",
                          "--state", str(state)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.endswith("\n") and len(res.stdout.splitlines()) == 1
    answer = json.loads(res.stdout)
    assert without_free(answer) == without_free(progress.read(events, 0, state))
    assert answer["lines"] == '{"event": "suite_start", "invocation": "inv-1"}\n'
    assert answer["alive"] is True  # the test process, alive while the CLI reads


def test_the_cli_in_process_with_an_offset(running: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events, state = running / "events.jsonl", running / "agent.json"
    assert main(["progress", "--events", str(events), "--offset", "5", "--state", str(state)]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert without_free(answer) == without_free(progress.read(events, 5, state))
    assert answer["offset"] == len(b'{"event": "suite_start", "invocation": "inv-1"}\n')


def test_the_cli_with_missing_files(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "agent", "progress", "--events", str(tmp_path / "no/events.jsonl"),
                          "--state", str(tmp_path / "no/agent.json")], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"lines": "", "offset": 0, "state": {}, "alive": False, "attached": {},
                                       "free_bytes": None}


def test_refused_starts_are_read_as_whom_to_follow(host: Path) -> None:
    """`agent.attach.jsonl`: one line per start refused because the run was held; a torn or foreign line is
    skipped, the last note for an invocation wins."""
    (host / progress.ATTACH).write_text(
        '{"invocation": "inv-2", "follow": "inv-1", "pid": 7}\n{"invocation": "inv-3"\n[1]\n'
        '{"invocation": "inv-4", "follow": 5}\n{"invocation": "inv-2", "follow": "inv-0"}\n')
    out = progress.read(host / "events.jsonl", 0, host / "agent.json")
    assert out["attached"] == {"inv-2": "inv-0"}


class Frozen:
    """A clock for `progress.wait` that never moves: its deadline cannot pass, so only news can end the wait. It
    counts the readings (one at the start, then one a round: after the round's look at the file)."""

    def __init__(self) -> None:
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return 0.0

    def rounds(self, n: int, thread: threading.Thread) -> None:
        """Until `n` more rounds have begun from now (the wait has looked at the file since), or the wait ended."""
        until, end = self.reads + n, time.monotonic() + 30
        while self.reads < until and thread.is_alive():
            assert time.monotonic() < end, "the wait stopped polling"
            time.sleep(0.01)


def waiting(*args: Any, **kw: Any) -> tuple[threading.Thread, list[dict[str, Any]]]:
    """`progress.wait(*args, **kw)` in a thread of its own; its answer goes in the list."""
    out: list[dict[str, Any]] = []
    thread = threading.Thread(target=lambda: out.append(progress.wait(*args, **kw)), daemon=True)
    thread.start()
    return thread, out


def test_a_waiting_poll_answers_once_a_whole_line_arrives(host: Path) -> None:
    """`--wait`: a partial line keeps it waiting; the line's end wakes it (its deadline cannot: the clock is frozen)."""
    events, state = host / "events.jsonl", host / "agent.json"
    write_json(state, {"pid": os.getpid(), "state": "running"})
    append(events, b"old\n")
    clock = Frozen()
    thread, out = waiting(events, 4, state, wait_s=20, every_s=0.01, clock=clock)
    clock.rounds(2, thread)
    append(events, b"par")
    clock.rounds(2, thread)  # it has seen the partial line
    assert thread.is_alive() and out == [], out
    append(events, b"tial\n")
    thread.join(30)  # a hang detector: the line's end wakes it within a round
    assert not thread.is_alive(), "the wait did not answer the whole line"
    assert out[0]["lines"] == "partial\n" and out[0]["offset"] == 12


def test_a_waiting_poll_without_news_answers_at_its_deadline(host: Path) -> None:
    write_json(host / "agent.json", {"pid": os.getpid(), "state": "running"})
    t0 = time.monotonic()
    out = progress.wait(host / "events.jsonl", 0, host / "agent.json", wait_s=0.5, every_s=0.05)
    assert out["lines"] == "" and out["alive"] is True and time.monotonic() - t0 >= 0.5


def test_a_waiting_poll_answers_at_once_when_the_agent_is_gone(host: Path) -> None:
    """Its agent's process is gone: it answers without news (its deadline cannot end it: the clock is frozen)."""
    write_json(host / "agent.json", {"pid": dead_pid(), "state": "running"})
    thread, out = waiting(host / "events.jsonl", 0, host / "agent.json", wait_s=60, clock=Frozen())
    thread.join(30)  # a hang detector: it answers on its first look
    assert not thread.is_alive(), "the wait did not see its agent gone"
    assert out[0]["alive"] is False and out[0]["lines"] == ""


def test_the_wait_option_on_the_command_line(host: Path, capsys: pytest.CaptureFixture[str]) -> None:
    append(host / "events.jsonl", b"one\n")
    assert main(["progress", "--events", str(host / "events.jsonl"), "--state", str(host / "agent.json"),
                 "--wait", "30"]) == 0  # a line is there already: no waiting
    assert json.loads(capsys.readouterr().out)["lines"] == "one\n"

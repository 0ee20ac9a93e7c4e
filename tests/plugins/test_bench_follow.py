"""The `bench_follow` action under the real ansible-playbook: it polls `python -m agent progress` while a real
process writes the agent's state and events, shows each progress line as it happens and returns the configs'
outcomes; an agent that exits early fails the task."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import playbook

pytestmark = pytest.mark.playbook

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PYTHON = str(BIN / "python")
PLAYBOOK_TIMEOUT = 180
INVOCATION = "inv-1"

# The writer plays the agent: it records its own pid as running, then appends each event only once the previous
# event's progress line has been shown by the playbook (so every event needs its own poll), and exits (with or
# without suite_end). It gives up, with exit code 3, if a line is not shown in time.
WRITER = textwrap.dedent('''
    import os, sys, time
    from pathlib import Path
    from agent.records import Event
    from agent.store import HostStore, write_json

    root, host, invocation, output, mode = sys.argv[1:6]
    store = HostStore(Path(root), host, invocation=invocation)

    def shown(text, deadline=120.0):
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            try:
                if text in Path(output).read_text(errors="replace"):
                    return
            except FileNotFoundError:
                pass
            time.sleep(0.05)
        print(f"not shown in time: {text!r}", file=sys.stderr)
        sys.exit(3)

    shown("TASK [bench_follow]")
    write_json(store.dir / "agent.json", {"pid": os.getpid(), "state": "running", "invocation": invocation,
                                          "run_id": "r1"})
    store.event(Event.SUITE_START, n=1, run_id="r1", estimate_s=125)
    shown("suite r1: 1 configs, estimated 0:02:05")
    store.event(Event.CONFIG_START, k=1, n=1, config_id="tp1-autoregressive", elapsed_s=0.5, eta_s=125)
    shown("[1/1] tp1-autoregressive  elapsed 0:00:00  ETA 0:02:05")
    if mode == "die":
        sys.exit(0)
    store.event(Event.CONFIG_END, k=1, n=1, config_id="tp1-autoregressive", status="ok", reason=None, ready_s=1.5,
                requests_ok=3, requests=3, duration_s=2.25)
    shown("ok in 2.2 s (ready 1.5 s, 3/3 requests ok)")
    store.event(Event.SUITE_END, elapsed_s=3.5)
    write_json(store.dir / "agent.json", {"pid": os.getpid(), "state": "finished", "invocation": invocation,
                                          "run_id": "r1"})
''')


class Case:
    """A playbook in tmp_path that follows `<tmp>/results/r1/localhost`, and the writer that plays the agent."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.root = tmp / "results" / "r1"
        self.host_dir = self.root / "localhost"
        self.output = tmp / "playbook.out"
        self.result = tmp / "followed.json"
        (tmp / "writer.py").write_text(WRITER)
        (tmp / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {
            "ansible_connection": "local", "ansible_python_interpreter": PYTHON}}}}))
        follow = {"python": PYTHON, "agent_dir": str(ROOT), "events": str(self.host_dir / "events.jsonl"),
                  "state": str(self.host_dir / "agent.json"), "log": str(self.host_dir / "agent.log"),
                  "invocation": INVOCATION, "interval": 0.1, "start_timeout": 60, "timeout": 120}
        (tmp / "play.yml").write_text(yaml.safe_dump([{
            "hosts": "all", "gather_facts": False,
            "tasks": [
                {"name": "bench_follow", "bench_follow": follow, "register": "followed"},
                {"name": "keep the result", "ansible.builtin.copy": {
                    "content": "{{ followed | to_json }}", "dest": str(self.result), "mode": "0600"}},
            ]}], sort_keys=False))

    def env(self) -> dict[str, str]:
        """Its own temporary folders, and a log with each line's time (ansible's log_path)."""
        return {"ANSIBLE_LOCAL_TEMP": str(self.tmp / "ansible-local"),
                "ANSIBLE_REMOTE_TMP": str(self.tmp / "ansible-remote"), "ANSIBLE_LOG_PATH": str(self.tmp / "log")}

    def logged_at(self, text: str) -> float:
        """When the first line of the log holding `text` was written (epoch seconds)."""
        line = next(ln for ln in (self.tmp / "log").read_text().splitlines() if text in ln)
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()

    def play(self) -> subprocess.CompletedProcess[str]:
        return playbook.play(["-vvv", "-i", str(self.tmp / "inventory.yml"), str(self.tmp / "play.yml")],
                             env=self.env(), timeout=PLAYBOOK_TIMEOUT, output=self.output).proc

    def run(self, mode: str, invocation: str = INVOCATION) -> tuple[subprocess.CompletedProcess[str], str, int]:
        """(the playbook's run, its output, the writer's pid); the writer's events carry `invocation`."""
        writer = subprocess.Popen([PYTHON, str(self.tmp / "writer.py"), str(self.root), "localhost", invocation,
                                   str(self.output), mode], cwd=ROOT, env=playbook.ansible_env(self.env()),
                                  stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)
        # reap the writer as soon as it exits: a zombie would still look alive to `kill(pid, 0)`
        reaper = threading.Thread(target=writer.wait, daemon=True)
        reaper.start()
        try:
            res = self.play()
            reaper.join(timeout=60)
        finally:
            if writer.poll() is None:
                writer.kill()
                writer.wait(timeout=30)
        assert writer.stderr is not None
        err = writer.stderr.read()
        writer.stderr.close()
        assert writer.returncode == 0, err
        return res, self.output.read_text(), writer.pid


def polls(output: str) -> int:
    return sum("-m agent progress --events" in line for line in output.splitlines() if "EXEC" in line)


def shown_lines(output: str) -> list[str]:
    return [line.removeprefix("localhost: ") for line in output.splitlines() if line.startswith("localhost: ")]


def test_follow_shows_progress_and_returns_the_configs(tmp_path: Path) -> None:
    case = Case(tmp_path)
    res, output, _ = case.run("finish")
    assert res.returncode == 0, output[-4000:]
    assert shown_lines(output) == [
        "suite r1: 1 configs, estimated 0:02:05",
        "[1/1] tp1-autoregressive  elapsed 0:00:00  ETA 0:02:05",
        "      ok in 2.2 s (ready 1.5 s, 3/3 requests ok)",
        "suite finished in 0:00:04",
    ]
    # every event was written only after the previous one was shown: one poll at least for each
    assert polls(output) >= 4
    result: dict[str, Any] = json.loads(case.result.read_text())
    assert result["changed"] is True and not result.get("failed")
    assert result["configs"] == [{"config_id": "tp1-autoregressive", "status": "ok", "reason": None,
                                  "duration_s": 2.25}]
    assert result["elapsed_s"] == 3.5
    assert "ok=2" in output and "failed=0" in output


def test_an_agent_that_exits_early_fails_the_task(tmp_path: Path) -> None:
    case = Case(tmp_path)
    res, output, _ = case.run("die")
    assert res.returncode != 0, output[-4000:]
    assert shown_lines(output) == [
        "suite r1: 1 configs, estimated 0:02:05",
        "[1/1] tp1-autoregressive  elapsed 0:00:00  ETA 0:02:05",
    ]
    assert "the agent on localhost died without finishing the suite: no error recorded; see " \
           f"{case.host_dir / 'agent.log'}; re-run with the same run_id to resume" in output
    assert "without finishing the suite" in output
    assert not case.result.exists()  # the task failed: the play stopped there
    assert "failed=1" in output


def test_follow_attaches_to_a_run_already_in_progress(tmp_path: Path) -> None:
    """Another start of the agent (an earlier invocation) is running: its events are followed to the end."""
    case = Case(tmp_path)
    res, output, pid = case.run("finish", invocation="inv-0")
    assert res.returncode == 0, output[-4000:]
    lines = shown_lines(output)
    assert lines[0] == f"attaching to the run already in progress (pid {pid})"
    assert lines[1:] == ["suite r1: 1 configs, estimated 0:02:05",
                         "[1/1] tp1-autoregressive  elapsed 0:00:00  ETA 0:02:05",
                         "      ok in 2.2 s (ready 1.5 s, 3/3 requests ok)",
                         "suite finished in 0:00:04"]
    assert json.loads(case.result.read_text())["configs"][0]["config_id"] == "tp1-autoregressive"


def test_an_agent_that_never_starts_fails_after_the_start_timeout(tmp_path: Path) -> None:
    case = Case(tmp_path)
    play = yaml.safe_load((tmp_path / "play.yml").read_text())
    play[0]["tasks"][0]["bench_follow"]["start_timeout"] = 1
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    res = case.play()
    output = case.output.read_text()
    assert res.returncode != 0, output[-4000:]
    assert "the agent did not start on localhost within 1 s; see " f"{case.host_dir / 'agent.log'}" in output
    # it looked, and gave up no sooner than the deadline after the task began (how many polls fit in that second
    # is the machine's pace)
    assert polls(output) >= 1
    assert case.logged_at("did not start on localhost within") - case.logged_at("TASK [bench_follow]") >= 1.0

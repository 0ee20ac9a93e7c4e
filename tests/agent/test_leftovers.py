"""Processes that left their server's process group are found by their mark, killed and reported."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from agent.leftovers import MARK, kill_leftovers, marked


def test_a_process_that_left_the_group_is_found_killed_and_reported() -> None:
    mark = f"test/{os.getpid()}/{time.monotonic_ns()}"
    env = {**os.environ, MARK: mark}
    # the "server" starts a helper in a session of its own and exits: only the mark leads to the helper
    subprocess.run([sys.executable, "-c", "import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
                    "'import time; time.sleep(600)'], start_new_session=True)"], env=env, check=True, timeout=30)
    end = time.monotonic() + 10
    while not marked(mark) and time.monotonic() < end:
        time.sleep(0.05)
    [pid] = marked(mark)
    assert os.getsid(pid) == pid  # it left the group: a group kill would not reach it
    found = kill_leftovers(mark)
    assert [(f["pid"], f["gone"]) for f in found] == [(pid, True)] and "time.sleep(600)" in found[0]["cmdline"]
    assert marked(mark) == []
    assert kill_leftovers(mark) == []


def test_other_marks_and_unmarked_processes_are_left_alone() -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             env={**os.environ, MARK: "someone/else"})
    try:
        assert kill_leftovers("not/this/one") == []
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()

"""A workloads file that is a device without end or a FIFO without a writer, through the real `ansible-playbook
bench.yml -l local -e plan=true`: the plan fails within seconds, in one line naming the file, what it is and the
limit (agent/bounded.py), before anything reaches the host; not a worker read to death a minute later. The same
as an `-e @file`, which ansible-playbook reads itself: the command ends before it does (specfleet_guard)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import pytest

from agent import bounded

from .conftest import Bench
from .test_bad_input_playbook import assert_nothing_started

DEADLINE_S = 60  # a plan run takes seconds; reading /dev/zero killed its worker after about a minute


def _fifo(bench: Bench) -> Path:
    path = bench.tmp / "workloads.fifo"
    os.mkfifo(path)
    return path


KINDS: dict[str, tuple[Callable[[Bench], Path], str]] = {
    "dev-zero": (lambda bench: Path("/dev/zero"), "a character device, not a regular file"),
    "fifo": (_fifo, "a FIFO, not a regular file"),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_workloads_file_without_end_fails_the_plan_in_one_line(bench: Bench, kind: str) -> None:
    make, what = KINDS[kind]
    path = make(bench)
    res = bench.run({"plan": True, "bench_workloads_file": str(path)}, timeout=DEADLINE_S)
    out = assert_nothing_started(bench, res)
    limit = bounded.size_text(bounded.WORKLOADS_FILE.limit)
    line = f"bench_workloads_file: cannot read {path}: {what}; allowed: a regular file of at most {limit}"
    assert line in [ln.strip() for ln in out.splitlines()], out[-3000:]  # the task's msg, one line of its own
    assert "dead state" not in out


GUARD_DEADLINE_S = 30  # the guard ends ansible-playbook in about a second, before the inventory is read


@pytest.mark.parametrize("kind", list(KINDS))
def test_an_extra_vars_file_without_end_ends_the_command_in_one_line(bench: Bench, kind: str) -> None:
    """`-e @file` is read by ansible-playbook itself, in its main process, before any play: the inventory plugin
    specfleet_guard (enabled first in ansible.cfg) refuses it before that, exit status 1."""
    make, what = KINDS[kind]
    path = make(bench)
    res = bench.run({"plan": True}, "-e", f"@{path}", timeout=GUARD_DEADLINE_S)
    out = assert_nothing_started(bench, res)
    limit = bounded.size_text(bounded.ANSIBLE_FILE.limit)
    line = f"[ERROR]: -e @file: {path}: {what}; allowed: a regular file of at most {limit}"
    assert res.returncode == 1 and line in out.splitlines(), out[-3000:]
    assert "PLAY [" not in out

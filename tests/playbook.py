"""The one way the tests run the real `ansible-playbook`: this venv's ansible first on PATH, colours off, the
project's ansible.cfg (run from the repository root), a deadline, and the recap read back per host.

`tests/readme.py` is the other way in, on purpose: it runs README lines as a user types them in a shell.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ANSIBLE_PLAYBOOK = str(BIN / "ansible-playbook")


def ansible_env(extra: Mapping[str, str] | None = None, path: Sequence[os.PathLike[str] | str] = ()) -> dict[str, str]:
    """This process's environment with `path` then this venv's bin first on PATH and colour off, plus `extra`."""
    search = [str(p) for p in path] + [str(BIN), os.environ.get("PATH", "")]
    return {**os.environ, "PATH": ":".join(search), "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0",
            "ANSIBLE_RETRY_FILES_ENABLED": "0", "PYTHONUNBUFFERED": "1", **(extra or {})}


@dataclass
class Played:
    """One finished ansible-playbook run."""

    proc: subprocess.CompletedProcess[str]
    seconds: float

    @property
    def rc(self) -> int:
        return self.proc.returncode

    @property
    def out(self) -> str:
        return self.proc.stdout + self.proc.stderr

    def recap(self, host: str) -> dict[str, int]:
        """The PLAY RECAP counts of `host` ({} when the run printed none)."""
        m = re.search(rf"^{re.escape(host)}\s*:\s*((?:\w+=\d+\s*)+)$", self.proc.stdout, re.MULTILINE)
        return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))} if m else {}


def play(args: Sequence[str], *, env: Mapping[str, str] | None = None, path: Sequence[os.PathLike[str] | str] = (),
         timeout: float = 600, cwd: Path = ROOT, output: Path | None = None) -> Played:
    """`ansible-playbook *args`, run to its end (or the deadline: TimeoutExpired). With `output`, its stdout and
    stderr go to that file as they are written (for a test that watches the run) and are read back at the end."""
    t0 = time.monotonic()
    if output is None:
        proc = subprocess.run([ANSIBLE_PLAYBOOK, *args], cwd=cwd, env=ansible_env(env, path), capture_output=True,
                              text=True, timeout=timeout)
    else:
        with open(output, "w") as out:
            proc = subprocess.run([ANSIBLE_PLAYBOOK, *args], cwd=cwd, env=ansible_env(env, path), stdout=out,
                                  stderr=subprocess.STDOUT, text=True, timeout=timeout)
        proc.stdout, proc.stderr = output.read_text(errors="replace"), ""
    return Played(proc, time.monotonic() - t0)


def start(args: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path = ROOT,
          new_session: bool = False) -> subprocess.Popen[str]:
    """`ansible-playbook *args` started in the background, output on its stdout pipe (for tests that interrupt it;
    `new_session`: in its own session, so that the test can kill it with everything it forked)."""
    return subprocess.Popen([ANSIBLE_PLAYBOOK, *args], cwd=cwd, env=ansible_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=new_session)


def why(out: str, tail: int = 3000) -> str:
    """An assertion message for a run that failed: its failed tasks (with the task line above each), then the tail
    of its output; a failure on one host is often far above where the output ends."""
    lines = out.splitlines()
    failed = [f"{lines[i - 2] if i >= 2 else ''}\n{line}" for i, line in enumerate(lines)
              if line.startswith(("fatal:", "failed:"))]
    return "\n".join(failed)[-6000:] + "\n...\n" + out[-tail:]

"""The commands of README.md and of the docs/ pages it links, as a user types them: parsed from their `sh` blocks
and run unchanged.

The pages are read as one text: the README, then each page in the order the README first links it (`commands(page)`
gives one page's commands alone, e.g. `commands("docs/history.md")`). A command runs in the repository root through
bash, after every `. <file>` line that comes before it in that text (the README's virtualenv activation), with the
shipped inventory, host_vars and group_vars. The only
thing a test fills in is what the README leaves to the reader: `<id>` and `<old-id>` (run ids the test made) and
one of the alternatives `md|csv|json`; `[<id>]` is run with and without the id.
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def pages() -> list[Path]:
    """README.md, then each docs/ page in the order the README first links it."""
    linked = re.findall(r"\]\((docs/[\w.-]+\.md)(?:#[\w-]*)?\)", README.read_text())
    return [README, *(ROOT / name for name in dict.fromkeys(linked))]


def page_path(page: str | Path) -> Path:
    """One of the pages, named by its path from the repository root (`"README.md"`, `"docs/history.md"`)."""
    path = (ROOT / page).resolve()
    assert path in pages(), f"not the README or a docs/ page it links: {page}"
    return path


def text(page: str | Path | None = None) -> str:
    """The README and its docs/ pages as one text (for a test that checks what they say); with `page`, that page."""
    if page is not None:
        return page_path(page).read_text()
    return "\n".join(path.read_text() for path in pages())


def readme_lines(page: str | Path | None = None) -> list[str]:
    """Every command line of the pages' `sh` blocks (with `page`, of that page's), comments and continuation
    comments removed, in order."""
    out: list[str] = []
    for block in re.findall(r"^```sh\n(.*?)^```", text(page), re.M | re.S):
        for raw in block.splitlines():
            line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
            if line:
                out.append(line)
    return out


def commands(page: str | Path | None = None) -> list[str]:
    """The commands of the README and its pages (one that appears twice is one command), sourcing lines included;
    with `page` (e.g. `"docs/history.md"`), that page's commands alone, in its order. Each runs as typed with `typed`,
    after the sourcing lines that come before it in the whole text."""
    seen: list[str] = []
    for line in readme_lines(page):
        if line not in seen:
            seen.append(line)
    return seen


def _sourced_before(command: str) -> list[str]:
    lines = readme_lines()
    first = lines.index(command)
    return [line for line in lines[:first] if line.startswith(". ")]


def resolves(host: str) -> bool:
    """Whether a host name resolves here (a test must not start a real suite on a real GPU host)."""
    try:
        socket.getaddrinfo(host, 22)
    except OSError:
        return False
    return True


def typed(command: str, *, timeout: float, run_id: str | None = None, fmt: str | None = None,
          old_run_id: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run one README command as typed; `<id>`, `[<id>]`, `<old-id>` and `md|csv|json` filled in as the reader
    would."""
    script, env = _shell(command, run_id, fmt, old_run_id)
    return subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def typed_start(command: str) -> subprocess.Popen[str]:
    """One README command as typed, started in the background (its own session), stdout and stderr on one pipe."""
    script, env = _shell(command, None, None, None)
    return subprocess.Popen(["bash", "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL, start_new_session=True)


def _shell(command: str, run_id: str | None, fmt: str | None, old_run_id: str | None) -> tuple[str, dict[str, str]]:
    """The bash script of a README command as typed, and the environment of a new shell."""
    assert command in commands(), f"not a command of the README or its pages: {command}"
    line = command
    if "<old-id>" in line:
        assert old_run_id, f"{command} needs an earlier run id"
        line = line.replace("<old-id>", old_run_id)
    if "[<id>]" in line:
        line = line.replace("[<id>]", run_id or "")
    elif "<id>" in line:
        assert run_id, f"{command} needs a run id"
        line = line.replace("<id>", run_id)
    if "md|csv|json" in line:
        assert fmt in ("md", "csv", "json"), fmt
        line = line.replace("md|csv|json", fmt)
    script = " && ".join([*_sourced_before(command), line])
    # as in a new shell: no Ansible settings, no virtualenv, not inside `make test`'s make
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANSIBLE_", "VIRTUAL_ENV")) and k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    # the project's virtualenv is on PATH only once the README's activation line ran
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if Path(p) != ROOT / ".venv/bin")
    return script, env

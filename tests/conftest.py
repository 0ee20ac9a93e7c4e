"""Shared test paths, and the markers that say what a test needs and costs, set here by where it lives:

- `playbook`: runs the real ansible-playbook (tests/playbooks, tests/plugins, the role runs in tests/roles);
- `slow`: minutes — the real CPU engine, test hosts or containers (tests/playbooks, tests/hosts, the role runs);
- `testhosts`: the systemd-nspawn test hosts (root); `gpu`: a real NVIDIA GPU (tests/gpu);
- `engine`: the real CPU engine (set by the tests themselves: the claim is the engine's).

`make test-fast` runs what is not slow; `make test` runs everything on two workers (pytest-xdist) and lists the
slowest tests. The work units keep what shares a resource on one worker, one test at a time (`group_of`): `serial`
holds every run of this machine's suite (the real engine's and the stand-in's: their kill windows and deadlines are
timed, and the engine takes a core) and the engine contract, `testhosts` the tests of the two test hosts (one
session fixture builds them); every other module is a unit of its own.
"""
from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROLE_RUNS = {"test_container_roles_render.py", "test_gpu_smoke_check_mode.py", "test_lxc_passthrough.py",
             "test_pve_passthrough.py"}
TESTHOSTS = {"test_testhosts_suite.py", "test_provision_hosts.py", "test_testhosts.py", "test_device_allow.py"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath))
        folder = path.parent.name
        if folder in ("playbooks", "plugins") or path.name in ROLE_RUNS:
            item.add_marker(pytest.mark.playbook)
        if folder in ("playbooks", "hosts") or path.name in ROLE_RUNS:
            item.add_marker(pytest.mark.slow)
        if path.name in TESTHOSTS:
            item.add_marker(pytest.mark.testhosts)
        if folder == "gpu":
            item.add_marker(pytest.mark.gpu)


# this machine's suite runs, the engine contract, and the agent's tests that time CPU slots and progress windows
SERIAL = ("tests/playbooks/", "tests/standin/test_contract.py", "tests/agent/test_suite_pack.py",
          "tests/agent/test_live_progress.py")
FIRST = ("serial", "testhosts")  # the longest groups start first, one on each worker


def group_of(nodeid: str) -> str:
    """The xdist work unit of a test: `testhosts`, `serial`, or its own module."""
    path = nodeid.split("::", 1)[0]
    if Path(path).name in TESTHOSTS:
        return "testhosts"
    return "serial" if path.startswith(SERIAL) else path


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Whole groups to one worker each (`group_of`), the longest first. (xdist's own `--dist loadgroup` reads
    markers through a node attribute this pytest no longer has.)"""
    from xdist.scheduler import LoadScopeScheduling

    class Groups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

        def _assign_work_unit(self, node: object) -> None:
            for name in reversed(FIRST):
                if name in self.workqueue:
                    self.workqueue.move_to_end(name, last=False)
            super()._assign_work_unit(node)

    return Groups(config, log)


@contextlib.contextmanager
def short_tmp(prefix: str = "sf-") -> Iterator[Path]:
    """A temporary folder with a short path, removed afterwards: the real engine's IPC sockets live under it, and
    a Unix socket path holds 107 bytes at most (pytest's tmp_path under an xdist worker is too long for that)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


_SECONDS: dict[str, float] = {}
_SPAN: dict[str, tuple[float, float]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    folder = str(Path(report.nodeid.split("::")[0]).parent)
    _SECONDS[folder] = _SECONDS.get(folder, 0.0) + report.duration
    first, last = _SPAN.get(folder, (report.start, report.stop))
    _SPAN[folder] = (min(first, report.start), max(last, report.stop))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Where the run's time went, by test folder: the tests' own time (setup, call and teardown together, summed
    over the workers) and the wall from its first test's start to its last test's end."""
    if not _SECONDS:
        return
    terminalreporter.section("time by folder")
    total = sum(_SECONDS.values())
    wall = max(stop for _, stop in _SPAN.values()) - min(start for start, _ in _SPAN.values())
    terminalreporter.write_line(f"{'tests':>9}  {'share':>6}  {'wall':>9}  folder   (all tests: {total / 60:.1f} min "
                                f"of test time in {wall / 60:.1f} min of wall)")
    for folder, seconds in sorted(_SECONDS.items(), key=lambda kv: -kv[1]):
        span = _SPAN[folder][1] - _SPAN[folder][0]
        terminalreporter.write_line(f"{seconds / 60:5.1f} min  {100 * seconds / total:5.1f}%  {span / 60:5.1f} min  "
                                    f"{folder}")

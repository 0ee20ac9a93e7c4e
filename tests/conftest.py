"""Shared test paths, and the markers that say what a test needs and costs, set here by where it lives:

- `playbook`: runs the real ansible-playbook (tests/playbooks, tests/plugins, the role runs in tests/roles);
- `slow`: minutes — the real CPU engine (wherever a test starts it), test hosts or containers (tests/playbooks,
  tests/hosts, the role runs);
- `testhosts`: the systemd-nspawn test hosts (root); `gpu`: a real NVIDIA GPU (tests/gpu);
- `engine`: the real CPU engine (set by the tests themselves: the claim is the engine's).

`make test-fast` runs what is not slow; `make test` runs everything on two workers (pytest-xdist) and lists the
slowest tests. The work units keep what shares a resource on one worker, one test at a time (`GROUPS` below).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROLE_RUNS = {"test_container_roles_render.py", "test_gpu_smoke_check_mode.py", "test_lxc_passthrough.py",
             "test_pve_passthrough.py", "test_playbook_tags.py"}
TESTHOSTS = {"test_testhosts_suite.py", "test_provision_hosts.py", "test_testhosts.py", "test_device_allow.py",
             "test_ct200_testhosts.py"}


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
        if item.get_closest_marker("engine"):  # a real engine server: not for `make test-fast`
            item.add_marker(pytest.mark.slow)


# The work units (`group_of`), each on one worker, one test at a time:
# - `engine`: the real CPU engine's runs on this machine (`make demo` and the commands on its run, the packed run,
#   the exposed server, the engine contract): each takes a core, and the README's runs share `.work/hosts/local`;
# - `standin`: this machine's suites with the stand-in engine, and the agent's timed CPU-slot and progress tests:
#   kill windows and deadlines, kept off each other;
# - `testhosts`: the tests of the two shared test hosts (one session fixture builds them);
# - `provision` and `harness`: the provisioning hosts and the harness's own hosts (each module builds its own);
# every other module is a unit of its own.
GROUPS = {
    "engine": ("tests/playbooks/test_readme_local.py", "tests/playbooks/test_pack_local.py",
               "tests/playbooks/test_security.py", "tests/standin/test_contract.py"),
    "standin": ("tests/playbooks/", "tests/agent/test_suite_pack.py", "tests/agent/test_live_progress.py"),
    "testhosts": ("tests/playbooks/test_testhosts_suite.py", "tests/playbooks/test_device_allow.py",
                  "tests/playbooks/test_ct200_testhosts.py"),
    "provision": ("tests/playbooks/test_provision_hosts.py",),
    "harness": ("tests/hosts/test_testhosts.py",),
}
# The units of a minute or more, longest first (as measured in CI): the short ones fill the gaps at the end, so that
# no long unit runs alone on one worker while the other has nothing left.
FIRST = ("engine", "testhosts", "standin", "tests/roles/test_container_roles_render.py", "provision",
         "tests/roles/test_pve_passthrough.py", "tests/roles/test_lxc_passthrough.py")


def group_of(nodeid: str) -> str:
    """The xdist work unit of a test: the first group whose path prefix it has, else its own module."""
    path = nodeid.split("::", 1)[0]
    for name in ("engine", "testhosts", "provision", "harness", "standin"):  # `standin` holds the playbooks left
        if path.startswith(GROUPS[name]):
            return name
    return path


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


@pytest.fixture(scope="session")
def engine_help(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real CPU engine's `--help`, read once per worker by the agent's own reader, in the file a host keeps it
    in (its key names the engine's Python, module and build: agent/probe.py). Tests whose claim is not reading it
    start from it (`Bench.seed_engine_help`); the engine contract compares the stand-in's flags with it."""
    from agent import probe
    from agent.engines import DISTRIBUTIONS, ENGINES

    python = ROOT / ".cache/engine-venv/bin/python"
    module = ENGINES["vllm"].module
    read = probe.engine(str(python), module, DISTRIBUTIONS["vllm"], {**os.environ, "VLLM_NO_USAGE_STATS": "1"},
                        arg=ENGINES["vllm"].help_arg)
    assert read.get("flags") and read.get("key"), read
    path = probe.cache_path(str(tmp_path_factory.mktemp("engine-help")), read["key"])
    path.write_text(json.dumps({"python": str(python), "module": module, "version": read["version"],
                                "flags": read["flags"], "choices": read["choices"], "features": read["features"],
                                "defaults": read["defaults"]}))
    return path


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

"""Every controller step's exit status means one thing (collector/__main__.py, docs/results.md): 0 done, 1 the verdict
only, 2 refused, 3 the system refused an operation, 4 a fault in specfleet. An error of any subcommand is said as
itself, in one line naming the operation, the path, the system's reason and what to do, and never as a verdict.

The full disk is a real one: a small tmpfs (root only), filled, under a run folder written by the agent's own record
writers; each step that writes (stamp, unpack, finish, report --write, plot, db) is run on it, must exit 3 naming
the space problem and leave every file as it was, and after the space is freed the same command brings the run
home."""
from __future__ import annotations

import argparse
import errno
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
import yaml

from agent import records
from agent.bounded import BoundError
from agent.classify import Reason
from agent.config_run import Host, Result, fresh_folder, record
from agent.engines import ENGINES
from agent.records import Outcome
from agent.store import HostStore, write_json
from collector import __main__ as cli
from controller import matrix
from tests.collector.test_cli import parsers
from tests.disk import fill, tmpfs

ROOT = Path(__file__).resolve().parents[2]
HOST, TOKENS, REPS = "cpu1", 32, 3
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


# ---------------------------------------------------------------------------------------------------------------
# A run as the agent writes it, and a full filesystem
# ---------------------------------------------------------------------------------------------------------------

def agent_run(results: Path, run_id: str = "run-00", host: str = HOST, failed: bool = False) -> Path:
    """results/<run_id>/<host>/ through the agent's own writers: a baseline and an n-gram config over two
    workloads (`failed`: every config failed, so that the run fails bench_fail_on), then run.json by `stamp`."""
    suite = {"suite_name": "exit", "engine": "vllm", "engine_python": "/opt/vllm/bin/python",
             "model": {"name": "tiny", "path": "/models/tiny"}, "repetitions": REPS,
             "phases": [{"name": "tp1", "configs": [{"method": "autoregressive"},
                                                    {"method": "ngram", "num_speculative_tokens": 2}],
                         "sweeps": [{"workloads": ["fib", "qsort"], "max_tokens": [TOKENS]}]}]}
    run_dir = results / run_id
    store = HostStore(run_dir, host)
    on = Host(suite=suite, engine=ENGINES["vllm"], store=store, engine_info={"version": "0.20.0"})
    write_json(store.dir / "host.json", {"host": host, "gpus": {"count": 0, "devices": []},
                                         "engine": {"distribution": "vllm", "version": "0.20.0"}})
    store.event(records.Event.SUITE_END, elapsed_s=1.0)
    for cfg in matrix.expand(suite):
        folder = fresh_folder(store, cfg["config_id"])
        if failed:
            record(on, cfg, Result.failed(Reason.CRASHED, "killed"), folder, "2026-12-01T10:00:00.000+00:00")
            continue
        ident = {"host": host, "config_id": cfg["config_id"], "method": cfg["method"], "tp": cfg["tp"],
                 "method_params": cfg["method_params"], "engine": cfg["engine"], "model": cfg["model"]["name"],
                 "phase": cfg["phase"]}
        tok = 20.0 if cfg["method"] == "autoregressive" else 30.0
        rows = [records.request_row(ident, cell, rep, {
            "prompt_tokens": 10, "completion_tokens": TOKENS, "ttft_s": 0.05, "e2e_s": TOKENS / (tok + rep),
            "output_tok_s": tok + rep, "ok": True, "error": None, "sent_s": rep * 2.0,
            "done_s": rep * 2.0 + TOKENS / (tok + rep)}) for cell in cfg["cells"] for rep in range(REPS)]
        record(on, cfg, Result(Outcome.OK, rows=rows, argv=cfg["command"], fields={"ready_s": 1.0}), folder,
               "2026-12-01T10:00:00.000+00:00")
    assert cli.main(["stamp", str(run_dir), "start", "--suite", "exit", "--hosts", host]) == 0
    return run_dir


def files(root: Path) -> dict[str, bytes]:
    """Every file under `root` (the filler aside) by its path: what a failed step must leave as it was."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "filler"}


def said(err: str) -> str:
    """The last line a step wrote to stderr: its one-line message."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines, "the step said nothing on stderr"
    return lines[-1]


# ---------------------------------------------------------------------------------------------------------------
# Every subcommand: what it raises is said as itself, with its own status
# ---------------------------------------------------------------------------------------------------------------

def argv_of(name: str, p: argparse.ArgumentParser) -> list[str]:
    """The least command line the subcommand's parser takes: each positional and required option given."""
    out = [name]
    for a in p._actions:
        if isinstance(a, argparse._HelpAction) or (a.option_strings and not a.required):
            continue
        if not a.option_strings and a.nargs in ("?", "*"):
            continue
        value = str(list(a.choices)[0]) if a.choices else "x"
        out += [a.option_strings[0], value] if a.option_strings else [value]
    return out


SUBCOMMANDS = {name: p for name, p in parsers().items() if name != "specfleet"}
FAULTS: list[tuple[str, Callable[[str], BaseException], int, list[str]]] = [
    ("disk-full", lambda path: OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path), cli.SYSTEM,
     ["No space left on device", "free space on the filesystem that holds {path}"]),
    ("read-only", lambda path: OSError(errno.EROFS, os.strerror(errno.EROFS), path), cli.SYSTEM,
     ["Read-only file system", "make the filesystem that holds {path} writable"]),
    ("permission", lambda path: PermissionError(errno.EACCES, os.strerror(errno.EACCES), path), cli.SYSTEM,
     ["Permission denied", "give this user access to it"]),
    ("not-installed", lambda path: ModuleNotFoundError("No module named 'ansible_runner'", name="ansible_runner"),
     cli.SYSTEM, ["failed: ansible_runner is not installed here", "`make venv`", "then run the same command again"]),
    ("fault", lambda path: KeyError("a key specfleet expected"), cli.FAULT,
     ["stopped on an unexpected error, KeyError", "a fault in specfleet", "please report it"]),
    ("no-file", lambda path: BoundError(errno.EINVAL, "a FIFO, not a regular file; allowed: a regular file of at "
                                        "most 64 MiB", path), cli.REFUSED,
     ["refused: {path}: a FIFO, not a regular file; allowed: a regular file of at most 64 MiB", "left as it is",
      "move it away"]),
]


def test_every_subcommand_has_an_operation_to_name() -> None:
    assert set(SUBCOMMANDS) == set(cli.OPERATIONS), "a new subcommand needs its words in OPERATIONS"
    assert len({cli.DONE, cli.VERDICT, cli.REFUSED, cli.SYSTEM, cli.FAULT, cli.PULL_FAILED}) == 6


@pytest.mark.parametrize("fault", FAULTS, ids=[f[0] for f in FAULTS])
@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_an_error_of_any_subcommand_is_said_as_itself_never_as_a_verdict(
        name: str, fault: tuple[str, Callable[[str], BaseException], int, list[str]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _, make, status, words = fault
    path = str(tmp_path / "results" / "run-00" / "report.html")
    real = argparse.ArgumentParser.parse_args
    system = isinstance(make(path), OSError)

    def raising(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> argparse.Namespace:
        ns = real(self, *args, **kwargs)

        def func(_: argparse.Namespace) -> int:
            raise make(path)

        ns.func = func
        return ns

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", raising)
    rc = cli.main(argv_of(name, SUBCOMMANDS[name]))
    err = capsys.readouterr().err
    line = said(err)
    assert rc == status and rc not in (cli.DONE, cli.VERDICT)
    assert line.startswith(f"specfleet {name}: {cli.OPERATIONS[name]} "), line
    for w in words:
        assert w.format(path=path) in line, line
    if system:
        assert f": {path}: " in line and "then run the same command again" in line
    if status in (cli.SYSTEM, cli.REFUSED):
        assert "Traceback" not in err
    else:
        assert "Traceback (most recent call last)" in err  # where the fault is, above its line


# ---------------------------------------------------------------------------------------------------------------
# A real full disk under each step that writes
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder (the agent's writers) and its host's archive, as the host packs it, outside any tmpfs."""
    base = tmp_path_factory.mktemp("exit-source")
    run_dir = agent_run(base / "results")
    with tarfile.open(base / f"{HOST}.tar.gz", "w:gz") as tar:
        tar.add(run_dir / HOST, arcname=HOST)
    return base


# step -> (its arguments on the run folder R, the archive A and results folder S; what shows the run came home)
STEPS: dict[str, tuple[list[str], Callable[[Path], bool]]] = {
    "stamp": (["stamp", "{R}", "finish", "--suite", "exit", "--hosts", HOST],
              lambda r: json.loads((r / "run.json").read_text())["finished_at"] is not None),
    "unpack": (["unpack", "{R}", HOST, "{A}"], lambda r: (r / HOST / "events.jsonl").is_file()
               and not any(p.name.startswith(".") for p in r.iterdir())),
    "finish": (["finish", "{R}", "--hosts", HOST, "--no-plots"],
               lambda r: (r / "report.md").read_text().startswith("# Run run-00")
               and json.loads((r / "run.json").read_text())["finished_at"] is not None),
    "report": (["report", "{R}", "--write", "--db", ""], lambda r: (r / "report.html").is_file()),
    "plot": (["plot", "{R}", "--db", ""], lambda r: len(list((r / "plots").glob("*.png"))) > 0),
    "db": (["db", "--results", "{S}"], lambda r: (r.parent / "specfleet.duckdb").is_file()),
}


@ROOT_ONLY
@pytest.mark.parametrize("step", sorted(STEPS))
def test_a_full_disk_is_said_as_itself_and_the_same_command_brings_the_run_home(
        step: str, source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args, home = STEPS[step]
    with tmpfs(tmp_path / "fs") as fs:
        run_dir = fs / "results" / "run-00"
        shutil.copytree(source / "results" / "run-00", run_dir)
        argv = [a.format(R=run_dir, A=source / f"{HOST}.tar.gz", S=fs / "results") for a in args]
        before = files(fs)
        filler = fill(fs)
        capsys.readouterr()
        rc = cli.main(argv)
        err = capsys.readouterr().err
        line = said(err)
        assert rc == cli.SYSTEM, err
        assert re.match(rf"specfleet {step}: {re.escape(cli.OPERATIONS[step])} failed: {re.escape(str(fs))}/\S+: "
                        r"No space left on device; free space on the filesystem that holds \S+, then run the same "
                        r"command again \(", line), line
        assert "Traceback" not in err
        assert files(fs) == before  # nothing half-written, nothing lost
        filler.unlink()
        assert cli.main(argv) == cli.DONE, capsys.readouterr().err
        assert home(run_dir)
        assert [str(p) for p in fs.rglob("*.tmp")] == []


@ROOT_ONLY
@pytest.mark.parametrize("failed", [False, True], ids=["passes", "fails-bench_fail_on"])
def test_the_report_step_on_a_full_disk_exits_3_apart_from_its_verdict(failed: bool, tmp_path: Path) -> None:
    """`python -m collector finish` as the role runs it: on a full disk status 3 and the space problem as its last
    line, never the verdict's 1; with room again the same command exits with the verdict (0, or 1 for a run whose
    statuses fail bench_fail_on) and its JSON line."""
    with tmpfs(tmp_path / "fs") as fs:
        run_dir = agent_run(fs / "results", host="local", failed=failed)
        argv = [sys.executable, "-m", "collector", "finish", str(run_dir), "--suite", "exit", "--no-plots",
                "--fail-on", "none_ok", "--hosts", "local"]
        host_files = files(run_dir / "local")
        filler = fill(fs)
        full = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert full.returncode == 3, full.stderr
        assert "No space left on device; free space on the filesystem that holds" in said(full.stderr)
        assert full.stdout == "" and "Traceback" not in full.stderr
        assert files(run_dir / "local") == host_files
        filler.unlink()
        again = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert again.returncode == (1 if failed else 0), again.stderr
        verdict = json.loads(again.stdout.splitlines()[-1])
        assert verdict["ok"] is not failed and verdict["lines"][0].startswith("local: 2 configs: ")


# ---------------------------------------------------------------------------------------------------------------
# The role: a controller step's output is read only under its documented statuses
# ---------------------------------------------------------------------------------------------------------------

def controller_steps() -> list[tuple[str, int, dict[str, Any], list[dict[str, Any]]]]:
    """(task file, index, task, the tasks after it) of every role task that runs the collector."""
    out = []
    for path in sorted((ROOT / "roles" / "bench" / "tasks").glob("*.yml")):
        tasks = yaml.safe_load(path.read_text()) or []
        for i, task in enumerate(tasks):
            argv = str((task.get("ansible.builtin.command") or {}).get("argv", ""))
            if "'collector'" in argv:
                out.append((path.name, i, task, tasks[i + 1:]))
    return out


def _step_id(step: tuple[str, int, dict[str, Any], list[dict[str, Any]]]) -> str:
    return f"{step[0]}:{step[2]['name'][:40]}"


STEPS_IN_ROLE = controller_steps()


def test_the_role_runs_the_steps_this_table_knows() -> None:
    steps = {m.group(1) for _, _, t, _ in STEPS_IN_ROLE
             for m in [re.search(r"'collector', '(\w+)'", str(t["ansible.builtin.command"]["argv"]))] if m}
    assert steps >= {"finish", "unpack", "stamp"}  # what it finds: each is checked below
    assert len(STEPS_IN_ROLE) >= 4  # finish, stamp, and unpack twice (freeing the archive's place, then unpacking)


@pytest.mark.parametrize("step", STEPS_IN_ROLE, ids=[_step_id(s) for s in STEPS_IN_ROLE])
def test_a_controller_step_fails_with_its_own_message_and_its_output_is_read_only_on_its_statuses(
        step: tuple[str, int, dict[str, Any], list[dict[str, Any]]]) -> None:
    """A step either fails on any status but 0 (Ansible's own rule), or reads its statuses itself: then a task right
    after it fails with its last line of stderr on every status but the documented ones, and every later task that
    reads its output runs only under those statuses."""
    _, _, task, later = step
    assert "ignore_errors" not in task
    reg: Optional[str] = task.get("register")
    assert reg and str(task.get("failed_when")).lower() == "false", task["name"]  # Ansible's own words: never
    fail = later[0]
    assert "ansible.builtin.fail" in fail and f"{reg}.stderr_lines" in fail["ansible.builtin.fail"]["msg"]
    m = re.search(rf"{reg}\.rc (not in \[[\d, ]+\]|!= 0)", str(fail.get("when")))
    assert m, fail.get("when")
    if task.get("check_mode") is not False:  # skipped in check mode, without an rc: the fail must not read one
        assert str(fail.get("when")).startswith("not ansible_check_mode and "), fail.get("when")
        assert "not ansible_check_mode" in str(task.get("when")), task["name"]
    assert fail.get("run_once", False) == task.get("run_once", False), fail["name"]  # said once, or for each host
    documented = "[0]" if m.group(1) == "!= 0" else m.group(1).removeprefix("not in ")
    for t in later[1:]:
        if f"{reg}.stdout" in json.dumps(t):
            assert re.search(rf"{reg}\.rc (in {re.escape(documented)}|== \d)", str(t.get("when"))), t["name"]


# ---------------------------------------------------------------------------------------------------------------
# The plan and follow actions: what stops them is said as itself
# ---------------------------------------------------------------------------------------------------------------

ACTIONS = [("bench_plan", "the plan for local ", "nothing was started"),
           ("bench_follow", "following the suite on local ", "the suite goes on on the host; with the same run_id")]


ACTION_FAULTS = [f for f in FAULTS if f[0] != "not-installed"]  # the actions' imports are Ansible's to load


@pytest.mark.parametrize("fault", ACTION_FAULTS, ids=[f[0] for f in ACTION_FAULTS])
@pytest.mark.parametrize("action", ACTIONS, ids=[a[0] for a in ACTIONS])
def test_the_plan_and_follow_actions_say_what_stopped_them_as_itself(
        action: tuple[str, str, str], fault: tuple[str, Callable[[str], BaseException], int, list[str]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    name, head, then = action
    spec = importlib.util.spec_from_file_location(name, ROOT / "plugins" / "action" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    exc = fault[1]("/results/run-00/local")

    def fails(*_: Any) -> dict[str, Any]:
        raise exc

    # the action's own run(), stopped by the error where it first reaches Ansible (ActionBase.run)
    monkeypatch.setattr(module.ActionBase, "run", fails)
    got = module.ActionModule.run(object.__new__(module.ActionModule), None, {"inventory_hostname": "local"})
    line = got["msg"]
    assert got["failed"] is True and type(exc).__name__ in got["exception"]
    assert "\n" not in line and then in line, line
    if isinstance(exc, BoundError):  # a file named that is no file: what it is, in place of the errno's words
        assert line.startswith(f"{head}refused /results/run-00/local: a FIFO, not a regular file;"), line
        assert "move it away, then run the same command again" in line, line
    elif isinstance(exc, OSError):
        assert f"/results/run-00/local: {os.strerror(exc.errno)}" in line and line.startswith(head), line
    else:
        assert "an unexpected error, KeyError" in line and "a fault in specfleet" in line, line


# ---------------------------------------------------------------------------------------------------------------
# The bench_agent lookup: an error building the agent's archive is said as the steps say it
# ---------------------------------------------------------------------------------------------------------------

# (what the system raised, given the path; what the line says of it)
LOOKUP_FAULTS: list[tuple[str, Callable[[str], OSError], list[str]]] = [
    ("disk-full", lambda path: OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path),
     ["{path}: No space left on device; free space on its filesystem, then run the same command again"]),
    ("disk-full, no file named", lambda path: OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
     ["{cache}: No space left on device; free space on its filesystem, then run the same command again"]),
    ("read-only", lambda path: OSError(errno.EROFS, os.strerror(errno.EROFS), path),
     ["{path}: Read-only file system; make its filesystem writable, then run"]),
    ("permission", lambda path: PermissionError(errno.EACCES, os.strerror(errno.EACCES), path),
     ["{path}: Permission denied; give this user access to it, then run"]),
    ("no agent package", lambda path: FileNotFoundError(f"no agent package with a __main__.py under {path}"),
     ["failed: no agent package with a __main__.py under {path}; run from specfleet's project folder"]),
]


@pytest.mark.parametrize("fault", LOOKUP_FAULTS, ids=[f[0] for f in LOOKUP_FAULTS])
def test_the_agent_lookup_says_a_system_error_as_the_steps_do(
        fault: tuple[str, Callable[[str], OSError], list[str]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench_agent lookup (the agent's archive, built into the user's cache): one line with the operation, the
    path (the cache folder where the system named none), the reason and what to do; never Python's own words."""
    import importlib.util

    from ansible.errors import AnsibleError

    spec = importlib.util.spec_from_file_location("bench_agent", ROOT / "plugins" / "lookup" / "bench_agent.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = str(tmp_path / "cache" / "specfleet" / "agent.pyz")
    _, make, words = fault

    def fails(project: Path) -> Path:
        raise make(path)

    monkeypatch.setattr(module, "build", fails)
    with pytest.raises(AnsibleError) as raised:
        module.LookupModule().run([str(ROOT)])
    line = raised.value.message
    assert raised.value.__cause__ is None  # Ansible adds no words of the OSError's own
    assert "\n" not in line and line.startswith("building the agent's archive for the hosts failed: "), line
    assert line.endswith("(nothing was sent to a host)") and "[Errno" not in line, line
    for w in words:
        assert w.format(path=path, cache=tmp_path / "cache" / "specfleet") in line, line


# ---------------------------------------------------------------------------------------------------------------
# compare: a folder that is not a run is refused with what to do; a read the system refuses is its refusal
# ---------------------------------------------------------------------------------------------------------------

def _refusing(monkeypatch: pytest.MonkeyPatch, at: Path) -> None:
    """Reading the run at `at` fails as a folder the system will not list does."""
    from collector import compare

    real = compare.load_run

    def load(root: Path, *args: Any, **kwargs: Any) -> Any:
        if root == at:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(root))
        return real(root, *args, **kwargs)

    monkeypatch.setattr(compare, "load_run", load)


# (the folder given as run B, made under the test's folder; the status; what the last line says of it)
COMPARE_CASES: list[tuple[str, Callable[[Path], None], int, list[str]]] = [
    ("no such folder", lambda at: None, cli.REFUSED, ["no such run folder: {B}; name a run's folder"]),
    ("a file", lambda at: at.write_text("my notes\n"), cli.REFUSED, ["not a run folder: {B}; name a run's folder"]),
    ("a folder without config results", lambda at: at.mkdir(), cli.REFUSED,
     ["{B}: no config results in this run folder; name a run's folder, results/<run_id>", "`specfleet pull`"]),
    ("a run folder the system will not read", lambda at: shutil.copytree(at.parent / "results" / "run-00", at),
     cli.SYSTEM, ["specfleet compare: reading the two runs failed: {B}: Permission denied; give this user access "
                  "to it, then run the same command again"]),
]


@pytest.mark.parametrize("case", COMPARE_CASES, ids=[c[0] for c in COMPARE_CASES])
def test_compare_says_a_folder_that_is_not_a_run_and_a_refused_read_in_one_line(
        case: tuple[str, Callable[[Path], None], int, list[str]], source: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _, make, status, words = case
    shutil.copytree(source / "results", tmp_path / "results")
    b = tmp_path / "b"
    make(b)
    if status == cli.SYSTEM:
        _refusing(monkeypatch, b)
    capsys.readouterr()
    rc = cli.main(["compare", str(tmp_path / "results" / "run-00"), str(b)])
    err = capsys.readouterr().err
    assert rc == status, err
    assert [line for line in err.splitlines() if not line.startswith("warning: ")] == [said(err)], err  # one line
    for w in words:
        assert w.format(B=b) in said(err), said(err)
    assert "Traceback" not in err

"""Files read because a user named them (agent/bounded.py): every input specfleet reads from a place the user names,
planted as each bad kind of file (a device without end, a FIFO without a writer, a folder, a file over its limit)
is refused in one line naming the file, what it is and the limit, within seconds, and read as before when it is
a fine one. Each case runs in a child process of its own with a deadline and a cap on its memory, so that a
reader that would block on the FIFO or read /dev/zero without end fails the case instead of the machine. What
Ansible reads itself before the play (-e @file, the inventory, host_vars/ and group_vars/) is judged by the inventory
plugin specfleet_guard, here in the table and in the programs that run it."""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import pytest

from agent import bounded, probe, progress, records
from agent.bounded import Bound
from agent.machine import Machine
from collector import load, request_lines
from collector.results import Run
from controller import hub, plan
from controller.settings import MAX_PROMPT_CHARS, SETTINGS
from tests import playbook
from tests.child import DEADLINE_S, within_deadline

ROOT = Path(__file__).resolve().parents[2]
HOST = "h"
CONFIG = "tp1-autoregressive"
ROW = {"host": HOST, "config_id": CONFIG, "method": "autoregressive", "method_params": {}, "tp": 1, "workload": "fib",
       "max_tokens": 8, "context_tokens": 0, "concurrency": 1, "rep": 0, "ok": True, "output_tok_s": 10.0}


# ---------------------------------------------------------------------------------------------------------------
# The bad kinds: each makes `at` that kind of file (for an input whose limit is `bound`), and says what it is
# ---------------------------------------------------------------------------------------------------------------

def _oversized(at: Path, bound: Bound) -> None:
    with open(at, "wb") as f:
        f.truncate(bound.limit + 1)  # sparse: no disk is used, even past the 16 GiB of requests.jsonl


KINDS: dict[str, tuple[Callable[[Path, Bound], None], Callable[[Bound], str]]] = {
    "dev-zero": (lambda at, b: at.symlink_to("/dev/zero"), lambda b: "a character device, not a regular file"),
    "dev-urandom": (lambda at, b: at.symlink_to("/dev/urandom"), lambda b: "a character device, not a regular file"),
    "fifo": (lambda at, b: os.mkfifo(at), lambda b: "a FIFO, not a regular file"),
    "folder": (lambda at, b: at.mkdir(), lambda b: "a directory, not a regular file"),
    "over-limit": (_oversized, lambda b: f"{b.limit + 1} bytes, larger than {bounded.size_text(b.limit)}"),
}


# ---------------------------------------------------------------------------------------------------------------
# The inputs: where each lies, a fine one's bytes, and how specfleet reads it (the lines it says, what it read)
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Input:
    name: str
    bound: Bound
    place: str  # the file, relative to the case's folder
    good: bytes
    read: Callable[[Path], tuple[list[str], Any]]  # the case's folder → (lines said, what was read of the file)
    read_fine: Any  # what a fine one reads as
    what_is_said: bool = True  # whether the line says what the file is (the probe run alone says less)
    allowed: tuple[str, ...] = ()  # bad kinds that are fine here (Ansible reads a folder of inventories or vars)


def _plan(folder: Path, **more: Any) -> dict[str, Any]:
    """The plan (controller.plan.build, as the bench_plan action calls it) of a matrix naming the case's
    workloads file, with `more` arguments."""
    suite = {"engine": "vllm", "engine_python": "/py", "model": {"name": "m", "path": "/m"},
             "workloads_file": str(folder / "workloads.jsonl"),
             "phases": [{"name": "tp1", "configs": [{"method": "autoregressive"}],
                         "sweeps": [{"workloads": ["haiku"], "max_tokens": [64]}]}]}
    args = {"suite": suite, "run_id": "20250101T000000Z", "host_dir": "/var/lib/specfleet",
            "limits": {"bench_async_s": 3600, "bench_follow_timeout_s": 7200, "bench_follow_interval_s": 2}, **more}
    return plan.build(args, {"inventory_hostname": HOST, "bench_workloads_file": suite["workloads_file"]},
                      lambda python, request: {"unreachable": True, "msg": "no host in this test"})


def _workloads(folder: Path) -> tuple[list[str], Any]:
    res = _plan(folder)
    if res.get("failed"):
        return res["msg"].splitlines(), None
    return [], res["configs"][0]["prompts"].get("haiku")


def _run_folder(folder: Path) -> Path:
    """A whole run, as the agent and `collector stamp` write it, around whichever of its files the case planted."""
    root = folder / "run"
    files = {root / "run.json": {"run_id": "run"}, root / HOST / "host.json": {"host": HOST},
             root / HOST / CONFIG / "status.json": {"status": "ok"},
             root / HOST / CONFIG / "config.json": {"config_id": CONFIG, "method": "autoregressive"}}
    for path, obj in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not os.path.lexists(path):
            path.write_text(json.dumps(obj))
    jsonl = root / HOST / CONFIG / "requests.jsonl"
    if not os.path.lexists(jsonl):
        jsonl.write_text(json.dumps(ROW) + "\n")
    return root


def _collector(pick: Callable[[Run], Any], plain: bool = False) -> Callable[[Path], tuple[list[str], Any]]:
    """`specfleet report` reading the run (collector.load.load_run); `plain`: without msgspec, line by line."""
    def read(folder: Path) -> tuple[list[str], Any]:
        if plain:
            request_lines.msgspec = None  # this case's own process only
        run = load.load_run(_run_folder(folder))
        return run.problems, pick(run)
    return read


def _read_requests(folder: Path) -> tuple[list[str], Any]:
    """agent.records.read_requests: the plan's estimates from earlier runs, ConfigResult.requests."""
    problems: list[str] = []
    rows = records.read_requests(_run_folder(folder) / HOST / CONFIG / "requests.jsonl", problems)
    return problems, len(rows)


def _config(run: Run) -> Any:
    return run.configs[0].config if run.configs else None


HELP = {"flags": ["--port"], "choices": {}, "defaults": {}}
KEY = "0123456789abcdef0123"


def _kept_help(folder: Path) -> tuple[list[str], Any]:
    """agent.probe.cached as the agent reads the kept help (agent.bounded importable)."""
    problems: list[str] = []
    got = probe.cached(str(folder / "cache"), KEY, problems)
    return problems, got and got["flags"]


ENGINE = "import argparse\np = argparse.ArgumentParser()\np.add_argument('--port')\np.parse_args()\n"


def _probe_alone(folder: Path) -> tuple[list[str], Any]:
    """agent/probe.py's text run alone, as the plan sends it to a host (`python -c`, no agent package to import),
    asked about an engine whose help it kept."""
    request = {"engine": {"python": sys.executable, "module": "fake_engine.serve", "dists": [],
                          "env": {"PYTHONPATH": str(folder / "engine"), "PATH": "/usr/bin:/bin"}},
               "models": {}, "cache": str(folder / "cache")}
    res = subprocess.run([sys.executable, "-S", "-c", Path(probe.__file__).read_text(), json.dumps(request)],
                         capture_output=True, text=True, timeout=DEADLINE_S, cwd=folder)
    assert res.returncode == 0, res.stderr
    engine = json.loads(res.stdout)["engine"]
    return [engine["cache_problem"]] if "cache_problem" in engine else [], engine.get("cached") and engine["flags"]


def _fake_engine(folder: Path) -> str:
    """An engine package for the probe to ask; the place its help is kept in (named by the engine's build)."""
    (folder / "engine" / "fake_engine").mkdir(parents=True)
    (folder / "engine" / "fake_engine" / "__init__.py").write_text("")
    (folder / "engine" / "fake_engine" / "serve.py").write_text(ENGINE)
    key = probe.identity(sys.executable, "fake_engine.serve", [], {"PYTHONPATH": str(folder / "engine")})["key"]
    return str(probe.cache_path("cache", key))


def _model_agent(folder: Path) -> tuple[list[str], Any]:
    """agent.probe.model as the agent reads a model folder (host.json's models; agent.bounded importable)."""
    got = probe.model(str(folder / "model"))
    return [got["config_problem"]] if "config_problem" in got else [], got["config"]


def _model_alone(folder: Path) -> tuple[list[str], Any]:
    """agent/probe.py's text run alone, as the plan sends it to a host, asked about a model folder (its engine is
    not there: only the model is read)."""
    request = {"engine": {"python": str(folder / "no-python"), "module": "none"},
               "models": {"model": str(folder / "model")}}
    res = subprocess.run([sys.executable, "-S", "-c", Path(probe.__file__).read_text(), json.dumps(request)],
                         capture_output=True, text=True, timeout=DEADLINE_S, cwd=folder)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)["models"]["model"]
    return [got["config_problem"]] if "config_problem" in got else [], got["config"]


REPO, COMMIT = "org/m", "0123456789abcdef0123456789abcdef01234567"
SNAPSHOT = f"hf/models--org--m/snapshots/{COMMIT}"
MODEL_CONFIG = {"max_position_embeddings": 2048}


def _hub(revision: str) -> Callable[[Path], tuple[list[str], Any]]:
    """controller.hub.model as the plan reads a model off-site (HF_HUB_OFFLINE: the Hugging Face cache on this
    machine, else specfleet's kept answer), around whichever of the cache's files the case planted."""
    def read(folder: Path) -> tuple[list[str], Any]:
        os.environ.update(HF_HUB_CACHE=str(folder / "hf"), HF_HUB_OFFLINE="1")  # this case's own process only
        if revision == "main":
            files = {f"hf/models--org--m/refs/{revision}": COMMIT, f"{SNAPSHOT}/config.json": json.dumps(MODEL_CONFIG),
                     f"{SNAPSHOT}/{hub.INDEX}": json.dumps({"metadata": {"total_size": 1234}})}
            for place, text in files.items():
                (folder / place).parent.mkdir(parents=True, exist_ok=True)
                if not os.path.lexists(folder / place):
                    (folder / place).write_text(text)
        got = hub.model(REPO, revision, folder / "cache")
        return [got["error"]] if "error" in got else [], (got.get("config"), got.get("weights_bytes"))
    return read


def _hub_token(folder: Path) -> tuple[list[str], Any]:
    """controller.hub's token as it goes to the Hub: HF_TOKEN_PATH (no HF_TOKEN set)."""
    os.environ.pop("HF_TOKEN", None)
    os.environ.pop("HUGGING_FACE_HUB_TOKEN", None)
    os.environ["HF_TOKEN_PATH"] = str(folder / "token")
    try:
        return [], hub._token()
    except bounded.BoundError as exc:
        return [str(exc)], None


def _progress(pick: Callable[[dict[str, Any]], Any]) -> Callable[[Path], tuple[list[str], Any]]:
    """agent.progress.read, one poll of the controller's follow (`python -m agent progress`) from offset 0: a bad
    events.jsonl fails the poll, a bad state or attach file is said in `problems`."""
    def read(folder: Path) -> tuple[list[str], Any]:
        (folder / "host").mkdir(exist_ok=True)
        try:
            out = progress.read(folder / "host" / "events.jsonl", 0, folder / "host" / "agent.json")
        except bounded.BoundError as exc:
            return [str(exc)], None
        return out.get("problems", []), pick(out)
    return read


@functools.cache
def _guard_module() -> ModuleType:
    """plugins/inventory/specfleet_guard.py, as Ansible loads it."""
    spec = importlib.util.spec_from_file_location("specfleet_guard", ROOT / "plugins/inventory/specfleet_guard.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _guard(args: Callable[[Path], dict[str, Any]]) -> Callable[[Path], tuple[list[str], Any]]:
    """The inventory plugin specfleet_guard judging what an Ansible command with these arguments would read before
    its play (at its first call, before any inventory source is read; then each source as it comes): (its line,
    whether all passed)."""
    module = _guard_module()  # loaded here, once: each case's process has it already
    def read(folder: Path) -> tuple[list[str], Any]:
        for place, text in {"inv/hosts.yml": "all:\n  hosts:\n    h:\n", "play/site.yml": "- hosts: all\n"}.items():
            (folder / place).parent.mkdir(parents=True, exist_ok=True)
            if not os.path.lexists(folder / place):
                (folder / place).write_text(text)
        given = args(folder)
        line = module.refused([*module.named(given), *(("inventory source", s) for s in given.get("inventory", ()))])
        return [line] if line else [], line is None
    return read


_INVENTORY = {"extra_vars": (), "listtasks": False}


_JSON = json.dumps
INPUTS = [
    Input("bench_workloads_file", bounded.WORKLOADS_FILE, "workloads.jsonl",
          (_JSON({"name": "haiku", "prompt": "Write a haiku."}) + "\n").encode(), _workloads, "Write a haiku."),
    Input("run.json", bounded.RECORD, "run/run.json", _JSON({"run_id": "r1"}).encode(),
          _collector(lambda run: run.meta), {"run_id": "r1"}),
    Input("host.json", bounded.RECORD, f"run/{HOST}/host.json", _JSON({"host": HOST, "os": "x"}).encode(),
          _collector(lambda run: run.hosts.get(HOST)), {"host": HOST, "os": "x"}),
    Input("status.json", bounded.RECORD, f"run/{HOST}/{CONFIG}/status.json", _JSON({"status": "failed"}).encode(),
          _collector(lambda run: [c.status for c in run.configs]), [{"status": "failed"}]),
    Input("config.json", bounded.RECORD, f"run/{HOST}/{CONFIG}/config.json", _JSON({"tp": 2}).encode(),
          _collector(_config), {"tp": 2}),
    Input("requests.jsonl (report, msgspec)", bounded.REQUESTS, f"run/{HOST}/{CONFIG}/requests.jsonl",
          (_JSON(ROW) + "\n" + _JSON({**ROW, "rep": 1}) + "\n").encode(),
          _collector(lambda run: run.configs[0].count), 2),
    Input("requests.jsonl (report, line by line)", bounded.REQUESTS, f"run/{HOST}/{CONFIG}/requests.jsonl",
          (_JSON(ROW) + "\n" + _JSON({**ROW, "rep": 1}) + "\n").encode(),
          _collector(lambda run: run.configs[0].count, plain=True), 2),
    Input("requests.jsonl (plan's estimates)", bounded.REQUESTS, f"run/{HOST}/{CONFIG}/requests.jsonl",
          (_JSON(ROW) + "\n").encode(), _read_requests, 1),
    Input("kept engine help (agent)", bounded.HELP_CACHE, f"cache/engine-help-{KEY}.json", _JSON(HELP).encode(),
          _kept_help, ["--port"]),
    Input("kept engine help (probe text alone)", bounded.HELP_CACHE, "", _JSON(HELP).encode(), _probe_alone,
          ["--port"], what_is_said=False),
    Input("model config.json (agent)", bounded.RECORD, "model/config.json", _JSON(MODEL_CONFIG).encode(),
          _model_agent, MODEL_CONFIG),
    Input("model config.json (probe text alone)", bounded.RECORD, "model/config.json", _JSON(MODEL_CONFIG).encode(),
          _model_alone, MODEL_CONFIG, what_is_said=False),
    Input("Hugging Face cache refs (plan off-site)", bounded.RECORD, "hf/models--org--m/refs/main", COMMIT.encode(),
          _hub("main"), (MODEL_CONFIG, 1234)),
    Input("Hugging Face cache config.json (plan off-site)", bounded.RECORD, f"{SNAPSHOT}/config.json",
          _JSON(MODEL_CONFIG).encode(), _hub("main"), (MODEL_CONFIG, 1234)),
    Input("Hugging Face cache index (plan off-site)", bounded.RECORD, f"{SNAPSHOT}/{hub.INDEX}",
          _JSON({"metadata": {"total_size": 1234}}).encode(), _hub("main"), (MODEL_CONFIG, 1234)),
    Input("kept Hub answer (plan off-site)", bounded.RECORD, f"cache/hub/org--m@{COMMIT}.json",
          _JSON({"config": MODEL_CONFIG, "weights_bytes": 1234, "commit": COMMIT, "read_at": 0}).encode(),
          _hub(COMMIT), (MODEL_CONFIG, 1234)),
    Input("Hugging Face token file (plan off-site)", bounded.RECORD, "token", b"hf_token\n", _hub_token, "hf_token"),
    Input("events.jsonl (follow's poll)", bounded.EVENTS, "host/events.jsonl", b'{"event": "suite_start"}\n',
          _progress(lambda out: out["lines"]), '{"event": "suite_start"}\n'),
    Input("agent state (follow's poll)", bounded.RECORD, "host/agent.json", _JSON({"state": "running"}).encode(),
          _progress(lambda out: out["state"]), {"state": "running"}),
    Input("refused starts (follow's poll)", bounded.RECORD, f"host/{progress.ATTACH}",
          (_JSON({"invocation": "i2", "follow": "i1"}) + "\n").encode(), _progress(lambda out: out["attached"]),
          {"i2": "i1"}),
    Input("machine holder (agent)", bounded.RECORD, "machine/lock.json", _JSON({"host": "h1"}).encode(),
          lambda f: Machine(str(f / "machine/lock")).holder(), {"host": "h1"}),
    Input("-e @file (guard)", bounded.ANSIBLE_FILE, "vars.yml", b"bench_repetitions: 2\n",
          _guard(lambda f: {**_INVENTORY, "extra_vars": ("x=1", f"@{f / 'vars.yml'}")}), True),
    Input("inventory source (guard)", bounded.ANSIBLE_FILE, "inv/hosts.yml", b"all:\n  hosts:\n    h:\n",
          _guard(lambda f: {**_INVENTORY, "inventory": ("h1,h2", str(f / "inv/hosts.yml"))}), True,
          allowed=("folder",)),
    Input("host_vars file beside the inventory (guard)", bounded.ANSIBLE_FILE, "inv/host_vars/h.yml", b"x: 1\n",
          _guard(lambda f: {**_INVENTORY, "inventory": (str(f / "inv/hosts.yml"),)}), True, allowed=("folder",)),
    Input("group_vars file beside the playbook (guard)", bounded.ANSIBLE_FILE, "play/group_vars/all.yml", b"x: 1\n",
          _guard(lambda f: {**_INVENTORY, "args": (str(f / "play/site.yml"),)}), True, allowed=("folder",)),
]




def _plant(folder: Path, inp: Input, kind: str | None) -> Path:
    place = inp.place or _fake_engine(folder)
    at = folder / place
    at.parent.mkdir(parents=True, exist_ok=True)
    if kind is None:
        at.write_bytes(inp.good)
    else:
        KINDS[kind][0](at, inp.bound)
    return at


CASES = [(inp, kind) for inp in INPUTS for kind in KINDS if kind not in inp.allowed]


@pytest.mark.parametrize(("inp", "kind"), CASES, ids=[f"{inp.name}-{kind}" for inp, kind in CASES])
def test_a_bad_file_is_refused_in_one_line_naming_it_and_the_limit(tmp_path: Path, inp: Input, kind: str) -> None:
    at = _plant(tmp_path, inp, kind)
    (lines, read), seconds = within_deadline(lambda: inp.read(tmp_path))
    named = [line for line in lines if f"{at}:" in line]
    assert len(named) == 1, lines  # exactly one line names the file
    assert f"at most {bounded.size_text(inp.bound.limit)}" in named[0], named[0]
    said = KINDS[kind][1](inp.bound) if inp.what_is_said else (  # the probe's own words, without agent.bounded
        f"larger than {bounded.size_text(inp.bound.limit)};" if kind == "over-limit" else ": not a regular file;")
    assert said in named[0], named[0]
    assert read != inp.read_fine
    assert seconds < DEADLINE_S


@pytest.mark.parametrize("inp", INPUTS, ids=[i.name for i in INPUTS])
def test_a_fine_file_is_read(tmp_path: Path, inp: Input) -> None:
    """The control: the same input, a regular file within its limit, is read, and nothing is said of it."""
    at = _plant(tmp_path, inp, None)
    (lines, read), _ = within_deadline(lambda: inp.read(tmp_path))
    assert not [line for line in lines if f"{at}:" in line], lines
    assert read == inp.read_fine


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "folder"])
def test_the_host_fingerprint_digests_a_bad_model_config_without_reading_it(tmp_path: Path, kind: str) -> None:
    """host.json's model digest (agent.fingerprint): a config.json that is no regular file within its limit goes
    into the digest as its one-line refusal, never read; the digest still moves when the file does."""
    from agent import fingerprint

    at = tmp_path / "model" / "config.json"
    at.parent.mkdir()
    KINDS[kind][0](at, bounded.RECORD)
    bad, _ = within_deadline(lambda: fingerprint.model_digest(str(tmp_path / "model")))
    at.unlink()
    at.write_text("{}")
    assert bad and bad != fingerprint.model_digest(str(tmp_path / "model"))


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "folder"])
def test_the_agents_progress_command_says_a_bad_events_file_in_one_line(tmp_path: Path, kind: str) -> None:
    """`python -m agent progress`, the follow's poll on the host: exit 2 and one line naming the file and the limit
    (the follow shows it as the reason it cannot read progress)."""
    events = tmp_path / "events.jsonl"
    KINDS[kind][0](events, bounded.EVENTS)
    res = subprocess.run([sys.executable, "-m", "agent", "progress", "--events", str(events), "--offset", "0",
                          "--state", str(tmp_path / "agent.json"), "--wait", "0"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert (res.returncode, res.stdout) == (2, ""), res
    assert res.stderr.strip().splitlines() == [
        f"cannot read the agent's events: {events}: {KINDS[kind][1](bounded.EVENTS)}; allowed: a regular file of "
        f"at most {bounded.size_text(bounded.EVENTS.limit)}"], res.stderr


def test_an_earlier_run_the_plan_cannot_read_fails_it_in_one_line(tmp_path: Path) -> None:
    """The plan reads earlier runs of the host in the results folder (its estimates, the engine's recorded flags):
    a file there it cannot read fails the plan in one line naming it, not with a traceback."""
    _plant(tmp_path, INPUTS[0], None)
    root = _run_folder(tmp_path)
    status = root / HOST / CONFIG / "status.json"
    status.unlink()
    status.mkdir()
    res, _ = within_deadline(lambda: _plan(tmp_path, results=str(root.parent)))
    assert res["failed"] and len(res["msg"].splitlines()) == 1, res
    assert res["msg"].startswith(f"{HOST}: earlier results in bench_controller_results unreadable: ")
    assert f"{status}" in res["msg"]


# ---------------------------------------------------------------------------------------------------------------
# The helper itself
# ---------------------------------------------------------------------------------------------------------------

SMALL = Bound("a test file", 64)
READERS: dict[str, Callable[[Path], Any]] = {
    "read_bytes": lambda p: bounded.read_bytes(p, SMALL),
    "read_text": lambda p: bounded.read_text(p, SMALL),
    "chunks": lambda p: b"".join(bounded.chunks(p, SMALL, 8)),
}


@pytest.mark.parametrize("reader", list(READERS))
def test_a_file_that_holds_more_than_its_size_said_is_refused_at_the_limit(reader: str) -> None:
    """A regular file that grows while it is read: /proc's files say size 0 and hold more. Reading stops one
    byte past the limit."""
    path = Path("/proc/self/maps")
    with pytest.raises(bounded.BoundError) as exc:
        READERS[reader](path)
    assert str(exc.value) == f"{path}: grew past 64 bytes while read; allowed: a regular file of at most 64 bytes"


@pytest.mark.parametrize("reader", list(READERS))
def test_the_limit_itself_is_allowed(tmp_path: Path, reader: str) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * SMALL.limit)
    assert READERS[reader](path) in (b"x" * 64, "x" * 64)
    path.write_bytes(b"x" * (SMALL.limit + 1))
    with pytest.raises(bounded.BoundError, match="65 bytes, larger than 64 bytes"):
        READERS[reader](path)


def test_a_name_with_a_newline_stays_one_line(tmp_path: Path) -> None:
    path = tmp_path / "a\nb"
    os.mkfifo(path)
    with pytest.raises(bounded.BoundError) as exc:
        bounded.read_bytes(path, SMALL)
    assert "\n" not in str(exc.value) and repr(str(path)) in str(exc.value)


def test_a_file_being_written_is_read_a_piece_of_whole_lines_at_a_time(tmp_path: Path) -> None:
    """lines_from (the follow's events.jsonl): at most `most` bytes from the offset, whole lines only, the rest on
    the next call; a line longer than a piece would keep the reader where it is for good, and is refused."""
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"aaa\nbbb\ncc")
    assert bounded.lines_from(path, SMALL, 0, 9) == b"aaa\nbbb\n"
    assert bounded.lines_from(path, SMALL, 8, 9) == b""  # a line still being written waits
    path.write_bytes(b"aaa\nbbb\nccccccccccc\n")
    with pytest.raises(bounded.BoundError) as exc:
        bounded.lines_from(path, SMALL, 8, 9)
    assert str(exc.value) == (f"{path}: no line end in the 9 bytes from byte 8; allowed: a regular file of at most "
                              "64 bytes")


def test_the_limits_hold_what_the_project_itself_allows() -> None:
    """A workloads file of the longest prompt the matrix allows, escaped, fits; so does a run of the million rows
    benchmarks/report_scale.py reads, were they all one config's (about 1 KiB a row); the probe run alone keeps
    the same limits on a kept help and a model's config.json."""
    assert len(json.dumps({"name": "long", "prompt": "\u00e9" * MAX_PROMPT_CHARS})) < bounded.WORKLOADS_FILE.limit
    assert 1_000_000 * 1024 < bounded.REQUESTS.limit
    assert probe.HELP_CACHE_BYTES == bounded.HELP_CACHE.limit
    assert probe.CONFIG_BYTES == bounded.RECORD.limit
    assert len({b.what for b in bounded.BOUNDS}) == len(bounded.BOUNDS)
    assert {i.bound for i in INPUTS} == set(bounded.BOUNDS)  # every limit is tried by the table above


# ---------------------------------------------------------------------------------------------------------------
# Which settings name a place whose files specfleet reads: a new one joins by being declared
# ---------------------------------------------------------------------------------------------------------------

NAMES_A_PLACE = re.compile(r"\b(files?|folders?|paths?|store|director(y|ies))\b", re.I)
# Each setting whose description names a file, folder or path: the inputs above it leads specfleet to read ...
READ_THROUGH = {
    "workloads_file": ["bench_workloads_file"],
    "controller_results": ["run.json", "host.json", "status.json", "config.json", "requests.jsonl (report, msgspec)",
                           "requests.jsonl (report, line by line)", "requests.jsonl (plan's estimates)"],
    "host_dir": ["kept engine help (agent)", "kept engine help (probe text alone)", "events.jsonl (follow's poll)",
                 "agent state (follow's poll)", "refused starts (follow's poll)"],
    "machine_lock": ["machine holder (agent)"],
    "model": ["model config.json (agent)", "model config.json (probe text alone)"],
    "draft_model": ["model config.json (agent)", "model config.json (probe text alone)"],
}
# ... or why nothing of specfleet reads a file there through agent.bounded
NOT_READ_THROUGH = {
    "history_db": "the DuckDB store, opened by DuckDB (collector/store.py)",
    "probe": "a switch",
    "report_plots": "a switch; the plots are written, not read",
    "service_read_only_paths": "bound into the systemd unit; systemd opens them, not specfleet",
    "service_read_write_paths": "as service_read_only_paths",
    "service_device_allow": "written into the unit's DeviceAllow=; never opened",
}


# The places named outside the settings, by the environment or Ansible's command line: the inputs read there
NAMED_ELSEWHERE = {
    "HF_HOME, HF_HUB_CACHE: the Hugging Face cache": ["Hugging Face cache refs (plan off-site)",
                                                      "Hugging Face cache config.json (plan off-site)",
                                                      "Hugging Face cache index (plan off-site)"],
    "HF_TOKEN_PATH": ["Hugging Face token file (plan off-site)"],
    "XDG_CACHE_HOME: specfleet's cache": ["kept Hub answer (plan off-site)"],
    "-e @file, -i and the host_vars/ and group_vars/ beside them and the playbook": [
        "-e @file (guard)", "inventory source (guard)", "host_vars file beside the inventory (guard)",
        "group_vars file beside the playbook (guard)"],
}


def test_every_setting_naming_a_place_is_accounted_for() -> None:
    declared = {s.key for s in SETTINGS if NAMES_A_PLACE.search(s.description)}
    assert declared == set(READ_THROUGH) | set(NOT_READ_THROUGH), (
        "a setting names a file or folder: add the inputs specfleet reads there (bounded) to INPUTS and READ_THROUGH")
    names = {i.name for i in INPUTS}
    assert {n for ns in [*READ_THROUGH.values(), *NAMED_ELSEWHERE.values()] for n in ns} == names


# ---------------------------------------------------------------------------------------------------------------
# The guard in the programs that run it: Ansible's commands (it ends them), a program that builds an inventory in
# its own process (it does nothing), ansible-runner (its command line passes)
# ---------------------------------------------------------------------------------------------------------------

WITHOUT_GUARD = {"ANSIBLE_INVENTORY_ENABLED": "host_list,script,auto,yaml,ini,toml"}  # Ansible's default list


def _ansible(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(playbook.BIN / args[0]), *args[1:]], cwd=ROOT, env=playbook.ansible_env(env),
                          capture_output=True, text=True, timeout=60)


def test_the_guard_leaves_the_inventory_as_ansible_reads_it() -> None:
    """`ansible-inventory --list` of the project's inventory, host_vars and group_vars: the same with the guard as
    with Ansible's default plugins alone."""
    guarded, plain = _ansible("ansible-inventory", "--list"), _ansible("ansible-inventory", "--list", env=WITHOUT_GUARD)
    assert guarded.returncode == 0 and plain.returncode == 0, guarded.stderr[-2000:] + plain.stderr[-2000:]
    assert json.loads(guarded.stdout) == json.loads(plain.stdout)
    assert "local" in json.loads(guarded.stdout)["_meta"]["hostvars"]


def test_a_device_as_the_inventory_ends_the_command_in_one_line() -> None:
    """`-i /dev/zero`: Ansible's ini plugin would read it until memory ends; the command ends in a second instead."""
    t0 = time.monotonic()
    res = _ansible("ansible-inventory", "-i", "/dev/zero", "--list")
    line = ("[ERROR]: inventory source: /dev/zero: a character device, not a regular file; allowed: a regular file of "
            f"at most {bounded.size_text(bounded.ANSIBLE_FILE.limit)}")
    assert res.returncode == 1 and line in res.stderr.splitlines(), res.stderr[-2000:]
    assert time.monotonic() - t0 < 30  # a command that starts in a second or two


IN_PROCESS = """
import json, sys
from ansible import constants as C, context
from ansible.inventory.manager import InventoryManager
from ansible.module_utils.common.collections import ImmutableDict
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import init_plugin_loader, inventory_loader
init_plugin_loader()
inventory = InventoryManager(loader=DataLoader(), sources=[sys.argv[1]])
context.CLIARGS = ImmutableDict(extra_vars=("@/dev/zero",), inventory=["/dev/zero"])  # as a library user sets them
wants = inventory_loader.get("specfleet_guard").verify_file("/dev/zero")
print(json.dumps({"enabled": C.INVENTORY_ENABLED, "hosts": sorted(inventory.hosts), "wants": wants}))
"""


def test_a_program_building_an_inventory_in_its_own_process_is_left_alone() -> None:
    """The guard ends Ansible's commands only: a program of its own (a test harness, a tool on Ansible's API) gets
    its inventory with the guard enabled, and the guard neither ends it nor takes a source, whatever its arguments
    name (reading them is Ansible's then, as without the guard)."""
    res = subprocess.run([sys.executable, "-c", IN_PROCESS, "inventory/hosts.yml"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env=playbook.ansible_env())
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.splitlines()[-1])
    assert out["enabled"][0] == "specfleet_guard"
    assert {"local", "ct200", "th1"} <= set(out["hosts"]) and out["wants"] is False


@pytest.mark.playbook
def test_ansible_runner_passes_the_guard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ansible-runner (`specfleet pull`) hands its extra vars to ansible-playbook as `-e @<its folder>/env/extravars`:
    a regular file, judged and read as before."""
    import ansible_runner

    (tmp_path / "private").mkdir()
    play = tmp_path / "play.yml"
    play.write_text("- hosts: local\n  gather_facts: false\n  tasks:\n    - ansible.builtin.debug: {msg: '{{ x }}'}\n")
    monkeypatch.setenv("PATH", f"{playbook.BIN}:{os.environ.get('PATH', '')}")  # its ansible-playbook: this venv's
    run = ansible_runner.run(private_data_dir=str(tmp_path / "private"), project_dir=str(ROOT), playbook=str(play),
                             inventory=[str(ROOT / "inventory/hosts.yml")], limit="local", extravars={"x": "through"},
                             envvars={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}, quiet=True)
    assert (run.status, run.rc) == ("successful", 0), run.stdout.read()[-2000:]
    assert "-e" in run.config.command and any(a.startswith("@") for a in run.config.command)
    assert [e["event_data"]["res"]["msg"] for e in run.events if e["event"] == "runner_on_ok"] == ["through"]

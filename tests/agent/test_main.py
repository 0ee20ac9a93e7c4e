"""`python -m agent run|pack|progress|schemas` (agent/__main__.py), run as the bench role runs it: a real
subprocess of this Python in the project root. The plan file and its secrets, the per-run lock, the state file
agent.json, the results archive and the published JSON Schemas.

A plan whose engine Python does not exist makes `run` finish in seconds: every baseline fails
`engine_unavailable` and the other configs of its phase are skipped (see test_suite.py)."""
from __future__ import annotations

import fcntl
import json
import os
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from agent import records, secrets
from agent.__main__ import load_plan
from controller import matrix

ROOT = Path(__file__).resolve().parents[2]
RUN_ID = "run-20250102T030405"
HOST = "gpu-main-1"
HF_TOKEN = "hf_MAINSECRET0a1b2c3d4e5f6a7b8c"
API_KEY = "sk-MAINSECRET-9f8e7d6c5b4a3210"
SECRET_VALUES = (HF_TOKEN, API_KEY)
IDS = ["tp1-autoregressive", "tp1-ngram-k3"]


def agent(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def make_plan(python: str, run_id: str = RUN_ID) -> Dict[str, Any]:
    """The plan as the bench role writes it: the suite and configs with placeholders, and `secrets`, the
    {placeholder: value} map (controller/plan.py, plugins/filter/bench.py)."""
    raw = {"engine": "vllm", "engine_python": python, "model": {"name": "tiny", "path": "/models/tiny"},
           "env": {"HF_TOKEN": HF_TOKEN}, "api_key": API_KEY, "repetitions": 1, "warmup_max_tokens": 2,
           "timeouts": {"health_s": 5, "request_s": 5, "stop_s": 5, "release_s": 1},
           "phases": [{"name": "tp1",
                       "configs": [{"method": "autoregressive"}, {"method": "ngram", "num_speculative_tokens": 3}],
                       "sweeps": [{"workloads": ["fib"], "max_tokens": [4], "concurrency": [1]}]}]}
    checked = matrix.validate(raw)
    hidden_suite, values = secrets.split(checked.suite)
    hidden = checked.hide(hidden_suite)
    configs = matrix.expand(hidden)
    assert [c["config_id"] for c in configs] == IDS
    return {"run_id": run_id, "host": HOST, "suite": hidden.suite, "configs": configs, "secrets": values}


def write_plan(path: Path, plan: Dict[str, Any], mode: int = 0o600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan, indent=4) + "\n")  # Ansible's to_nice_json
    path.chmod(mode)
    return path


def assert_stripped(path: Path, plan: Dict[str, Any]) -> None:
    """The plan file holds the plan less its secrets: placeholders, no value."""
    data = path.read_bytes()
    for value in SECRET_VALUES:
        assert value.encode() not in data, f"{value} still in {path}"
    on_disk = json.loads(data)
    assert "secrets" not in on_disk
    assert on_disk == {k: v for k, v in plan.items() if k != "secrets"}
    assert b"<secret:0>" in data and b"<secret:1>" in data


def no_temporaries(folder: Path) -> List[str]:
    return [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]


@pytest.fixture()
def missing_engine(tmp_path: Path) -> str:
    return str(tmp_path / "no-engine" / "bin" / "python")


# -- load_plan ----------------------------------------------------------------------------------------
def test_load_plan_takes_the_secrets_off_the_disk_and_resolves_them_in_memory(tmp_path: Path,
                                                                             missing_engine: str) -> None:
    plan = make_plan(missing_engine)
    assert sorted(plan["secrets"].values()) == sorted(SECRET_VALUES)
    assert HF_TOKEN not in json.dumps(plan["suite"]) and HF_TOKEN not in json.dumps(plan["configs"])
    path = write_plan(tmp_path / "plans" / f"{RUN_ID}.json", plan)
    got = load_plan(path)
    assert_stripped(path, plan)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert no_temporaries(path.parent) == []
    # in memory every placeholder is its value again
    text = json.dumps(got)
    assert "<secret:" not in text and "secrets" not in got
    assert got["suite"]["env"]["HF_TOKEN"] == HF_TOKEN and got["suite"]["api_key"] == API_KEY
    for cfg in got["configs"]:
        assert HF_TOKEN in cfg["env"].values()
        assert API_KEY in json.dumps(cfg)
    assert got == secrets.resolve(json.loads(path.read_text()), plan["secrets"])


def test_load_plan_of_a_world_readable_file_leaves_it_private(tmp_path: Path, missing_engine: str) -> None:
    plan = make_plan(missing_engine)
    path = write_plan(tmp_path / "plan.json", plan, mode=0o644)
    load_plan(path)
    assert_stripped(path, plan)
    assert stat.S_IMODE(path.stat().st_mode) in (0o644, 0o600)  # its mode, or private: never wider
    assert no_temporaries(path.parent) == []


def test_load_plan_of_a_plan_without_secrets_leaves_the_file_alone(tmp_path: Path, missing_engine: str) -> None:
    plan = {k: v for k, v in make_plan(missing_engine).items() if k != "secrets"}
    path = write_plan(tmp_path / "plan.json", plan, mode=0o640)
    before = (path.read_bytes(), path.stat().st_ino, path.stat().st_mtime_ns)
    got = load_plan(path)
    assert (path.read_bytes(), path.stat().st_ino, path.stat().st_mtime_ns) == before
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert got == plan  # placeholders without values stay as they are
    assert "<secret:0>" in json.dumps(got)


# -- run ----------------------------------------------------------------------------------------------
def statuses(host_dir: Path) -> Dict[str, Dict[str, Any]]:
    return {p.parent.name: json.loads(p.read_text()) for p in host_dir.glob("*/status.json")}


def lock_is_free(path: Path) -> bool:
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
        return True


def test_run_finishes_and_records_its_state(tmp_path: Path, missing_engine: str) -> None:
    plan = make_plan(missing_engine)
    path = write_plan(tmp_path / "plans" / f"{RUN_ID}.json", plan)
    results = tmp_path / "results"
    res = agent("run", "--plan", str(path), "--results", str(results), "--invocation", "inv-main-1")
    assert res.returncode == 0, res.stderr
    assert_stripped(path, plan)
    host_dir = results / RUN_ID / HOST
    state = json.loads((host_dir / "agent.json").read_text())
    assert state["state"] == "finished" and "error" not in state
    assert state["invocation"] == "inv-main-1" and state["run_id"] == RUN_ID
    assert isinstance(state["pid"], int) and state["pid"] > 0
    assert state["started_at"] <= state["finished_at"]
    got = statuses(host_dir)
    assert sorted(got) == IDS
    assert (got[IDS[0]]["status"], got[IDS[0]]["reason"]) == ("failed", "engine_unavailable")
    assert (got[IDS[1]]["status"], got[IDS[1]]["reason"]) == ("skipped", "baseline_failed")
    events = [json.loads(line) for line in (host_dir / "events.jsonl").read_text().splitlines()]
    assert events[0]["event"] == "suite_start" and events[-1]["event"] == "suite_end"
    assert {e["invocation"] for e in events} == {"inv-main-1"}
    assert lock_is_free(host_dir / "agent.lock")  # released with the process
    for p in [q for q in host_dir.rglob("*") if q.is_file()]:
        for value in SECRET_VALUES:
            assert value.encode() not in p.read_bytes(), f"{value} written to {p}"


def test_run_without_an_invocation_makes_one_up(tmp_path: Path, missing_engine: str) -> None:
    path = write_plan(tmp_path / "plan.json", make_plan(missing_engine))
    res = agent("run", "--plan", str(path), "--results", str(tmp_path / "results"))
    assert res.returncode == 0, res.stderr
    host_dir = tmp_path / "results" / RUN_ID / HOST
    state = json.loads((host_dir / "agent.json").read_text())
    assert state["state"] == "finished"
    assert isinstance(state["invocation"], str) and len(state["invocation"]) == 32
    int(state["invocation"], 16)
    events = [json.loads(line) for line in (host_dir / "events.jsonl").read_text().splitlines()]
    assert {e["invocation"] for e in events} == {state["invocation"]}


@pytest.fixture()
def held_lock(tmp_path: Path) -> Iterator[Path]:
    """The run's lock, held by this test process as a running agent would hold it."""
    host_dir = tmp_path / "results" / RUN_ID / HOST
    host_dir.mkdir(parents=True)
    with open(host_dir / "agent.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield host_dir


def test_a_second_run_of_the_same_run_id_exits_3(tmp_path: Path, missing_engine: str, held_lock: Path) -> None:
    first = {"pid": 424242, "run_id": RUN_ID, "state": "running", "started_at": "2025-01-02T03:04:05.000+00:00",
             "invocation": "inv-first"}
    (held_lock / "agent.json").write_text(json.dumps(first))
    plan = make_plan(missing_engine)
    path = write_plan(tmp_path / "plans" / f"{RUN_ID}.json", plan)
    res = agent("run", "--plan", str(path), "--results", str(tmp_path / "results"), "--invocation", "inv-second")
    assert res.returncode == 3, (res.stdout, res.stderr)
    assert "already running" in res.stderr and RUN_ID in res.stderr and "424242" in res.stderr
    assert "Traceback" not in res.stderr
    # the running agent's state and results are left alone ...
    assert json.loads((held_lock / "agent.json").read_text()) == first
    assert sorted(p.name for p in held_lock.iterdir()) == ["agent.attach.jsonl", "agent.json", "agent.lock"]
    # ... but whoever follows this start learns which one to follow instead (the holder may end before it looks)
    note = json.loads((held_lock / "agent.attach.jsonl").read_text())
    assert (note["invocation"], note["follow"], note["pid"]) == ("inv-second", "inv-first", 424242)
    # ... and the secrets left the disk all the same: the plan is read before the lock is tried
    assert_stripped(path, plan)


def test_a_second_run_without_a_state_file_still_exits_3(tmp_path: Path, missing_engine: str,
                                                        held_lock: Path) -> None:
    path = write_plan(tmp_path / "plan.json", make_plan(missing_engine))
    res = agent("run", "--plan", str(path), "--results", str(tmp_path / "results"))
    assert res.returncode == 3, (res.stdout, res.stderr)
    assert "already running" in res.stderr
    assert not (held_lock / "agent.json").exists() and not (held_lock / "events.jsonl").exists()


def test_a_run_lock_alone_does_not_block_another_run_id(tmp_path: Path, missing_engine: str,
                                                       held_lock: Path) -> None:
    """What holds a host is the suite lock (below); a run's own lock is for its own starts."""
    path = write_plan(tmp_path / "plan.json", make_plan(missing_engine, run_id="run-other"))
    res = agent("run", "--plan", str(path), "--results", str(tmp_path / "results"), "--invocation", "inv-o")
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "results" / "run-other" / HOST / "agent.json").read_text())["state"] == "finished"
    # the suite lock was held while it ran, and is free again
    held = json.loads(agent("hostlock", "--results", str(tmp_path / "results")).stdout)
    assert held == {"held": False}
    assert json.loads((tmp_path / "results" / ".suite.json").read_text())["run_id"] == "run-other"


@pytest.fixture()
def busy_host(tmp_path: Path) -> Iterator[Path]:
    """This host's suite lock, held by this test process as another run's agent would hold it."""
    results = tmp_path / "results"
    results.mkdir()
    (results / ".suite.json").write_text(json.dumps({"run_id": "run-a", "invocation": "inv-a", "pid": 4242,
                                                     "started_at": "2026-12-05T10:00:00.000+00:00"}))
    with open(results / ".suite.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield results


def test_one_suite_per_host_a_second_run_is_refused_naming_the_first(tmp_path: Path, missing_engine: str,
                                                                    busy_host: Path) -> None:
    path = write_plan(tmp_path / "plan.json", make_plan(missing_engine, run_id="run-b"))
    res = agent("run", "--plan", str(path), "--results", str(busy_host), "--invocation", "inv-b")
    assert res.returncode == 4, (res.stdout, res.stderr)
    want = ("this host is running suite run-a (invocation inv-a, pid 4242, since 2026-12-05T10:00:00.000+00:00): one "
            "suite per host. To follow it: -e run_id=run-a; to start this one once it ends: -e wait_for_host=true")
    assert res.stderr.strip() == want
    state = json.loads((busy_host / "run-b" / HOST / "agent.json").read_text())
    assert (state["state"], state["error"], state["invocation"]) == ("refused", want, "inv-b")
    assert not (busy_host / "run-b" / HOST / "events.jsonl").exists()  # nothing ran
    # the controller asks first, read only
    asked = json.loads(agent("hostlock", "--results", str(busy_host)).stdout)
    assert asked["held"] and asked["holder"]["run_id"] == "run-a" and asked["message"] == want
    assert json.loads(agent("hostlock", "--results", str(tmp_path / "nowhere")).stdout) == {"held": False}
    assert not (tmp_path / "nowhere").exists()


def test_wait_for_host_queues_behind_the_running_suite(tmp_path: Path, missing_engine: str) -> None:
    results = tmp_path / "results"
    results.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time\n"
                               f"f = open({str(results / '.suite.lock')!r}, 'a')\n"
                               "fcntl.flock(f, fcntl.LOCK_EX)\nprint('held', flush=True)\nsys.stdin.read()\n"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        path = write_plan(tmp_path / "plan.json", make_plan(missing_engine, run_id="run-b"))
        waiting = subprocess.Popen([sys.executable, "-m", "agent", "run", "--plan", str(path), "--results",
                                    str(results), "--invocation", "inv-b", "--wait-for-host"], cwd=ROOT,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        state = results / "run-b" / HOST / "agent.json"
        end = time.monotonic() + 60
        while not (state.exists() and json.loads(state.read_text()).get("waiting_for", "") is None):
            assert time.monotonic() < end and waiting.poll() is None, "the second run did not queue"
            time.sleep(0.05)
        assert not (results / "run-b" / HOST / "events.jsonl").exists()  # queued: nothing ran yet
    finally:
        holder.communicate("", timeout=30)  # the first suite ends: its lock goes
    assert waiting.wait(timeout=120) == 0, waiting.communicate()[1]
    assert json.loads(state.read_text())["state"] == "finished"


def test_a_run_that_breaks_records_failed_with_the_error(tmp_path: Path, missing_engine: str) -> None:
    plan = make_plan(missing_engine)
    plan["suite"]["engine"] = "no-such-engine"  # the agent cannot even build its suite
    path = write_plan(tmp_path / "plan.json", plan)
    res = agent("run", "--plan", str(path), "--results", str(tmp_path / "results"), "--invocation", "inv-broken")
    assert res.returncode not in (0, 3)
    assert "KeyError" in res.stderr
    host_dir = tmp_path / "results" / RUN_ID / HOST
    state = json.loads((host_dir / "agent.json").read_text())
    assert state["state"] == "failed" and state["invocation"] == "inv-broken"
    assert state["error"] == "KeyError: 'no-such-engine'"
    assert state["started_at"] <= state["finished_at"]
    assert lock_is_free(host_dir / "agent.lock")
    assert "secrets" not in json.loads(path.read_text())


# -- pack ---------------------------------------------------------------------------------------------
FILES = {"host.json": b'{"host": "gpu-main-1"}\n', "agent.json": b'{"state": "finished"}\n',
         "events.jsonl": b'{"event": "suite_start"}\n', "agent.lock": b"",
         "tp1-autoregressive/status.json": b'{"status": "failed"}\n',
         "tp1-autoregressive/server.log": b"engine log\n"}


@pytest.fixture()
def results(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    for rel, data in FILES.items():
        p = root / RUN_ID / HOST / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    (root / RUN_ID / "other-host").mkdir()
    (root / RUN_ID / "other-host" / "host.json").write_text("{}\n")
    return root


def pack(results: Path, out: Path, host: str = HOST) -> subprocess.CompletedProcess[str]:
    return agent("pack", "--results", str(results), "--run-id", RUN_ID, "--host", host, "--out", str(out))


def members(archive: Path) -> Dict[str, bytes]:
    with tarfile.open(archive, "r:gz") as tar:
        out = {}
        for m in tar.getmembers():
            f = tar.extractfile(m)
            out[m.name] = f.read() if f else b"<dir>"
        return out


def test_pack_archives_the_host_folder_under_its_name_without_the_lock(tmp_path: Path, results: Path) -> None:
    out = tmp_path / "out" / f"{HOST}.tar.gz"
    out.parent.mkdir()
    res = pack(results, out)
    assert res.returncode == 0, res.stderr
    got = members(out)
    expected = {f"{HOST}/{rel}": data for rel, data in FILES.items() if rel != "agent.lock"}
    assert {k: v for k, v in got.items() if v != b"<dir>"} == expected
    assert {k for k, v in got.items() if v == b"<dir>"} == {HOST, f"{HOST}/tp1-autoregressive"}
    assert not any("other-host" in name for name in got)
    assert os.listdir(out.parent) == [out.name]  # no .tmp left beside it


def test_pack_replaces_an_earlier_archive_by_a_rename(tmp_path: Path, results: Path) -> None:
    out = tmp_path / f"{HOST}.tar.gz"
    out.write_bytes(b"an earlier archive")
    with open(out, "rb") as earlier:  # a reader of the old archive
        inode = os.fstat(earlier.fileno()).st_ino
        res = pack(results, out)
        assert res.returncode == 0, res.stderr
        assert earlier.read() == b"an earlier archive"  # never rewritten in place
    assert out.stat().st_ino != inode
    assert f"{HOST}/host.json" in members(out)
    assert no_temporaries(tmp_path) == []


def test_pack_of_a_missing_host_fails_and_keeps_the_earlier_archive(tmp_path: Path, results: Path) -> None:
    out = tmp_path / "archive.tar.gz"
    out.write_bytes(b"an earlier archive")
    res = pack(results, out, host="no-such-host")
    assert res.returncode != 0
    assert out.read_bytes() == b"an earlier archive"


def test_pack_that_fails_leaves_no_temporary(tmp_path: Path, results: Path) -> None:
    out = tmp_path / "archive.tar.gz"
    res = pack(results, out, host="no-such-host")
    assert res.returncode != 0
    assert sorted(os.listdir(tmp_path)) == ["results"]


# -- progress -----------------------------------------------------------------------------------------
def test_progress_prints_one_json_object(tmp_path: Path) -> None:
    events, state = tmp_path / "events.jsonl", tmp_path / "agent.json"
    events.write_bytes(b'{"event": "suite_start"}\n{"event": "config_st')
    state.write_text(json.dumps({"pid": os.getpid(), "state": "running", "invocation": "inv-p"}))
    res = agent("progress", "--events", str(events), "--state", str(state), timeout=60)
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.splitlines()) == 1
    answer = json.loads(res.stdout)
    assert answer["lines"] == '{"event": "suite_start"}\n' and answer["offset"] == 25
    assert answer["state"]["invocation"] == "inv-p" and answer["alive"] is True
    assert set(answer) == {"lines", "offset", "state", "alive", "attached", "free_bytes"}


# -- schemas ------------------------------------------------------------------------------------------
def test_schemas_writes_a_schema_file_per_record(tmp_path: Path) -> None:
    out = tmp_path / "deep" / "schemas"
    res = agent("schemas", "--out", str(out), timeout=60)
    assert res.returncode == 0, res.stderr
    names = {"requests.jsonl.schema.json", "status.json.schema.json", "config.json.schema.json",
             "gpu.jsonl.schema.json"}
    assert set(os.listdir(out)) == names
    for name in names:
        schema = json.loads((out / name).read_text())
        record = name[: -len(".schema.json")]
        assert schema == records.json_schema(record)
        assert schema["type"] == "object" and schema["$schema"].startswith("https://json-schema.org/")
        assert set(schema["required"]) <= set(schema["properties"]) and schema["required"]
    # a second run writes the same files
    before = {n: (out / n).read_bytes() for n in names}
    assert agent("schemas", "--out", str(out), timeout=60).returncode == 0
    assert {n: (out / n).read_bytes() for n in names} == before


def test_an_unknown_command_is_a_usage_error() -> None:
    res = agent("nope", timeout=60)
    assert res.returncode == 2
    assert "usage:" in res.stderr and "invalid choice" in res.stderr

"""The suite on two real hosts (systemd-nspawn machines with systemd and SSH) at once: systemd units,
results pulled per host, a controller killed mid-config, and nothing left running afterwards.

The first suite runs the real engine the hosts installed, under the hardened unit. The kill, unreachable and
refusal cases are the controller's claims: their suites run the stand-in engine (tests/standin), copied into each
host, under the same unit."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from tests import playbook
from tests.conftest import short_tmp
from tests.hosts.testhosts import TestHosts
from tests.hosts.testhosts import run as run_command
from tests.readme import typed
from tests.roles.test_llamacpp_role import build_key
from tests.standin import ENGINE

from .conftest import ROOT, Bench, reduced_matrix

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="test hosts need root")
HOSTS = ("th1", "th2")


def assert_clean(th: TestHosts) -> None:
    """No unit instance, env file or engine process left, no engine port listening."""
    for host in HOSTS:
        units = th.ssh(host, "systemctl list-units --all --plain --no-legend 'specfleet-*@*'", check=False).stdout
        assert not [u for u in units.splitlines() if " active " in f" {u} " or "activating" in u], (host, units)
        assert th.ssh(host, "ls /etc/specfleet/units", check=False).stdout.strip() == "", host
        assert th.ssh(host, "pgrep -f vllm.entrypoints", check=False).stdout.strip() == "", host
        ports = th.ssh(host, "ss -Hltn", check=False).stdout
        assert [line for line in ports.splitlines() if ":22 " not in line] == [], (host, ports)


def statuses(results: Path, run: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(p.parent.parent.name, p.parent.name): json.loads(p.read_text())
            for p in (results / run).glob("*/*/status.json")}


def cells(results: Path, run: str) -> set[tuple[Any, ...]]:
    rows = json.loads((results / run / "report.json").read_text())["rows"]
    return {(r["host"], r["config_id"], r["workload"], r["max_tokens"], r["context_tokens"], r["concurrency"],
             r["n"], r["status"]) for r in rows}


def host_events(th: TestHosts, host: str, run: str) -> list[dict[str, Any]]:
    out = th.ssh(host, f"cat /var/lib/specfleet/results/{run}/{host}/events.jsonl", check=False).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


STANDIN_DIR = "/opt/specfleet/standin"


@pytest.fixture
def ssh_dir() -> Iterator[Path]:
    """A folder for SSH's control sockets (a short path: a socket's holds 107 bytes at most)."""
    with short_tmp("cp-") as folder:
        yield folder


@pytest.fixture(scope="module")
def standin(testhosts: TestHosts) -> dict[str, str]:
    """The stand-in engine in both hosts, as an engine Python the service user runs (its decode paced so that a
    suite lasts a few seconds); the extra vars that make it every server."""
    wrapper = f"#!/bin/sh\nexport STANDIN_STEP_S=0.02\nexec /usr/bin/python3 {STANDIN_DIR}/engine.py \"$@\"\n"
    for host in HOSTS:
        for name, text, mode in (("engine.py", ENGINE.read_text(), "644"), ("python", wrapper, "755")):
            run_command(testhosts.ssh_command(host, f"mkdir -p {STANDIN_DIR} && cat > {STANDIN_DIR}/{name} && "
                                            f"chmod {mode} {STANDIN_DIR}/{name}"), input_text=text)
    return {"bench_engine_python": f"{STANDIN_DIR}/python"}


@pytest.fixture(scope="module")
def two_host_run(testhosts: TestHosts) -> Iterator[tuple[Bench, str]]:
    """`ansible-playbook bench.yml -l testhosts` as typed: results in the project's results/<run_id>, removed
    at the end."""
    t0 = time.monotonic()
    res = typed("ansible-playbook bench.yml -l testhosts", timeout=1200)
    print(f"two hosts: {time.monotonic() - t0:.0f} s")
    match = re.search(r"^th1: suite (\S+): 2 configs", res.stdout, re.M)
    run_dir = ROOT / "results" / match.group(1) if match else None
    try:
        assert res.returncode == 0 and match, playbook.why(res.stdout)
        bench = Bench(ROOT)
        bench.results = ROOT / "results"
        yield bench, match.group(1), res.stdout
    finally:
        if run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)


def test_suite_on_two_hosts_with_systemd(two_host_run: tuple[Bench, str, str], testhosts: TestHosts) -> None:
    bench, run, out = two_host_run
    run_dir = bench.results / run
    for host in HOSTS:
        assert f"{host}: [1/2] tp1-autoregressive" in out and f"{host}: [2/2] tp1-ngram-k2" in out
        fp = json.loads((run_dir / host / "host.json").read_text())
        assert fp["host"] == host and fp["hostname"] == host and fp["engine"]["version"] == "0.32.0"
        for cid in ("tp1-autoregressive", "tp1-ngram-k2"):
            status = json.loads((run_dir / host / cid / "status.json").read_text())
            assert status["status"] == "ok", status
            log = (run_dir / host / cid / "server.log").read_text()
            # the journal of exactly this invocation: one start, one stop, the engine's own lines
            assert log.count(f"Started specfleet-vllm@{cid}.service") == 1
            assert "Application startup complete" in log and f"Stopped specfleet-vllm@{cid}.service" in log
            rows = (run_dir / host / cid / "requests.jsonl").read_text().splitlines()
            assert len(rows) == 24 and all(json.loads(r)["host"] == host for r in rows)
            # every process of the unit ran as the unprivileged service user (the journal's trusted _UID)
            uid = testhosts.ssh(host, "id -u specfleet").stdout.strip()
            uids = testhosts.ssh(host, f"journalctl -o json _SYSTEMD_UNIT=specfleet-vllm@{cid}.service "
                                       "--output-fields=_UID", check=False).stdout.splitlines()
            assert uids and {json.loads(line)["_UID"] for line in uids} == {uid}, (host, cid, uid, uids[:3])
    report = (run_dir / "report.md").read_text()
    assert "## Across hosts and engines" in report and "th1 (vllm) tok_s" in report and "th2 (vllm) speedup" in report
    assert set(json.loads((run_dir / "run.json").read_text())["hosts"]) == set(HOSTS)
    assert_clean(testhosts)


# Every source file under the engine's site-packages without its bytecode, less those this interpreter cannot
# compile (pip and compileall skip those alike); prints them as JSON.
UNCOMPILED = """
import importlib.util, json, pathlib, sysconfig
missing = []
for path in pathlib.Path(sysconfig.get_path("purelib")).rglob("*.py"):
    if not pathlib.Path(importlib.util.cache_from_source(str(path))).is_file():
        try:
            compile(path.read_bytes(), str(path), "exec")
        except (SyntaxError, ValueError):
            continue
        missing.append(str(path))
print(json.dumps({"missing": missing}))
"""


def test_engine_role_leaves_the_engine_compiled_for_the_service_user(testhosts: TestHosts) -> None:
    """pip installs without compiling, the role compiles on every core afterwards: no file the engine could
    import is left for the unprivileged service user (who cannot write __pycache__ there) to compile at each start."""
    for host in HOSTS:
        out = run_command(testhosts.ssh_command(host, "/opt/specfleet/engine/bin/python -"), input_text=UNCOMPILED,
                          timeout=180)
        missing = json.loads(out.stdout.strip().splitlines()[-1])["missing"]
        assert missing == [], (host, len(missing), missing[:5])
        writable = testhosts.ssh(host, "runuser -u specfleet -- test -w /opt/specfleet/engine/lib", check=False)
        assert writable.returncode != 0, host  # the service user could not have compiled them itself


def test_llamacpp_from_the_wheelhouse_in_check_mode(testhosts: TestHosts) -> None:
    """`playbooks/llamacpp.yml -l testhosts --check` as typed on the offline hosts: the role takes the pinned sdist
    from the wheelhouse (`make wheelhouse` fetched it; its sha256 is checked on each host, nothing is downloaded),
    names the key a real build would take and the build tools the hosts lack, and creates nothing."""
    res = typed("ansible-playbook playbooks/llamacpp.yml -l testhosts --check", timeout=300)
    assert res.returncode == 0, playbook.why(res.stdout)
    defaults = yaml.safe_load((ROOT / "roles/llamacpp/defaults/main.yml").read_text())
    base = yaml.safe_load((ROOT / "roles/llamacpp/vars/main.yml").read_text())["_llamacpp_cmake_base"]
    key = build_key(f"sha256:{defaults['llamacpp_sdist_sha256']}", base)
    assert res.stdout.count(f"llama-server key {key}: check mode, nothing is built") == len(HOSTS), res.stdout[-3000:]
    assert "a real run downloads" not in res.stdout
    assert res.stdout.count("not on the host yet: cmake, ninja, a C++ compiler (g++)") == len(HOSTS)
    for host in HOSTS:
        assert re.search(rf"{host}\s+: ok=\d+\s+changed=\d+\s+unreachable=0\s+failed=0", res.stdout), res.stdout[-1500:]
        assert testhosts.ssh(host, "test -e /opt/specfleet/llama.cpp", check=False).returncode != 0, host


def test_collector_pull_fetches_a_run(two_host_run: tuple[Bench, str, str]) -> None:
    """`specfleet pull -l testhosts [<id>]` as typed, with the id and without it (the newest run on
    each host: this one): th1's folder, removed on the controller, comes back; the table is the same."""
    bench, run, _ = two_host_run
    before = cells(bench.results, run)
    for run_id in (run, None):
        shutil.rmtree(bench.results / run / "th1")
        res = typed("specfleet pull -l testhosts [<id>]", timeout=600, run_id=run_id)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
        assert "th1: Fetch the results to the controller: ok" in res.stdout
        assert (bench.results / run / "th1/tp1-ngram-k2/requests.jsonl").is_file()
        assert cells(bench.results, run) == before


def test_controller_killed_mid_config_then_rerun(two_host_run: tuple[Bench, str, str], testhosts: TestHosts,
                                                standin: dict[str, str], tmp_path: Path) -> None:
    run = "it-detached"
    bench = Bench(tmp_path)
    proc = playbook.start(bench.args({"run_id": run, **standin}, limit="testhosts"), new_session=True)
    try:
        end = time.monotonic() + 600
        # both hosts' suites started (the controller starts them one host after the other), th1 mid-config
        while not (any(e["event"] == "config_ready" for e in host_events(testhosts, "th1", run))
                   and any(e["event"] == "suite_start" for e in host_events(testhosts, "th2", run))):
            assert proc.poll() is None and time.monotonic() < end, "the suites did not start on both hosts"
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGKILL)  # the controller dies in the middle of a config
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # the suite goes on on the hosts without the controller
    end = time.monotonic() + 120
    while not any(e["event"] == "config_start" for e in host_events(testhosts, "th2", run)):
        assert time.monotonic() < end, "th2's suite did not go on without the controller"
        time.sleep(0.5)
    res = bench.run({"run_id": run, **standin}, limit="testhosts", timeout=1200)
    assert res.returncode == 0, playbook.why(res.stdout)
    for host in HOSTS:
        started = Counter(e["config_id"] for e in host_events(testhosts, host, run) if e["event"] == "config_start")
        assert started == {"tp1-autoregressive": 1, "tp1-ngram-k2": 1}, (host, started)  # nothing ran twice
    assert all(s["status"] == "ok" for s in statuses(bench.results, run).values())
    # the same configs and cells as the uninterrupted run
    assert cells(bench.results, run) == cells(two_host_run[0].results, two_host_run[1])
    assert_clean(testhosts)


def test_model_unreadable_by_the_service_user_is_refused_before_start(testhosts: TestHosts, standin: dict[str, str],
                                                                    tmp_path: Path) -> None:
    weights = ROOT / ".cache/models/target/model.safetensors"
    mode = weights.stat().st_mode & 0o777
    weights.chmod(0o600)  # as some tools write weights: readable by root only
    try:
        res = Bench(tmp_path).run({"run_id": "it-unreadable", **standin}, limit="testhosts", timeout=600)
    finally:
        weights.chmod(mode)
    assert res.returncode != 0
    assert "/opt/models/target: not readable by specfleet: /opt/models/target/model.safetensors" in res.stdout
    for host in HOSTS:
        assert testhosts.ssh(host, "ls /var/lib/specfleet/results/it-unreadable", check=False).returncode != 0
    assert_clean(testhosts)


def test_one_host_unreachable_mid_suite_the_other_completes(two_host_run: tuple[Bench, str, str],
                                                           testhosts: TestHosts, standin: dict[str, str],
                                                           tmp_path: Path, ssh_dir: Path) -> None:
    """th2's link goes down while its suite runs: th1 completes and is reported, th2 is reported unreachable;
    once th2 is back, a re-run with the same run id picks up what th2 did meanwhile and completes it."""
    run = "it-unreachable"
    bench = Bench(tmp_path)
    # a link that is down is found after 3 s x 2 unanswered keepalives, on connections of this run's own (the ones
    # earlier runs left open keep the inventory's 30 s x 3)
    env = {"ANSIBLE_SSH_ARGS": "-o ControlMaster=auto -o ControlPersist=300s "
                               "-o ServerAliveInterval=3 -o ServerAliveCountMax=2",
           "ANSIBLE_SSH_CONTROL_PATH_DIR": str(ssh_dir)}
    veth = testhosts.netns("th2")  # th2's end of the bridge
    proc = playbook.start(bench.args({"run_id": run, **standin}, limit="testhosts"), env=env, new_session=True)
    try:
        end = time.monotonic() + 600
        while not any(e["event"] == "config_start" for e in host_events(testhosts, "th2", run)):
            assert proc.poll() is None and time.monotonic() < end, "th2 never started a config"
            time.sleep(0.5)
        subprocess.run(["ip", "link", "set", veth, "down"], check=True)
        out, _ = proc.communicate(timeout=900)
    finally:
        subprocess.run(["ip", "link", "set", veth, "up"], check=True)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert re.search(r"th2\s+: .*unreachable=1", out) or re.search(r"fatal: \[th2\].*UNREACHABLE", out), out[-3000:]
    assert re.search(r"th1\s+: ok=\d+ .*unreachable=0\s+failed=0", out), out[-3000:]
    first = statuses(bench.results, run)
    assert {h for h, _ in first} == {"th1"} and all(s["status"] == "ok" for s in first.values())
    assert (bench.results / run / "report.csv").exists()  # th1's table, made without th2

    res = bench.run({"run_id": run, **standin}, limit="th2", timeout=1200)  # th2 is back: resume it
    assert res.returncode == 0, res.stdout[-5000:]
    started = Counter(e["config_id"] for e in host_events(testhosts, "th2", run) if e["event"] == "config_start")
    assert started == {"tp1-autoregressive": 1, "tp1-ngram-k2": 1}, started  # its suite went on, nothing twice
    both = statuses(bench.results, run)
    assert {h for h, _ in both} == {"th1", "th2"} and all(s["status"] == "ok" for s in both.values())
    assert cells(bench.results, run) == cells(two_host_run[0].results, two_host_run[1])
    assert_clean(testhosts)


def test_a_server_that_leaves_a_process_behind_is_stopped_in_seconds(testhosts: TestHosts, standin: dict[str, str],
                                                                    tmp_path: Path) -> None:
    """The unit's main process exits on SIGTERM but leaves a child that ignores it (as an engine worker stuck in its
    own shutdown does): the child gets 1 s and then SIGKILL, not systemd's whole stop timeout (30 s here)."""
    run = "it-linger"
    matrix = reduced_matrix([{"method": "autoregressive", "env": {"STANDIN_LINGER": "1"}}], workloads=["fib"],
                            context_tokens=[0], concurrency=[1])
    res = Bench(tmp_path).run({**matrix, "run_id": run, **standin}, limit="th1", timeout=600)
    assert res.returncode == 0, playbook.why(res.stdout)
    status = statuses(tmp_path / "results", run)[("th1", "tp1-autoregressive")]
    # stopped before systemd's stop timeout (30 s) ran out: its journal says no timeout (how much sooner is the
    # machine's pace)
    assert status["status"] == "ok" and status["stop_s"] < 30, status
    log = (tmp_path / "results" / run / "th1/tp1-autoregressive/server.log").read_text()
    assert "Stopped specfleet-vllm@tp1-autoregressive.service" in log and "timed out" not in log, log[-2000:]
    assert testhosts.ssh("th1", "pgrep -f lingering-child", check=False).stdout.strip() == ""
    assert_clean(testhosts)

"""Secure by default: servers bind 127.0.0.1 unless the inventory says otherwise (the default is checked on
a live server in test_faults.py); an exposed server
requires an API key that the client sends; no secret reaches any result, log, plan output or
Ansible output (planted values are searched for in everything a run writes)."""
from __future__ import annotations

import http.client
import json
import os
import secrets
import signal
from pathlib import Path

import pytest

from .conftest import Bench, reduced_matrix
from .test_failures import wait_for

pytestmark = pytest.mark.engine  # the real engine's own API key and bind address


def listening(port: int) -> set[str]:
    """Local addresses listening on `port`, from /proc/net/tcp (hex little-endian IPv4)."""
    out = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        addr, p = f[1].split(":")
        if f[3] == "0A" and int(p, 16) == port:
            out.add(".".join(str(int(addr[i:i + 2], 16)) for i in (6, 4, 2, 0)))
    return out


def until_serving(bench: Bench, proc) -> tuple[int, list[str]]:
    """(pid, command line) of the run's engine server once its /health answers 200; fails at once if the playbook
    ended first."""
    def serving() -> tuple[int, list[str]] | None:
        if proc.poll() is not None:
            raise AssertionError(f"the playbook ended before a server was ready:\n{proc.stdout.read()[-3000:]}")
        for entry in Path("/proc").glob("[0-9]*"):
            try:
                argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
                mine = str(bench.tmp).encode() in (entry / "environ").read_bytes()
            except OSError:
                continue
            if mine and "--port" in argv and any("api_server" in a for a in argv):
                try:
                    if status_of(int(argv[argv.index("--port") + 1]), "/health", None, {}) == 200:
                        return int(entry.name), argv
                except OSError:
                    pass  # not listening yet
        return None
    return wait_for(serving, 400, "server serving")


def status_of(port: int, path: str, body: dict | None, headers: dict[str, str]) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST" if body else "GET", path, json.dumps(body) if body else None,
                     {"Content-Type": "application/json", **headers})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def files_holding(root: Path, needles: list[bytes]) -> list[str]:
    hits = []
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            data = p.read_bytes()
            hits += [f"{p}: {n.decode()}" for n in needles if n in data]
    return hits


def test_exposed_server_requires_the_key_and_no_secret_is_written_anywhere(bench: Bench, engine_help: Path) -> None:
    run = "it-secrets"
    bench.seed_engine_help(engine_help)
    api_key = "sk-planted-" + secrets.token_hex(12)
    hf_token = "hf_planted" + secrets.token_hex(12)
    flag_token = "tok-planted-" + secrets.token_hex(8)
    needles = [api_key.encode(), hf_token.encode(), flag_token.encode()]
    matrix = reduced_matrix([{"method": "autoregressive"}], workloads=["fib"], context_tokens=[0, 256],
                            concurrency=[1])
    extra = {**matrix, "run_id": run, "bench_bind_host": "0.0.0.0", "bench_api_key": api_key}
    extra["bench_phases"][0]["env"] = {"HF_TOKEN": hf_token}  # beside the host's bench_env
    extra["bench_phases"][0]["configs"][0]["env"] = {"MY_SERVICE_TOKEN": flag_token}

    plan = bench.run(extra, "-e", "plan=true", "-v")
    assert plan.returncode == 0, plan.stdout[-3000:]
    assert "<redacted>" in plan.stdout and "VLLM_API_KEY" in plan.stdout

    proc = bench.start(extra, "-v")
    try:
        pid, argv = until_serving(bench, proc)
        # the agent held (SIGSTOP) while its server is checked: it can neither measure nor stop it meanwhile, so
        # the server is up for every check however slow the machine (the requests it has in flight wait)
        agent = json.loads((bench.host_run(run) / "agent.json").read_text())["pid"]
        os.kill(agent, signal.SIGSTOP)
        try:
            port = int(argv[argv.index("--port") + 1])
            assert listening(port) == {"0.0.0.0"}  # bound as the inventory says
            body = {"model": "tiny-llama", "prompt": "hi", "max_tokens": 2}
            assert status_of(port, "/v1/completions", body, {}) == 401  # no key: refused
            assert status_of(port, "/v1/completions", body, {"Authorization": "Bearer wrong-key-000000"}) == 401
            assert status_of(port, "/v1/completions", body, {"Authorization": f"Bearer {api_key}"}) == 200
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            assert b"--served-model-name" in cmdline and api_key.encode() not in cmdline  # it reads its environment
        finally:
            os.kill(agent, signal.SIGCONT)
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    st = json.loads((bench.results / run / "local/tp1-autoregressive/status.json").read_text())
    assert st["status"] == "ok" and st["requests_ok"] == st["requests"] == 4  # the client sent the key

    assert [n.decode() for n in needles if n in (plan.stdout + plan.stderr + out).encode()] == []
    assert files_holding(bench.results, needles) == []
    assert files_holding(bench.host_dir, needles) == []  # results, logs, events, and the plan after start
    cfg = json.loads((bench.results / run / "local/tp1-autoregressive/config.json").read_text())
    assert cfg["environment"]["VLLM_API_KEY"] == cfg["environment"]["HF_TOKEN"] == "<redacted>"


def test_exposed_without_a_key_is_refused_before_anything_starts(bench: Bench) -> None:
    matrix = reduced_matrix([{"method": "autoregressive"}])
    res = bench.run({**matrix, "run_id": "it-open", "bench_bind_host": "0.0.0.0"})
    assert res.returncode != 0
    assert "bench_api_key: servers bound to 0.0.0.0 are reachable from the network" in res.stdout
    assert not bench.host_run("it-open").exists()

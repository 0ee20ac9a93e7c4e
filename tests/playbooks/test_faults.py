"""The fault matrix: after each fault the suite went on, the right status and reason were recorded, and nothing
was lost or left half-written. These are specfleet's claims, so the stand-in engine (tests/standin) serves and
injects the faults; tests/standin/test_contract.py keeps its answers equal to the real engine's.

One suite run (`faults`) carries the faults in a row (HTTP errors and malformed chunks, a frozen server, GPU
memory still held after a stop, an exit during startup, a normal config, usage that disagrees with the
counters); the others need their own settings (a server never healthy, a fixed port, a tiny filesystem)."""
from __future__ import annotations

import http.client
import http.server
import json
import os
import re
import signal
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.disk import fill

from .conftest import ROOT, Bench, reduced_matrix
from .test_failures import wait_for
from .test_security import listening

CAPTURES = ROOT / "tests" / "fixtures" / "nvidia-h200"
FAKES = ROOT / "tests" / "fakes"


def statuses(host: Path) -> dict[str, dict[str, Any]]:
    return {p.parent.name: json.loads(p.read_text()) for p in host.glob("*/status.json")}


def rows_of(host: Path, cid: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (host / cid / "requests.jsonl").read_text().splitlines()]


def engine(marker: str, needle: str) -> tuple[int, list[str]] | None:
    """(the process group, the command line) of the engine process whose command line holds `needle` (under this
    test)."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            env = (proc / "environ").read_bytes()
            cmd = " ".join(argv)
            if needle in cmd and "api_server" in cmd and marker.encode() in env:
                return os.getpgid(int(proc.name)), argv
        except OSError:
            continue
    return None


def engine_group(marker: str, needle: str) -> int | None:
    """The process group of the engine process whose command line holds `needle` (under this test)."""
    found = engine(marker, needle)
    return found[0] if found else None


def no_engine_left(marker: str) -> None:
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes()
            env = (proc / "environ").read_bytes()
        except OSError:
            continue
        assert not (b"api_server" in cmd and marker.encode() in env), f"engine process {proc.name} left running"


def no_partial_files(root: Path) -> None:
    """write_atomic's temporaries never outlive a write."""
    assert [str(p) for p in root.rglob(".*.tmp")] == []


@pytest.fixture
def fake_gpu(bench: Bench, monkeypatch: pytest.MonkeyPatch) -> str:
    """The stand-in nvidia-smi on PATH; GPU memory held (the 19592 MiB of the captured hold) from when the run
    `it-faults` records tp1-frozen ready until it records the next config after tp1-gpu-held started: past the
    frozen config's own start, through gpu-held's release check, released before the next one's. The run's id."""
    run = "it-faults"
    monkeypatch.setenv("PATH", f"{FAKES}:{os.environ['PATH']}")
    monkeypatch.setenv("NVIDIA_SMI_CAPTURES", str(CAPTURES))
    monkeypatch.setenv("NVIDIA_SMI_HOLD_LOG", str(bench.host_run(run) / "events.jsonl"))
    monkeypatch.setenv("NVIDIA_SMI_HOLD_FROM", '"config_id": "tp1-frozen", "event": "config_ready"')
    monkeypatch.setenv("NVIDIA_SMI_HOLD_UNTIL", '"config_id": "tp1-startup-exit"')  # its config_start
    return run


def test_http_errors_frozen_server_gpu_held_and_startup_exit_in_one_suite(bench: Bench, fake_gpu: str) -> None:
    """Each fault comes from the stand-in engine or the stand-in nvidia-smi at a point the test sets (a token
    count, the agent's own events, a startup that lasts until the test kills it, a server healthy only once the
    test has looked at it), never from a kill or a check timed against an engine's speed."""
    run = fake_gpu
    opened = bench.tmp / "frozen-healthy"
    matrix = reduced_matrix([
        {"method": "autoregressive"},
        {"method": "ngram", "num_speculative_tokens": 2, "id": "http-faults",
         "env": {"STANDIN_HTTP_FAULTS": "http_error=3,malformed=4"}},
        {"method": "ngram", "num_speculative_tokens": 3, "id": "frozen",  # hangs after 2 or more timed requests
         "env": {"STANDIN_FAULT": "hang", "STANDIN_FAULT_AFTER_TOKENS": str(32 + 4 * 32 + 10),
                 "STANDIN_HEALTHY_AFTER": str(opened)}},
        {"method": "ngram", "num_speculative_tokens": 4, "id": "gpu-held"},
        {"method": "ngram", "num_speculative_tokens": 5, "id": "startup-exit", "env": {"STANDIN_STARTUP_S": "600"}},
        {"method": "ngram", "num_speculative_tokens": 6, "id": "after"},
        {"method": "ngram", "num_speculative_tokens": 2, "id": "counted-wrong",
         "env": {"STANDIN_HTTP_FAULTS": "alter_usage=2"}},
    ], workloads=["fib", "json"], max_tokens=[32], context_tokens=[0], concurrency=[1, 2])
    extra = {**matrix, **bench.standin(), "run_id": run, "bench_repetitions": 3,
             "bench_timeouts": {"health_s": 400, "request_s": 12, "stop_s": 30, "release_s": 5}}
    marker = str(bench.tmp)
    proc = bench.start(extra)
    try:
        def ready(cid: str) -> dict[str, Any] | None:
            return next((e for e in bench.events(run) if e["event"] == "config_ready"
                         and e["config_id"] == f"tp1-{cid}"), None)

        # the frozen config's server listens, but is not healthy until the test has looked: loopback only, by
        # default (its own health deadline is 400 s)
        found = wait_for(lambda: engine(marker, '"num_speculative_tokens":3'), 300, "frozen engine")
        port = int(found[1][found[1].index("--port") + 1])
        assert wait_for(lambda: listening(port), 60, "frozen listening") == {"127.0.0.1"}
        opened.touch()
        # 2. the engine freezes mid-config (after the warmup and two timed requests)
        log = bench.host_run(run) / "tp1-frozen" / "server.log"
        wait_for(lambda: log.exists() and "hanging (injected SIGSTOP)" in log.read_text(), 120, "the freeze")
        # 9. from its ready on, the stand-in nvidia-smi says GPU memory is held, until the one after gpu-held starts
        # 4. kill the next engine while it starts up (its startup lasts 600 s)
        pgid = wait_for(lambda: engine_group(marker, '"num_speculative_tokens":5'), 300, "startup-exit engine")
        assert ready("startup-exit") is None
        os.killpg(pgid, signal.SIGKILL)
        t_kill = time.time()
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-4000:]
    host = bench.results / run / "local"
    st = statuses(host)
    assert st["tp1-autoregressive"]["status"] == "ok"

    # 11. some requests answered with HTTP 500 or a cut chunk: those rows ok=false with the error, the rest ok
    rows = rows_of(host, "tp1-http-faults")
    bad = [r for r in rows if not r["ok"]]
    assert st["tp1-http-faults"]["status"] == "ok" and len(rows) == 18
    assert any("HTTP 500" in r["error"] and "injected fault" in r["error"] for r in bad), bad
    assert any("malformed stream chunk" in r["error"] for r in bad), bad
    assert all(r["completion_tokens"] == 32 for r in rows if r["ok"])
    report = json.loads((bench.results / run / "report.json").read_text())["rows"]
    mine = [r for r in report if r["config_id"] == "tp1-http-faults"]
    assert sum(r["errors"] for r in mine) == len(bad) and sum(r["n"] for r in mine) == len(rows) - len(bad)
    assert all(r["n"] + r["errors"] == 3 * r["concurrency"] for r in mine)
    assert "errors" in (bench.results / run / "report.md").read_text()

    # 2. frozen: the request deadline passed, the config failed with the reason, the server is gone
    fz = st["tp1-frozen"]
    assert (fz["status"], fz["reason"]) == ("failed", "request_timeout"), fz
    assert "deadline of 12 s" in fz["detail"] and "hung" in fz["detail"]
    assert fz["requests"] >= 2 and fz["requests_ok"] >= 2
    # resumed by the SIGCONT that follows SIGTERM, it shut down by itself (a kill at the stop deadline leaves no
    # such line)
    assert "[standin] stopped" in (host / "tp1-frozen/server.log").read_text()

    # 9. GPU memory still held: the config waited release_s, then failed without starting a server
    gh = st["tp1-gpu-held"]
    assert (gh["status"], gh["reason"]) == ("failed", "gpu_busy"), gh
    assert "19592" in gh["detail"] and gh["ready_s"] is None
    assert "server not started" in (host / "tp1-gpu-held/server.log").read_text()

    # 4. exit during startup: crashed (the exit seen, not the health deadline of 400 s)
    se = st["tp1-startup-exit"]
    assert (se["status"], se["reason"]) == ("failed", "crashed"), se
    assert "during startup" in se["detail"]
    detected = datetime.fromisoformat(se["finished_at"]).timestamp() - t_kill
    assert detected < 60, detected  # a hang detector: the exit ends the wait, the deadline would be 400 s

    assert st["tp1-after"]["status"] == "ok"  # the suite went on after four faults

    # the server's counters: where nothing came between client and server they agree exactly
    for cid in ("tp1-autoregressive", "tp1-after"):
        counted = st[cid]["counters"]
        assert counted["verdict"] == "ok", counted
        assert counted["generation_tokens"]["server"] == counted["generation_tokens"]["rows"] == 18 * 32
        assert counted["requests"] == {"server": 18, "rows": 18, "ok": True}
    assert st["tp1-after"]["counters"]["accept_length"]["ok"] is True
    # a proxy that adds one token to some usages, and one that answers HTTP 500 in the server's place: suspect
    wrong = st["tp1-counted-wrong"]
    assert wrong["status"] == "ok" and wrong["counters"]["verdict"] == "suspect", wrong["counters"]
    rows_tokens = sum(r["completion_tokens"] for r in rows_of(host, "tp1-counted-wrong"))
    assert wrong["counters"]["generation_tokens"] == {"server": 18 * 32, "rows": rows_tokens, "ok": False}
    assert rows_tokens > 18 * 32
    assert st["tp1-http-faults"]["counters"]["verdict"] == "suspect"
    assert st["tp1-http-faults"]["counters"]["requests"]["rows"] == 18
    md = (bench.results / run / "report.md").read_text()
    # flagged with the two figures (beside `noisy` and `foreign_load`, which the tests running beside may add)
    assert re.search(rf"- local tp1-counted-wrong \[suspect[a-z_,]*\]: counters: generation_tokens: server "
                     rf"{18 * 32} vs rows {rows_tokens}", md), md[md.find("## Checks"):][:600]
    table = (bench.results / run / "report.csv").read_text()
    assert table.count("suspect") >= 2 * 4  # every cell row of both suspect configs is flagged
    no_partial_files(bench.host_dir)
    no_engine_left(marker)


def test_never_healthy_is_a_health_timeout_with_the_log_tail(bench: Bench) -> None:
    run = "it-unhealthy"
    matrix = reduced_matrix([{"method": "autoregressive"}, {"method": "ngram", "num_speculative_tokens": 2}])
    res = bench.run({**matrix, **bench.standin(STANDIN_HEALTHY="0"), "run_id": run,
                     "bench_timeouts": {"health_s": 5, "request_s": 60, "stop_s": 30, "release_s": 5}})
    assert res.returncode == 2 and "0 ok, 1 failed, 1 skipped" in res.stdout, res.stdout[-3000:]
    st = statuses(bench.results / run / "local")
    base = st["tp1-autoregressive"]
    assert (base["status"], base["reason"]) == ("failed", "health_timeout"), base
    assert "/health not 200 within 5 s" in base["detail"]
    assert base["log_tail"].strip(), "the log tail of the server is recorded"
    assert (st["tp1-ngram-k2"]["status"], st["tp1-ngram-k2"]["reason"]) == ("skipped", "baseline_failed")
    no_engine_left(str(bench.tmp))


class _Foreign(http.server.BaseHTTPRequestHandler):
    """Another program's server: answers 200 to everything, and counts what it was sent."""

    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802
        self.hits.append(self.path)
        self.send_response(200)
        self.end_headers()

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


def test_port_taken_by_another_process_is_named_and_left_alone(bench: Bench) -> None:
    run = "it-port"
    foreign = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Foreign)
    port = foreign.server_address[1]
    threading.Thread(target=foreign.serve_forever, daemon=True).start()
    try:
        matrix = reduced_matrix([{"method": "autoregressive"}, {"method": "ngram", "num_speculative_tokens": 2}])
        res = bench.run({**matrix, **bench.standin(), "run_id": run, "bench_port": port})
        assert res.returncode == 2 and "fails the run (bench_fail_on: none_ok)" in res.stdout, res.stdout[-3000:]
        st = statuses(bench.results / run / "local")
        base = st["tp1-autoregressive"]
        assert (base["status"], base["reason"]) == ("failed", "port_in_use"), base
        assert f"port {port} on 127.0.0.1 is already taken" in base["detail"]
        assert st["tp1-ngram-k2"]["reason"] == "baseline_failed"
        # not one request was sent to the other program but the foreign-load probe's read-only model list
        assert set(_Foreign.hits) <= {"/v1/models"}, _Foreign.hits
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/still-there")
        assert conn.getresponse().status == 200 and _Foreign.hits[-1] == "/still-there"  # and it still serves
        conn.close()
    finally:
        foreign.shutdown()
        foreign.server_close()
    no_engine_left(str(bench.tmp))


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_disk_full_while_writing_results_is_clear_and_resumable(bench: Bench) -> None:
    run = "it-diskfull"
    bench.host_dir.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "specfleet-test", str(bench.host_dir)], check=True)
    try:
        gate = bench.tmp / "gate"  # outside the tiny filesystem
        matrix = reduced_matrix([{"method": "autoregressive"}, {"method": "ngram", "num_speculative_tokens": 2,
                                 "env": {"STANDIN_FAULT": "gate", "STANDIN_GATE": str(gate),
                                         "STANDIN_FAULT_AFTER_TOKENS": "40"}}])
        extra = {**matrix, **bench.standin(), "run_id": run}
        proc = bench.start(extra)
        try:
            host = bench.host_run(run)
            log = host / "tp1-ngram-k2" / "server.log"
            wait_for(lambda: log.exists() and "gated until" in log.read_text(), 120, "second config measuring")
            before = (host / "tp1-autoregressive/status.json").read_bytes()
            filler = fill(bench.host_dir)
            gate.touch()
            out, _ = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode != 0
        assert "the results filesystem on local is full" in out and "re-run with the same run_id" in out, out[-3000:]
        assert (host / "tp1-autoregressive/status.json").read_bytes() == before  # intact
        assert not (host / "tp1-ngram-k2/status.json").exists()  # not recorded as if complete
        no_partial_files(bench.host_dir)
        no_engine_left(str(bench.tmp))
        filler.unlink()
        res = bench.run(extra)  # resume once there is room again
        assert res.returncode == 0, res.stdout[-3000:]
        assert "tp1-autoregressive  already ok in this run, kept" in res.stdout
        st = statuses(bench.results / run / "local")
        assert {k: v["status"] for k, v in st.items()} == {"tp1-autoregressive": "ok", "tp1-ngram-k2": "ok"}
        assert (bench.results / run / "local/tp1-autoregressive/status.json").read_bytes() == before
    finally:
        subprocess.run(["umount", "-l", str(bench.host_dir)], check=False)



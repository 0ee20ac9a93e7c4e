"""An engine that floods its log and leaves a process behind, and the play's exit status over the configs'
statuses: real `ansible-playbook bench.yml -l local` runs with the stand-in engine (tests/standin), which floods
and starts the escaped helper when told to."""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from .conftest import Bench, reduced_matrix

FLOOD_MIB = 1536   # 1.5 GiB before the engine serves
BOUND_MIB = 1      # bench_server_log_max_mib of the run


def escaped_helpers() -> list[int]:
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if b"escaped-helper" in (proc / "cmdline").read_bytes():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def test_log_flood_is_bounded_and_an_escaped_process_is_killed(bench: Bench) -> None:
    run = "it-hardening"
    matrix = reduced_matrix([{"method": "autoregressive"},
                             {"method": "ngram", "num_speculative_tokens": 2, "server_args": ["--no-such-flag"]}],
                            workloads=["fib"], max_tokens=[16], context_tokens=[0], concurrency=[1])
    extra = {**matrix, "run_id": run, "bench_repetitions": 1, "bench_server_log_max_mib": BOUND_MIB,
             **bench.standin(STANDIN_HELPER="1", STANDIN_LOG_FLOOD_MIB=str(FLOOD_MIB))}
    res = bench.run(extra, timeout=900)
    # one config ok, one failed: the default bench_fail_on (none_ok) passes the run
    assert res.returncode == 0, res.stdout[-4000:]
    assert "local: 2 configs: 1 ok, 1 failed, 0 skipped (unsupported_flag 1)" in res.stdout

    config = bench.host_run(run) / "tp1-autoregressive"
    status = json.loads((config / "status.json").read_text())
    assert status["status"] == "ok", status
    log = (config / "server.log").read_bytes()
    assert len(log) <= (BOUND_MIB << 20) + 512, len(log)
    match = re.search(rb"\[specfleet\] (\d+) bytes of the server's output dropped here", log)
    assert match, log[(BOUND_MIB << 19) - 200:(BOUND_MIB << 19) + 400]
    dropped = int(match.group(1))
    assert dropped >= (FLOOD_MIB - BOUND_MIB) << 20  # the flood, less what was kept
    assert log.startswith(b"x" * 1023 + b"\n") and b"FLOOD-END" not in log[:BOUND_MIB << 19]
    assert b"Application startup complete" in log[-(BOUND_MIB << 19):]  # the engine's own end is kept
    host_bytes = folder_bytes(bench.host_run(run))
    controller_bytes = folder_bytes(bench.results / run)
    print(f"flood {FLOOD_MIB} MiB -> server.log {len(log)} B, dropped {dropped} B; host folder {host_bytes} B, "
          f"controller folder {controller_bytes} B; wall {status['wall_s']} s")
    assert host_bytes < 4 << 20 and controller_bytes < 4 << 20

    # the helper that left the process group was found by its mark, killed and recorded
    [survivor] = status["survivors"]
    assert survivor["gone"] is True and "escaped-helper" in survivor["cmdline"], survivor
    assert "1 process(es) outlived the server" in status["detail"]
    assert escaped_helpers() == []
    assert not [p for p in Path("/proc").glob("[0-9]*") if _marked_by(p, run)]

    # the same run with bench_fail_on: any: the ok config is kept, the failed one fails again, and so does the play
    strict = bench.run({**extra, "bench_fail_on": "any"}, timeout=600)
    assert strict.returncode == 2, strict.stdout[-3000:]
    assert "[1/2] tp1-autoregressive  already ok in this run, kept" in strict.stdout
    assert "1 ok, 1 failed, 0 skipped (unsupported_flag 1)  <- fails the run (bench_fail_on: any)" in strict.stdout

    # -e skip_unsupported=true: the config the engine cannot run is recorded skipped, with its flag and version
    skipped = bench.run({**extra, "skip_unsupported": "true"}, timeout=600)
    assert skipped.returncode == 0, skipped.stdout[-3000:]
    assert "1 ok, 0 failed, 1 skipped (unsupported_flag 1)" in skipped.stdout
    ngram = json.loads((bench.host_run(run) / "tp1-ngram-k2/status.json").read_text())
    assert (ngram["status"], ngram["reason"], ngram["unsupported_flags"]) == ("skipped", "unsupported_flag",
                                                                             ["--no-such-flag"])
    assert ngram["detail"] == "--no-such-flag not known to vllm 0.32.0 (skip_unsupported)" and ngram["ready_s"] is None


def _marked_by(proc: Path, run: str) -> bool:
    try:
        return f"SPECFLEET_CONFIG={run}/".encode() in (proc / "environ").read_bytes() and int(proc.name) != os.getpid()
    except OSError:
        return False


def test_exit_status_follows_bench_fail_on(bench: Bench) -> None:
    """No config ok (the engine cannot even be asked for its flags): the play fails by default, after writing
    the results and the table; with bench_fail_on: never it does not."""
    run = "it-exit"
    matrix = reduced_matrix([{"method": "autoregressive"}, {"method": "ngram", "num_speculative_tokens": 2}])
    extra = {**matrix, "run_id": run, "bench_engine_python": "/bin/false"}
    res = bench.run(extra, timeout=300)
    assert res.returncode == 2, res.stdout[-3000:]
    assert ("local: 2 configs: 0 ok, 1 failed, 1 skipped (baseline_failed 1, engine_unavailable 1)  <- fails the "
            "run (bench_fail_on: none_ok)") in res.stdout
    assert (bench.results / run / "report.csv").is_file()
    never = bench.run({**extra, "bench_fail_on": "never"}, timeout=300)
    assert never.returncode == 0, never.stdout[-3000:]
    assert "0 ok, 1 failed, 1 skipped" in never.stdout
    bad = bench.run({**extra, "bench_fail_on": "sometimes"}, timeout=300)
    assert bad.returncode != 0 and "value of bench_fail_on must be one of: none_ok, any, never" in bad.stdout


def test_one_suite_per_host_a_second_run_is_refused_then_queues(bench: Bench) -> None:
    """A second `bench.yml` with another run id while a suite runs on the host: refused before anything starts on
    it, naming the running run id and how to follow or queue; with `-e wait_for_host=true` it runs after it."""
    matrix = reduced_matrix([{"method": "autoregressive"}], workloads=["fib"], context_tokens=[0], concurrency=[1])
    gate = bench.tmp / "open"  # the first suite's first timed request waits for it: it runs while the others try
    held = bench.standin(STANDIN_FAULT="gate", STANDIN_GATE=str(gate), STANDIN_FAULT_AFTER_TOKENS="40")
    first = bench.start({**held, **matrix, "run_id": "it-first"})
    queued = None
    try:
        end = time.monotonic() + 300
        while not any(e["event"] == "config_ready" for e in bench.events("it-first")):
            assert first.poll() is None and time.monotonic() < end, "the first suite did not start"
            time.sleep(0.2)
        res = bench.run({**bench.standin(), **matrix, "run_id": "it-second"}, timeout=300)
        assert res.returncode != 0
        assert ("local: this host is running suite it-first (invocation " in res.stdout
                and "one suite per host. To follow it: -e run_id=it-first; to start this one once it ends: "
                    "-e wait_for_host=true" in res.stdout), res.stdout[-3000:]
        assert not (bench.host_dir / "results" / "it-second").exists()  # nothing on the host, not even a folder
        assert first.poll() is None  # the running suite goes on
        queued = bench.start({**bench.standin(), **matrix, "run_id": "it-second", "wait_for_host": True})
        end = time.monotonic() + 300
        while not bench.host_run("it-second").joinpath("agent.json").exists():
            assert queued.poll() is None and time.monotonic() < end, "the queued suite's agent did not start"
            time.sleep(0.2)
        assert json.loads(bench.host_run("it-second").joinpath("agent.json").read_text())["waiting_for"] == "it-first"
    finally:
        gate.touch()
        out, _ = first.communicate(timeout=600)
    assert first.returncode == 0, out[-3000:]
    assert queued is not None
    later, _ = queued.communicate(timeout=600)
    assert queued.returncode == 0, later[-3000:]
    # the queued suite started its first config only after the first suite had ended
    ended = max(e["t"] for e in bench.events("it-first") if e["event"] == "suite_end")
    began = min(e["t"] for e in bench.events("it-second") if e["event"] == "config_start")
    assert began >= ended

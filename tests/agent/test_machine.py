"""Suites sharing one machine (`machine_lock`: inventory hosts that are one machine, one engine each) take turns
config by config: two agents started together, each a real `python -m agent run` serving the stand-in engine,
never measure at the same time, and once both wait for the machine their configs alternate."""
from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List, Tuple

from controller import matrix
from tests.agent.test_config_run import MAX_TOKENS, suite, write_engine

ROOT = Path(__file__).resolve().parents[2]
RUN_ID = "run-20250103T000000"


def plan(python: str, host: str, lock: Path) -> Dict[str, Any]:
    """A baseline and three ngram configs, one cell each, on `host` with the shared machine lock."""
    phases = [{"name": "tp1", "configs": [{"method": "autoregressive"},
                                          *({"method": "ngram", "num_speculative_tokens": k} for k in (2, 3, 4))],
               "sweeps": [{"workloads": ["fib"], "max_tokens": [MAX_TOKENS], "concurrency": [1]}]}]
    checked = matrix.validate(suite(python, phases=phases, repetitions=1, api_key="", env={},
                                    machine_lock=str(lock)))
    return {"run_id": RUN_ID, "host": host, "suite": checked.suite, "configs": matrix.expand(checked)}


def windows(results: Path, host: str) -> Tuple[List[Tuple[datetime, datetime, str]], List[Dict[str, Any]]]:
    """Each config's (start, end, host) from the host's events, and its machine_wait events."""
    events = [json.loads(line) for line in (results / RUN_ID / host / "events.jsonl").read_text().splitlines()]
    at = {(e["event"], e.get("config_id")): datetime.fromisoformat(e["t"]) for e in events}
    ids = [e["config_id"] for e in events if e["event"] == "config_start"]
    return ([(at[("config_start", c)], at[("config_end", c)], host) for c in ids],
            [e for e in events if e["event"] == "machine_wait"])


def test_two_suites_on_one_machine_take_turns(tmp_path: Path) -> None:
    python, lock = write_engine(tmp_path / "engine"), tmp_path / "machine" / "machine.lock"
    results, hosts = tmp_path / "results", ("cpu-vllm", "cpu-llamacpp")
    procs = []
    for host in hosts:
        path = tmp_path / f"{host}.json"
        path.write_text(json.dumps(plan(python, host, lock)))
        procs.append(subprocess.Popen([sys.executable, "-m", "agent", "run", "--plan", str(path), "--results",
                                       str(results / host)], cwd=ROOT, stderr=subprocess.PIPE, text=True))
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read() if p.stderr else ""
    spans, waits = [], {}
    for host in hosts:
        got, waits[host] = windows(results / host, host)
        statuses = [json.loads(p.read_text())["status"] for p in (results / host / RUN_ID / host).glob("*/status.json")]
        assert statuses == ["ok"] * 4, host
        spans += got
    spans.sort()
    for (_, e1, h1), (s2, _, h2) in zip(spans, spans[1:]):
        assert e1 <= s2, f"{h1} measured until {e1} while {h2} started at {s2}"  # never at once
    order = [h for _, _, h in spans]
    # once the later suite waits, the machine goes back and forth until one suite has nothing left
    first_wait = min(datetime.fromisoformat(w["t"]) for ws in waits.values() for w in ws)
    assert all(waits.values()), waits  # each waited for the other at least once, and said for whom
    for host, ws in waits.items():
        other = next(h for h in hosts if h != host)
        assert all(w["holder"].startswith(f"{other} (run {RUN_ID}, config tp1-") for w in ws), ws
    tail = [h for s, _, h in spans if s >= first_wait]
    both = len(tail) - max(tail.count(h) for h in hosts)  # the turns the other suite could take
    assert all(a != b for a, b in zip(tail[: 2 * both], tail[1: 2 * both])), order
    assert json.loads((lock.parent / "machine.lock.json").read_text())["host"] == spans[-1][2]  # the last holder


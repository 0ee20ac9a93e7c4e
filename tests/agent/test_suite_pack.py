"""A packed phase run by the agent for real: two CPU slots (taskset), the fake engine of test_config as servers.
The baseline starts first on slot 0: with the pack check it runs alone to its end, without it the others start
once it answered its warmup; then the rest two at a time, each server held to its slot's CPU; every status names
its slot and its neighbours; a baseline that fails starts nothing else."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from agent.suite import Suite
from controller import matrix
from tests.agent.test_config import HOST, MAX_TOKENS, assert_contract, suite, write_engine

RUN_ID = "run-packed"
CPUS = sorted(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(len(CPUS) < 2, reason="two CPU slots need two CPUs")


def packed_plan(python: str, **over: Any) -> Dict[str, Any]:
    sweeps = [{"workloads": ["fib"], "max_tokens": [MAX_TOKENS], "concurrency": [1, 2]}]
    configs = [{"method": "autoregressive"}, *({"method": "ngram", "num_speculative_tokens": k} for k in (2, 3, 4))]
    s = suite(python, phases=[{"name": "tp1", "sweeps": sweeps, "configs": configs}], pack=True,
              slots=[{"cpus": str(CPUS[0])}, {"cpus": str(CPUS[1])}], **over)
    checked = matrix.validate(s)
    return {"run_id": RUN_ID, "host": HOST, "suite": checked.suite, "configs": matrix.expand(checked)}


def events(root: Path) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in (root / HOST / "events.jsonl").read_text().splitlines()]


def intervals(ev: List[Dict[str, Any]]) -> Dict[str, Tuple[int, int]]:
    """Per config, the positions of its start and end events in the file."""
    out: Dict[str, List[int]] = {}
    for i, e in enumerate(ev):
        if e["event"] in ("config_start", "config_end"):
            out.setdefault(e["config_id"], []).append(i)
    return {cid: (pos[0], pos[-1]) for cid, pos in out.items()}


def test_a_packed_phase_runs_its_baseline_alone_then_two_at_a_time_each_on_its_cpu(tmp_path: Path) -> None:
    plan = packed_plan(write_engine(tmp_path / "engine"), pack_check=True)
    ids = [c["config_id"] for c in plan["configs"]]
    assert ids == ["tp1-autoregressive", "tp1-autoregressive-packed", "tp1-ngram-k2", "tp1-ngram-k3",
                   "tp1-ngram-k4"]
    root = tmp_path / "results" / RUN_ID
    assert Suite(plan, root, invocation="inv").run() == 0
    status = {cid: json.loads((root / HOST / cid / "status.json").read_text()) for cid in ids}
    assert {cid: s["status"] for cid, s in status.items()} == {cid: "ok" for cid in ids}
    for cfg in plan["configs"]:
        assert_contract(root / HOST / cfg["config_id"], cfg["config_id"])
    # the baseline alone on slot 0, before anything else started
    ev = events(root)
    span = intervals(ev)
    base_end = span["tp1-autoregressive"][1]
    assert all(start > base_end for cid, (start, _) in span.items() if cid != "tp1-autoregressive")
    assert status["tp1-autoregressive"]["slot"] == {"index": 0, "gpus": [], "cpus": str(CPUS[0]),
                                                    "cpus_seen": str(CPUS[0])}
    assert status["tp1-autoregressive"]["neighbours"] == []
    # never more than two at once, and each server held to its slot's CPU by the kernel
    running, most = 0, 0
    for e in ev:
        running += {"config_start": 1, "config_end": -1}.get(e["event"], 0)
        most = max(most, running)
    assert most == 2
    for cid in ids[1:]:
        slot = status[cid]["slot"]
        assert slot["cpus"] == str(CPUS[slot["index"]]) and slot["cpus_seen"] == slot["cpus"], slot
        starts = [e for e in ev if e["event"] == "config_start" and e["config_id"] == cid]
        assert starts[0]["slot"] == slot["index"]
    # neighbours: the configs up at the same time, each pair seen from both sides, on the other slot
    for cid in ids[1:]:
        near = status[cid]["neighbours"]
        assert near, cid
        for n in near:
            assert n["slot"] != status[cid]["slot"]["index"] and n["overlap_s"] > 0
            back = {m["config_id"]: m for m in status[n["config_id"]]["neighbours"]}
            assert back[cid]["overlap_s"] == n["overlap_s"]
    # the pack check measured the baseline's cells while a neighbour measured too
    check = status["tp1-autoregressive-packed"]
    assert any(n["timed_overlap_s"] > 0 for n in check["neighbours"]), check["neighbours"]
    config = json.loads((root / HOST / "tp1-autoregressive-packed" / "config.json").read_text())
    assert config["pack_check_of"] == "tp1-autoregressive" and config["method"] == "autoregressive"


def test_without_the_pack_check_the_others_start_once_the_baseline_answered_its_warmup(tmp_path: Path) -> None:
    plan = packed_plan(write_engine(tmp_path / "engine"))
    ids = [c["config_id"] for c in plan["configs"]]
    assert ids == ["tp1-autoregressive", "tp1-ngram-k2", "tp1-ngram-k3", "tp1-ngram-k4"]
    root = tmp_path / "results" / RUN_ID
    assert Suite(plan, root, invocation="inv").run() == 0
    status = {cid: json.loads((root / HOST / cid / "status.json").read_text()) for cid in ids}
    assert {cid: s["status"] for cid, s in status.items()} == {cid: "ok" for cid in ids}
    ev = events(root)
    span = intervals(ev)
    ready = next(i for i, e in enumerate(ev) if e["event"] == "config_ready"
                 and e["config_id"] == "tp1-autoregressive")
    # nothing else started before the baseline's server was up, and the first other config started on slot 1
    # while the baseline was still measuring: it is packed like the rest
    assert all(start > ready for cid, (start, _) in span.items() if cid != "tp1-autoregressive")
    first = min((start, cid) for cid, (start, _) in span.items() if cid != "tp1-autoregressive")
    assert first[0] < span["tp1-autoregressive"][1]
    assert status[first[1]]["slot"]["index"] == 1
    assert status["tp1-autoregressive"]["slot"]["index"] == 0
    assert [n["config_id"] for n in status["tp1-autoregressive"]["neighbours"]][:1] == [first[1]]


def test_a_packed_phase_whose_baseline_fails_starts_nothing_else(tmp_path: Path) -> None:
    plan = packed_plan(write_engine(tmp_path / "engine", crash="CUDA out of memory"))
    root = tmp_path / "results" / RUN_ID
    Suite(plan, root, invocation="inv").run()
    ids = [c["config_id"] for c in plan["configs"]]
    status = {cid: json.loads((root / HOST / cid / "status.json").read_text()) for cid in ids}
    assert status["tp1-autoregressive"]["status"] == "failed"
    for cid in ids[1:]:
        assert (status[cid]["status"], status[cid]["reason"]) == ("skipped", "baseline_failed")
        assert (root / HOST / cid / "server.log").read_text().startswith("[specfleet] server not started")
    assert [e["config_id"] for e in events(root) if e["event"] == "config_ready"] == []

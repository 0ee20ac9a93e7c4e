"""A packed phase run by the agent for real: two CPU slots (taskset), the stand-in engine (tests/standin) as servers.
The baseline starts first on slot 0: with the pack check it runs alone to its end; without it the other slot
starts beside it but sends no request before the baseline answered its warmup; then the rest two at a time, each
server held to its slot's CPU; every status names its slot and its neighbours; a baseline that fails stops the
server waiting beside it unused and starts nothing else."""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Dict, List, Set, Tuple

import pytest

from agent.suite import Suite
from controller import matrix
from tests.agent.test_config_run import HOST, MAX_TOKENS, assert_contract, suite, write_engine

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


def meet_beside_the_baseline(plan: Dict[str, Any], folder: Path) -> None:
    """Every config but the baseline holds its first timed request until two servers have reached theirs
    (STANDIN_MEET): the first two configs started together meet there, so that their timed windows overlap by
    construction, however slowly a loaded machine runs either (the ones after them pass at once)."""
    for cfg in plan["configs"]:
        if cfg["config_id"] != "tp1-autoregressive":
            cfg["env"] = {**cfg["env"], "STANDIN_MEET": f"{folder}:2"}


def test_a_packed_phase_runs_its_baseline_alone_then_two_at_a_time_each_on_its_cpu(tmp_path: Path) -> None:
    plan = packed_plan(write_engine(tmp_path / "engine"), pack_check=True)
    ids = [c["config_id"] for c in plan["configs"]]
    assert ids == ["tp1-autoregressive", "tp1-autoregressive-packed", "tp1-ngram-k2", "tp1-ngram-k3",
                   "tp1-ngram-k4"]
    meet_beside_the_baseline(plan, tmp_path / "meet")
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
    # never more than two at once (the first two after the baseline met), each server held to its slot's CPU
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
    # neighbours: the configs up at the same time, each pair seen from both sides, on the other slot (which
    # configs after the first two share time depends on the machine's pace: the rule is checked, not the pairs)
    for cid in ids[1:]:
        for n in status[cid]["neighbours"]:
            assert n["slot"] != status[cid]["slot"]["index"] and n["overlap_s"] > 0
            back = {m["config_id"]: m for m in status[n["config_id"]]["neighbours"]}
            assert back[cid]["overlap_s"] == n["overlap_s"]
    # the pack check measured the baseline's cells while the config started with it measured too
    check = status["tp1-autoregressive-packed"]
    first = min(ids[2:], key=lambda cid: span[cid][0])  # started with the check: the two met
    timed = {n["config_id"]: n["timed_overlap_s"] for n in check["neighbours"]}
    assert timed.get(first, 0) > 0, check["neighbours"]
    config = json.loads((root / HOST / "tp1-autoregressive-packed" / "config.json").read_text())
    assert config["pack_check_of"] == "tp1-autoregressive" and config["method"] == "autoregressive"


def test_the_pack_check_and_its_neighbour_start_their_timed_requests_together(tmp_path: Path) -> None:
    """The check's server comes up only once its neighbour has answered its warmup (STANDIN_HEALTHY_AFTER): the
    neighbour, warm first, waits for the check to be warm too, so that neither sends a timed request before both
    are warm (by construction, not by who starts first); their first timed requests then meet."""
    plan = packed_plan(write_engine(tmp_path / "engine"), pack_check=True)
    plan["configs"] = [c for c in plan["configs"] if c["config_id"] in
                       ("tp1-autoregressive", "tp1-autoregressive-packed", "tp1-ngram-k2")]
    warm = tmp_path / "neighbour-warm"
    meet_beside_the_baseline(plan, tmp_path / "meet")
    for cfg in plan["configs"]:
        if cfg["config_id"] == "tp1-autoregressive-packed":
            cfg["env"] = {**cfg["env"], "STANDIN_HEALTHY_AFTER": str(warm)}
        if cfg["config_id"] == "tp1-ngram-k2":
            cfg["env"] = {**cfg["env"], "STANDIN_WARM_MARK": str(warm)}
    root = tmp_path / "results" / RUN_ID
    assert Suite(plan, root, invocation="inv").run() == 0
    ids = ("tp1-autoregressive-packed", "tp1-ngram-k2")
    status = {cid: json.loads((root / HOST / cid / "status.json").read_text()) for cid in ids}
    check, near = status["tp1-autoregressive-packed"], status["tp1-ngram-k2"]
    assert near["waited_for_neighbours_s"] > 0, near                # warm first, it waited for the check
    assert [n["config_id"] for n in check["neighbours"]] == ["tp1-ngram-k2"]
    assert check["neighbours"][0]["timed_overlap_s"] > 0, check["neighbours"]
    # no timed request of either before the other answered its warmup
    logs = {cid: root / HOST / cid / "server.log" for cid in ids}
    for cid, other in (ids, ids[::-1]):
        assert requests_at(logs[cid])[1] >= requests_at(logs[other], "answered")[0], cid


def requests_at(log: Path, what: str = "generate:") -> List[float]:
    """When the stand-in engine received each completion request (warmup included), or with `what="answered"`
    when it had answered each one, epoch seconds."""
    return [float(line.rsplit(" at ", 1)[1]) for line in log.read_text().splitlines()
            if line.startswith(f"[standin] {what}")]


def launched_before(plan: Dict[str, Any], mark: Path, **baseline: str) -> None:
    """Every config but the baseline leaves `mark` as its server is launched (STANDIN_LAUNCH_MARK); the baseline's
    server gets the knobs `baseline` (that wait for it, or for what `mark` proves: a config started beside it)."""
    for cfg in plan["configs"]:
        more = baseline if cfg["config_id"] == "tp1-autoregressive" else {"STANDIN_LAUNCH_MARK": str(mark)}
        cfg["env"] = {**cfg["env"], **more}


def test_without_the_pack_check_the_others_start_beside_the_baseline_and_wait_for_its_warmup(tmp_path: Path) -> None:
    """The baseline's server comes up only once a config beside it has launched its own (STANDIN_HEALTHY_AFTER):
    the other slot starts while the baseline starts, by construction; no request reaches it before the baseline's
    warmup was answered."""
    plan = packed_plan(write_engine(tmp_path / "engine"))
    ids = [c["config_id"] for c in plan["configs"]]
    assert ids == ["tp1-autoregressive", "tp1-ngram-k2", "tp1-ngram-k3", "tp1-ngram-k4"]
    mark = tmp_path / "beside-launched"
    launched_before(plan, mark, STANDIN_HEALTHY_AFTER=str(mark))
    root = tmp_path / "results" / RUN_ID
    assert Suite(plan, root, invocation="inv").run() == 0
    status = {cid: json.loads((root / HOST / cid / "status.json").read_text()) for cid in ids}
    assert {cid: s["status"] for cid, s in status.items()} == {cid: "ok" for cid in ids}
    ev = events(root)
    span = intervals(ev)
    base_ready = next(i for i, e in enumerate(ev) if e["event"] == "config_ready"
                      and e["config_id"] == "tp1-autoregressive")
    # the baseline started first; the first other config started on slot 1 beside it, before its server was up
    assert ev[span["tp1-autoregressive"][0]]["event"] == "config_start" and min(
        start for start, _ in span.values()) == span["tp1-autoregressive"][0]
    first = min((start, cid) for cid, (start, _) in span.items() if cid != "tp1-autoregressive")
    assert first[0] < base_ready, [(e["event"], e.get("config_id")) for e in ev]
    assert status[first[1]]["slot"]["index"] == 1 and status["tp1-autoregressive"]["slot"]["index"] == 0
    # but no other server got a request, warmup included, before the baseline's warmup was answered
    base_warmup_answered = requests_at(root / HOST / "tp1-autoregressive" / "server.log", "answered")[0]
    for cid in ids[1:]:
        assert min(requests_at(root / HOST / cid / "server.log")) >= base_warmup_answered, cid
        assert status[cid]["gate_wait_s"] >= 0  # how long it waited is the machine's pace: the logs are the claim
    assert [n["config_id"] for n in status["tp1-autoregressive"]["neighbours"]][:1] == [first[1]]


def test_a_packed_phase_whose_baseline_fails_starts_nothing_else(tmp_path: Path) -> None:
    """Every server crashes at its start, the baseline's only once a config beside it has launched its server
    (STANDIN_STARTUP_UNTIL): the baseline fails; the config started beside it fails on its own or is stopped (it is
    recorded as it happened) and the configs after them are never started."""
    plan = packed_plan(write_engine(tmp_path / "engine", crash="CUDA out of memory"))
    mark = tmp_path / "beside-launched"
    launched_before(plan, mark, STANDIN_STARTUP_UNTIL=str(mark))
    root = tmp_path / "results" / RUN_ID
    Suite(plan, root, invocation="inv").run()
    ids = [c["config_id"] for c in plan["configs"]]
    status = {cid: json.loads((root / HOST / cid / "status.json").read_text()) for cid in ids}
    assert status["tp1-autoregressive"]["status"] == "failed"
    beside = [cid for cid in ids[1:] if "slot" in status[cid]]  # started on slot 1 before the baseline failed
    assert beside and {status[cid]["slot"]["index"] for cid in beside} == {1}
    for cid in beside:
        assert (status[cid]["status"], status[cid]["reason"]) in {("failed", "oom"), ("skipped", "baseline_failed")}
    for cid in ids[1:]:
        if cid not in beside:
            assert (status[cid]["status"], status[cid]["reason"]) == ("skipped", "baseline_failed")
            assert (root / HOST / cid / "server.log").read_text().startswith("[specfleet] server not started")
    assert [e["config_id"] for e in events(root) if e["event"] == "config_ready"] == []


def test_a_baseline_that_fails_after_the_others_are_up_stops_them_before_any_request(tmp_path: Path) -> None:
    """The baseline's engine fails at the end of its start, which lasts until the n-gram server beside it is up
    (its config_ready event written: STANDIN_STARTUP_UNTIL); that server waits, and is stopped without a single
    request (not even its warmup), recorded skipped with the reason; nothing else starts."""
    plan = packed_plan(write_engine(tmp_path / "engine", crash="CUDA out of memory", crash_plain_after_s=0.0))
    root = tmp_path / "results" / RUN_ID
    for cfg in plan["configs"]:
        if cfg["config_id"] == "tp1-autoregressive":
            cfg["env"] = {**cfg["env"], "STANDIN_STARTUP_UNTIL": str(root / HOST / "events.jsonl"),
                          "STANDIN_STARTUP_UNTIL_TEXT": '"event": "config_ready"'}
    Suite(plan, root, invocation="inv").run()
    ids = [c["config_id"] for c in plan["configs"]]
    status = {cid: json.loads((root / HOST / cid / "status.json").read_text()) for cid in ids}
    assert (status["tp1-autoregressive"]["status"], status["tp1-autoregressive"]["reason"]) == ("failed", "oom")
    ev = events(root)
    up = [e["config_id"] for e in ev if e["event"] == "config_ready"]
    assert len(up) == 1 and up[0] != "tp1-autoregressive", up
    held = status[up[0]]
    assert (held["status"], held["reason"], held["slot"]["index"]) == ("skipped", "baseline_failed", 1)
    assert "stopped once up, before any request" in held["detail"] and held["requests"] == 0
    assert requests_at(root / HOST / up[0] / "server.log") == []
    for cid in ids[1:]:
        if cid != up[0]:
            assert (status[cid]["status"], status[cid]["reason"]) == ("skipped", "baseline_failed")
            assert (root / HOST / cid / "server.log").read_text().startswith("[specfleet] server not started")


def test_a_config_taken_after_the_pack_check_always_finds_it_up(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The check is first in the queue and a slot takes it and marks it up in one step: whichever slot thread runs
    first, every config started beside it finds it among the checks up (else it would start its timed requests
    without waiting for the check, and the check could measure alone). The configs' own runs are replaced by a
    record of what each saw; the check's holds until another config has started."""
    plan = packed_plan(write_engine(tmp_path / "engine"), pack_check=True)
    other_started = threading.Event()
    seen: List[Tuple[str, Set[str]]] = []

    def run_config(self: Suite, cfg: Dict[str, Any], slot: Any, share: int, spans: Any = None) -> Dict[str, Any]:
        busy = self.host.busy
        if busy is None:  # the baseline, alone before the others
            return {"status": "ok"}
        with busy.cond:
            seen.append((cfg["config_id"], set(busy.checks)))
        if cfg.get("pack_check_of"):
            assert other_started.wait(30), "no config started beside the pack check"
        else:
            other_started.set()
        return {"status": "ok"}

    monkeypatch.setattr(Suite, "run_config", run_config)
    assert Suite(plan, tmp_path / "results" / RUN_ID, invocation="inv").run() == 0
    first_two = seen[:2]  # started together, in either order
    assert {cid for cid, _ in first_two} >= {"tp1-autoregressive-packed"}, seen
    assert all(checks == {"tp1-autoregressive-packed"} for _, checks in first_two), seen

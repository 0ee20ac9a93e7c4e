"""The suite loop on one host: the ETA, which results are kept, a phase whose baseline fails, events in
order, resuming a run and forcing it, and a whole suite against the stand-in engine (tests/standin)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from agent.config_run import Result, config_digest, fresh_folder, record
from agent.records import Event, Outcome
from agent.store import HostStore, now_iso, write_json
from agent.suite import Eta, Suite, kept
from controller import matrix
from tests.agent.test_config_run import (
    ENGINE_VERSION,
    HOST,
    MAX_TOKENS,
    assert_contract,
    assert_no_secrets,
    suite,
    write_engine,
)

RUN_ID = "run-20250101T000000"


# -- Eta ----------------------------------------------------------------------------------------------
def test_eta_before_anything_is_done_is_the_plans_estimate() -> None:
    eta = Eta(600.0)
    assert eta.scale == 1.0 and eta.left() == 600.0


def test_eta_scales_what_is_left_by_how_the_done_configs_compared() -> None:
    eta = Eta(600.0)
    eta.done(100.0, 200.0)  # took twice its estimate
    assert eta.scale == 2.0 and eta.left() == pytest.approx((600 - 100) * 2.0)
    eta.done(300.0, 100.0)  # 400 estimated, 300 taken
    assert (eta.done_est, eta.done_actual) == (400.0, 300.0)
    assert eta.scale == pytest.approx(0.75) and eta.left() == pytest.approx(200 * 0.75)
    eta.done(200.0, 100.0)
    assert eta.left() == pytest.approx(0.0)


# -- kept ---------------------------------------------------------------------------------------------
def configs_of(python: str, **over: Any) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    checked = matrix.validate(suite(python, **over))
    return checked.suite, matrix.expand(checked)


def write_status(store: HostStore, cfg: Dict[str, Any], **fields: Any) -> None:
    status = {"config_id": cfg["config_id"], "status": "ok", "config_digest": config_digest(cfg), **fields}
    write_json(store.config_dir(cfg["config_id"]) / "status.json", status)


def test_kept_only_an_ok_result_of_the_same_config(tmp_path: Path) -> None:
    _, configs = configs_of("/py")
    cfg = configs[1]
    store = HostStore(tmp_path, HOST)
    assert not kept(store, cfg)
    write_status(store, cfg)
    assert kept(store, cfg)
    for status in ("failed", "skipped"):
        write_status(store, cfg, status=status)
        assert not kept(store, cfg)
    write_status(store, cfg, config_digest="0123456789abcdef")
    assert not kept(store, cfg)
    write_status(store, cfg)
    assert not kept(store, {**cfg, "method_params": {"num_speculative_tokens": 4}})
    assert kept(store, {**cfg, "estimate_s": 1.0})
    (store.config_dir(cfg["config_id"]) / "status.json").write_text('{"status": "ok", "config_di')  # torn
    assert not kept(store, cfg)


# -- Suite.run ----------------------------------------------------------------------------------------
def plan_for(python: str) -> Dict[str, Any]:
    """Two phases, each a baseline and ngram."""
    sweeps = [{"workloads": ["fib"], "max_tokens": [MAX_TOKENS], "concurrency": [1, 2]}]
    phases = [{"name": name, "sweeps": sweeps,
               "configs": [{"method": "autoregressive"}, {"method": "ngram", "num_speculative_tokens": k}]}
              for name, k in (("p1", 3), ("p2", 5))]
    full, configs = configs_of(python, phases=phases)
    return {"run_id": RUN_ID, "host": HOST, "suite": full, "configs": configs}


def read_events(root: Path) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in (root / HOST / "events.jsonl").read_text().splitlines()]


def statuses(root: Path) -> Dict[str, Dict[str, Any]]:
    return {p.parent.name: json.loads(p.read_text()) for p in (root / HOST).glob("*/status.json")}


def snapshot(folder: Path) -> Dict[str, Tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.iterdir()}


IDS = ["p1-autoregressive", "p1-ngram-k3", "p2-autoregressive", "p2-ngram-k5"]


def test_a_failed_baseline_skips_the_rest_of_its_phase(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-engine" / "bin" / "python")
    plan = plan_for(missing)
    assert [c["config_id"] for c in plan["configs"]] == IDS
    root = tmp_path / "results" / RUN_ID
    assert Suite(plan, root, invocation="inv-1").run() == 0
    got = statuses(root)
    assert sorted(got) == IDS
    for cid in ("p1-autoregressive", "p2-autoregressive"):  # each phase tries its own baseline
        assert (got[cid]["status"], got[cid]["reason"]) == ("failed", "engine_unavailable")
        assert missing in got[cid]["detail"]
    for cid, phase in (("p1-ngram-k3", "p1"), ("p2-ngram-k5", "p2")):
        assert (got[cid]["status"], got[cid]["reason"]) == ("skipped", "baseline_failed")
        assert phase in got[cid]["detail"]
    for cid in IDS:
        folder = root / HOST / cid
        assert {"config.json", "requests.jsonl", "status.json", "server.log"} <= {p.name for p in folder.iterdir()}
        assert_contract(folder, cid)
    ev = read_events(root)
    assert [(e["event"], e.get("config_id")) for e in ev] == (
        [("suite_start", None)]
        + [(kind, cid) for cid in IDS for kind in ("config_start", "config_end")]
        + [("suite_end", None)])
    assert {e["invocation"] for e in ev} == {"inv-1"}
    assert ev[0]["n"] == 4 and ev[0]["run_id"] == RUN_ID
    assert ev[0]["estimate_s"] == pytest.approx(sum(c["estimate_s"] for c in plan["configs"]))
    ends = [e for e in ev if e["event"] == "config_end"]
    assert [(e["k"], e["n"], e["status"], e["reason"]) for e in ends] == [
        (1, 4, "failed", "engine_unavailable"), (2, 4, "skipped", "baseline_failed"),
        (3, 4, "failed", "engine_unavailable"), (4, 4, "skipped", "baseline_failed")]
    assert all(e["requests"] == 0 and e["ready_s"] is None for e in ends)
    host_json = json.loads((root / HOST / "host.json").read_text())
    assert host_json["host"] == HOST and host_json["engine"]["name"] == "vllm"
    assert "error" in host_json["engine"]  # the engine's Python could not be run
    assert host_json["gpus"]["count"] >= 0
    assert_no_secrets(root / HOST)


def test_resume_keeps_an_ok_config_and_force_runs_it_again(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-engine" / "bin" / "python")
    plan = plan_for(missing)
    root = tmp_path / "results" / RUN_ID
    first = Suite(plan, root, invocation="inv-1")
    baseline = plan["configs"][0]
    folder = fresh_folder(first.host.store, baseline["config_id"])
    record(first.host, baseline, Result(Outcome.OK, fields={"ready_s": 3.0}), folder, now_iso())
    before = snapshot(folder)

    Suite(plan, root, invocation="inv-2").run()
    ev = [e for e in read_events(root) if e["invocation"] == "inv-2"]
    assert [(e["event"], e.get("config_id")) for e in ev] == (
        [("suite_start", None), ("config_kept", "p1-autoregressive")]
        + [(kind, cid) for cid in IDS[1:] for kind in ("config_start", "config_end")] + [("suite_end", None)])
    assert ev[1]["k"] == 1 and ev[1]["n"] == 4
    assert snapshot(folder) == before
    assert not (root / HOST / ".previous").exists()
    got = statuses(root)
    assert got["p1-autoregressive"]["status"] == "ok"
    # with its baseline kept ok, the phase's other config is run, not skipped
    assert (got["p1-ngram-k3"]["status"], got["p1-ngram-k3"]["reason"]) == ("failed", "engine_unavailable")
    assert (got["p2-ngram-k5"]["status"], got["p2-ngram-k5"]["reason"]) == ("skipped", "baseline_failed")

    Suite(plan, root, force=True, invocation="inv-3").run()
    ev = [e for e in read_events(root) if e["invocation"] == "inv-3"]
    assert [e["event"] for e in ev].count("config_kept") == 0
    assert [e.get("config_id") for e in ev if e["event"] == "config_start"] == IDS
    got = statuses(root)
    assert (got["p1-autoregressive"]["status"], got["p1-autoregressive"]["reason"]) == ("failed",
                                                                                       "engine_unavailable")
    assert (got["p1-ngram-k3"]["status"], got["p1-ngram-k3"]["reason"]) == ("skipped", "baseline_failed")
    earlier = [p for p in (root / HOST / ".previous").iterdir() if p.name.startswith("p1-autoregressive.")]
    assert len(earlier) == 1 and json.loads((earlier[0] / "status.json").read_text())["status"] == "ok"


def test_an_ok_result_of_another_config_is_not_kept(tmp_path: Path) -> None:
    plan = plan_for(str(tmp_path / "no-engine" / "python"))
    root = tmp_path / "results" / RUN_ID
    store = HostStore(root, HOST)
    baseline = plan["configs"][0]
    write_status(store, {**baseline, "method_params": {"changed": 1}})  # made by an earlier matrix
    Suite(plan, root, invocation="inv-1").run()
    ev = read_events(root)
    assert "config_kept" not in [e["event"] for e in ev]
    assert statuses(root)["p1-autoregressive"]["status"] == "failed"


def test_a_whole_suite_against_a_real_server(tmp_path: Path) -> None:
    plan = plan_for(write_engine(tmp_path / "engine"))
    root = tmp_path / "results" / RUN_ID
    Suite(plan, root, invocation="inv-ok").run()
    got = statuses(root)
    assert {cid: s["status"] for cid, s in got.items()} == {cid: "ok" for cid in IDS}
    for cfg in plan["configs"]:
        _, status, rows = assert_contract(root / HOST / cfg["config_id"], cfg["config_id"])
        assert status["requests_ok"] == cfg["requests"] == len(rows)
        assert all((r["accept_length"] is None) == (cfg["method"] == "autoregressive") for r in rows)
    ev = read_events(root)
    per_config = [(e["event"], e["config_id"]) for e in ev if e["event"].startswith("config_")]
    assert per_config == [(kind, cid) for cid in IDS for kind in ("config_start", "config_ready", "config_end")]
    assert [e["event"] for e in ev][0] == Event.SUITE_START.value and ev[-1]["event"] == Event.SUITE_END.value
    ends = [e for e in ev if e["event"] == "config_end"]
    assert all(e["status"] == "ok" and e["requests_ok"] == e["requests"] > 0 and e["ready_s"] > 0 for e in ends)
    # the ETA of each config is what the plan said of the rest, scaled by how long the configs done so far took
    # against their estimates (their durations as config_end says them, to 0.01 s)
    starts = [e for e in ev if e["event"] == "config_start"]
    assert starts[0]["eta_s"] == pytest.approx(ev[0]["estimate_s"])
    estimate = {c["config_id"]: c["estimate_s"] for c in plan["configs"]}
    for k, start in enumerate(starts[1:], 1):
        done = [estimate[cid] for cid in IDS[:k]]
        took = [e["duration_s"] for e in ends[:k]]
        left = ev[0]["estimate_s"] - sum(done)
        assert start["eta_s"] == pytest.approx(left * sum(took) / sum(done), abs=left / sum(done) * 0.006 * k), k
    host_json = json.loads((root / HOST / "host.json").read_text())
    assert host_json["engine"]["version"] == ENGINE_VERSION and host_json["engine"]["distribution"] == "vllm"
    assert_no_secrets(root / HOST)  # server.log of each config, events, host.json
    # a second start keeps every config
    Suite(plan, root, invocation="inv-again").run()
    again = [e["event"] for e in read_events(root) if e["invocation"] == "inv-again"]
    assert again == ["suite_start"] + ["config_kept"] * len(IDS) + ["suite_end"]


def test_the_plans_engine_help_is_used_instead_of_a_second_help_run(tmp_path: Path) -> None:
    """The plan's probe already read `--help`: the agent takes its flags when they are of the same interpreter and
    module (here the interpreter does not even exist, so a help run would fail)."""
    missing = str(tmp_path / "no-engine" / "bin" / "python")
    plan = plan_for(missing)
    module = "vllm.entrypoints.openai.api_server"
    plan["engine_help"] = {"python": missing, "module": module, "version": "0.0.1", "flags": ["--help", "--model"],
                           "choices": {"--dtype": ["auto", "bfloat16"]}}
    host = Suite(plan, tmp_path / "r").host
    assert host.flags == {"--help", "--model"} and host.choices == {"--dtype": ["auto", "bfloat16"]}
    plan["engine_help"]["python"] = "/other/python"
    assert Suite(plan, tmp_path / "r2").host.flags is None

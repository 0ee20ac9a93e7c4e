"""Packing for real on this machine: `bench.yml -l local-llamacpp` with two CPU slots of one core each and the pack
check, llama.cpp's server (`make llamacpp`) as every server: packing is the agent's, whatever the engine (each
server is started under `taskset`), and llama.cpp's servers start in a second where vLLM's take half a minute. The
baseline runs alone, then the other config and the pack check (the baseline again, packed) two at a time, each server
held by the kernel to its slot's core; every record names its slot and neighbours and the report marks packed
cells."""
from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Any

import pytest

from .conftest import Bench, reduced_matrix

CPUS = sorted(os.sched_getaffinity(0))
HOST = "local-llamacpp"
pytestmark = [pytest.mark.skipif(len(CPUS) < 2, reason="two CPU slots need two CPUs"),
              pytest.mark.engine("llamacpp")]


def test_a_packed_suite_on_two_cpu_slots(bench: Bench) -> None:
    run = "it-packed"
    configs = [{"method": "autoregressive"}, {"method": "ngram", "num_speculative_tokens": 2}]
    extra: dict[str, Any] = {**reduced_matrix(configs), "run_id": run, "bench_pack": "true",
                             "bench_pack_check": True, "bench_slots": [{"cpus": str(c)} for c in CPUS[:2]]}
    res = bench.run(extra, limit=HOST, timeout=900)
    assert res.returncode == 0, res.stdout[-4000:]
    out = res.stdout
    ids = ["tp1-autoregressive", "tp1-autoregressive-packed", "tp1-ngram-k2"]
    host = bench.results / run / HOST
    status = {cid: json.loads((host / cid / "status.json").read_text()) for cid in ids}
    assert {cid: s["status"] for cid, s in status.items()} == {cid: "ok" for cid in ids}
    events = bench.events(run, HOST)
    order = [(e["event"], e["config_id"]) for e in events if e["event"] in ("config_start", "config_end")]
    assert order[:2] == [("config_start", "tp1-autoregressive"), ("config_end", "tp1-autoregressive")]
    running = most = 0
    for kind, _ in order:
        running += 1 if kind == "config_start" else -1
        most = max(most, running)
    assert most == 2
    for cid in ids:
        slot = status[cid]["slot"]
        assert slot["cpus"] == str(CPUS[slot["index"]]) and slot["cpus_seen"] == slot["cpus"], (cid, slot)
    assert status["tp1-autoregressive"]["slot"]["index"] == 0 and status["tp1-autoregressive"]["neighbours"] == []
    for cid in ids[1:]:
        assert status[cid]["neighbours"], cid
    # the pack check and its neighbour start their timed requests together: neither before the other was up (how
    # long their timed windows then overlap is the engines' pace on this machine)
    up = {e["config_id"]: datetime.fromisoformat(e["t"]).timestamp() for e in events if e["event"] == "config_ready"}
    for cid, other in (ids[1:], ids[:0:-1]):
        assert status[cid]["timed_window"][0] >= up[other] - 1e-3, (cid, status[cid]["timed_window"], other, up)
    # the report flags the cells measured beside a neighbour, never the baseline measured alone, and sets the
    # baseline alone against packed
    flagged = {(r["config_id"], "packed" in r["flags"].split(",")) for r in
               json.loads((bench.results / run / "report.json").read_text())["rows"]}
    assert flagged == {("tp1-autoregressive", False), ("tp1-ngram-k2", True)}, flagged
    assert "## Baseline alone vs packed" in (bench.results / run / "report.md").read_text()
    # the progress lines name the slot of each packed config, and where it ended
    assert "tp1-ngram-k2  slot " in out and "tp1-autoregressive-packed (slot " in out
    print(f"packed on CPUs {CPUS[:2]}: " + "; ".join(
        f"{cid} slot {status[cid]['slot']['index']} wall {status[cid]['wall_s']} s" for cid in ids))

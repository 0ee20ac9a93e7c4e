"""Estimates from evidence: earlier ok runs of the same host and kind of config (engine, model, tp, method and
parameters) give startup and decode speed; without them the profile, its tok/s scaled by √tp."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from agent.store import write_json, write_jsonl
from controller import estimate, matrix, plan

SUITE = {"engine": "vllm", "engine_python": "/py", "gpu_count": 4, "model": {"name": "m", "path": "/m"},
         "estimate": {"startup_s": 100, "tok_s": 20, "prefill_tok_s": 1000},
         "phases": [{"name": "tp1", "configs": [{"method": "autoregressive"},
                                                {"method": "ngram", "num_speculative_tokens": 3}],
                     "sweeps": [{"workloads": ["fib"], "max_tokens": [100], "repetitions": 2}]},
                    {"name": "tp4", "tp": 4, "configs": [{"method": "autoregressive"}],
                     "sweeps": [{"workloads": ["fib"], "max_tokens": [100], "repetitions": 2}]}]}


def configs() -> list[dict[str, Any]]:
    return matrix.expand(SUITE)


def write_result(root: Path, run_id: str, cfg: dict[str, Any], status: str = "ok", ready_s: float = 30.0,
                 decode: float = 50.0, finished_at: str = "2026-12-01T10:00:00+00:00") -> Path:
    d = root / run_id / "h1" / cfg["config_id"]
    write_json(d / "config.json", {k: v for k, v in cfg.items() if k not in ("command", "env", "prompts")})
    write_json(d / "status.json", {"config_id": cfg["config_id"], "status": status, "ready_s": ready_s,
                                   "finished_at": finished_at})
    rows = [{"host": "h1", "config_id": cfg["config_id"], "method": cfg["method"],
             "method_params": cfg["method_params"], "tp": cfg["tp"], "workload": "fib", "max_tokens": 100,
             "context_tokens": 0, "concurrency": c, "rep": 0, "ok": True, "output_tok_s": decode / 2,
             "decode_tok_s": decode * (1 if c == 1 else 10)} for c in (1, 1, 4)]
    write_jsonl(d / "requests.jsonl", rows)
    return d


def test_the_newest_ok_run_of_the_same_kind_is_the_evidence(tmp_path: Path) -> None:
    base, ngram, tp4 = configs()
    write_result(tmp_path, "r1", base, ready_s=40, decode=30, finished_at="2026-11-01T00:00:00+00:00")
    write_result(tmp_path, "r2", base, ready_s=25, decode=60, finished_at="2026-11-20T00:00:00+00:00")
    write_result(tmp_path, "r3", base, status="failed", ready_s=1, decode=999, finished_at="2026-11-30T00:00:00+00:00")
    broken = write_result(tmp_path, "r4", ngram, finished_at="2026-11-30T00:00:00+00:00")
    (broken / "requests.jsonl").write_text("{not json\n")
    found = estimate.history(tmp_path, "h1")
    assert found == {estimate.kind(base): estimate.Evidence("r2", 25.0, 60.0)}  # concurrency 1 speeds only
    assert estimate.history(tmp_path, "other-host") == {} and estimate.history(tmp_path / "none", "h1") == {}


def test_apply_uses_the_evidence_else_the_profile_scaled_by_tp(tmp_path: Path) -> None:
    base, ngram, tp4 = configs()
    write_result(tmp_path, "r2", base, ready_s=25, decode=50)
    estimate.apply([base, ngram, tp4], SUITE["estimate"], estimate.history(tmp_path, "h1"))
    assert base["estimate_s"] == pytest.approx(25 + 2 * 100 / 50, abs=0.1)
    assert base["estimate_source"] == "measured in run r2: ready 25 s, 50.0 tok/s"
    assert ngram["estimate_s"] == pytest.approx(100 + 2 * 100 / 20, abs=0.1)
    assert ngram["estimate_source"] == "profile: 20 tok/s × √tp 1"
    assert tp4["estimate_s"] == pytest.approx(100 + 2 * 100 / (20 * math.sqrt(4)), abs=0.1)
    assert tp4["estimate_source"] == "profile: 20 tok/s × √tp 4"


def test_the_plan_says_where_each_estimate_came_from(tmp_path: Path) -> None:
    base = configs()[0]
    write_result(tmp_path, "r2", base, ready_s=25, decode=50)
    args = {"suite": SUITE, "run_id": "r9", "host_dir": "/var/lib/specfleet", "results": str(tmp_path)}
    res = plan.build(args, {"inventory_hostname": "h1"})
    assert not res.get("failed"), res.get("msg")
    text = "\n".join(res["plan_lines"])
    assert "tp1-autoregressive  (vllm, autoregressive , tp 1): 2 requests in 1 cells, ~0:00:29 (measured in run r2" \
        in text
    assert "(profile: 20 tok/s × √tp 4)" in text
    assert res["estimate_s"] == sum(c["estimate_s"] for c in res["configs"])

"""`ansible-playbook bench.yml -l local` on a reduced matrix: the results contract, then a resume."""
from __future__ import annotations

import csv
import hashlib
import io
import json
from pathlib import Path

import pytest

from .conftest import Bench, reduced_matrix

RUN = "it-contract"
MATRIX = reduced_matrix([{"method": "autoregressive"}, {"method": "ngram", "num_speculative_tokens": 2}])
CONFIGS = ["tp1-autoregressive", "tp1-ngram-k2"]
ROW_TYPES = {"host": str, "config_id": str, "method": str, "method_params": dict, "tp": int, "workload": str,
             "max_tokens": int, "context_tokens": int, "concurrency": int, "rep": int, "prompt_tokens": int,
             "completion_tokens": int, "ttft_s": float, "e2e_s": float, "output_tok_s": float, "ok": bool}
TABLE_COLUMNS = ["host", "engine", "model", "tp", "workload", "max_tokens", "context_tokens", "concurrency",
                 "config_id", "method", "n", "tok_s_mean", "tok_s_std", "speedup", "speedup_ci_low",
                 "speedup_ci_high", "accept_length_mean", "status"]


@pytest.fixture(scope="module")
def first_run(module_bench: Bench):
    res = module_bench.run({**MATRIX, "run_id": RUN})
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    return res


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_progress_and_report_on_the_console(first_run) -> None:
    out = first_run.stdout
    assert "local: [1/2] tp1-autoregressive  elapsed 0:00:" in out and "ETA" in out
    assert "local: [2/2] tp1-ngram-k2" in out
    assert "fib: " in out and " tok/s" in out and "± " in out  # the hand-run line style
    assert "speedup_ci_low" in out


def test_results_follow_the_contract(first_run, module_bench: Bench) -> None:
    run_dir = module_bench.results / RUN
    meta = json.loads((run_dir / "run.json").read_text())
    for key in ("run_id", "started_at", "finished_at", "project_version", "suite", "schema_version"):
        assert key in meta, key
    assert meta["run_id"] == RUN and meta["finished_at"]
    host = json.loads((run_dir / "local/host.json").read_text())
    assert host["engine"]["name"] == "vllm" and host["engine"]["version"] == "0.32.0"
    assert host["cpu"]["count"] >= 1 and host["gpus"]["count"] == 0 and host["model"]["digest"]
    for cid in CONFIGS:
        d = run_dir / "local" / cid
        status = json.loads((d / "status.json").read_text())
        assert status["status"] == "ok", status
        assert status["ready_s"] > 1 and status["started_at"] and status["finished_at"]
        config = json.loads((d / "config.json").read_text())
        assert config["command"][config["command"].index("--host") + 1] == "127.0.0.1"
        assert "{port}" not in config["command"] and config["environment"]["HF_HUB_OFFLINE"] == "1"
        assert "Application startup complete" in (d / "server.log").read_text()
        rows = [json.loads(line) for line in (d / "requests.jsonl").read_text().splitlines()]
        assert len(rows) == 2 * 2 * (1 + 2) * 2  # workloads x contexts x (c1 + c2 requests) x reps
        for r in rows:
            for key, typ in ROW_TYPES.items():
                assert isinstance(r[key], typ), (key, r[key])
            assert r["ok"] and r["error"] is None and r["config_id"] == cid
            assert r["completion_tokens"] == 32  # ignore_eos: exactly max_tokens, counted by the server
            if r["context_tokens"]:
                assert r["prompt_tokens"] == 256  # built to size with the server's tokenizer
            assert (r["accept_length"] is None) == (cid == "tp1-autoregressive")
            assert r["output_tok_s"] == pytest.approx(r["completion_tokens"] / r["e2e_s"])
        assert {(r["concurrency"], r["rep"]) for r in rows} == {(1, 0), (1, 1), (2, 0), (2, 1)}


def test_speedup_table(first_run, module_bench: Bench) -> None:
    run_dir = module_bench.results / RUN
    table = list(csv.DictReader(io.StringIO((run_dir / "report.csv").read_text())))
    assert list(table[0])[:len(TABLE_COLUMNS)] != [] and set(TABLE_COLUMNS) <= set(table[0])
    assert len(table) == 2 * 8  # 2 configs x (2 workloads x 2 contexts x 2 concurrencies)
    base = [r for r in table if r["method"] == "autoregressive"]
    assert all(float(r["speedup"]) == 1.0 and r["status"] == "ok" for r in base)
    spec = [r for r in table if r["method"] == "ngram"]
    assert all(float(r["speedup_ci_low"]) <= float(r["speedup"]) <= float(r["speedup_ci_high"]) for r in spec)
    assert all(float(r["accept_length_mean"]) >= 1.0 for r in spec)
    assert (run_dir / "report.md").exists() and json.loads((run_dir / "report.json").read_text())["rows"]


def test_second_run_with_the_same_id_reruns_nothing(first_run, module_bench: Bench) -> None:
    host_run = module_bench.host_run(RUN)
    before = {cid: digest(host_run / cid / "requests.jsonl") for cid in CONFIGS}
    res = module_bench.run({**MATRIX, "run_id": RUN})
    assert res.returncode == 0, res.stdout[-3000:]
    assert "[1/2] tp1-autoregressive  already ok in this run, kept" in res.stdout
    assert "[2/2] tp1-ngram-k2  already ok in this run, kept" in res.stdout
    last = [e for e in module_bench.events(RUN) if e["invocation"] == module_bench.events(RUN)[-1]["invocation"]]
    assert [e["event"] for e in last] == ["suite_start", "config_kept", "config_kept", "suite_end"]
    assert {cid: digest(host_run / cid / "requests.jsonl") for cid in CONFIGS} == before
    assert not (host_run / ".previous").exists()

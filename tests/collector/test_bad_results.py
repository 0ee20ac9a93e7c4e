"""Damaged results: the collector names the file (and line) of each damage, skips it, and reports the rest.

The run folder is written the way the agent writes it (results contract): configs resolved by `matrix.expand`,
config.json / status.json / requests.jsonl through the agent's own atomic writers and field sets, one host.json
per host, run.json from `collector stamp`. Each case damages one thing; the table must then hold exactly the
intact rows, with the right n and mean.
"""
from __future__ import annotations

import csv
import io
import json
import math
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from agent.store import redact_argv, redact_env, write_json, write_jsonl
from collector.__main__ import main as collector_main
from collector.load import load_run
from collector.tables.speedup import table
from controller import matrix

REPO = Path(__file__).resolve().parents[2]
SUITE: dict[str, Any] = {
    "suite_name": "bad-results", "engine": "vllm", "engine_python": "/opt/engine/bin/python", "gpu_count": 0,
    "model": {"name": "tiny-llama", "path": "/models/target", "revision": "seeded", "max_model_len": 1024},
    "env": {"HF_HUB_OFFLINE": "1"},
    "phases": [{"name": "tp1",
                "configs": [{"method": "autoregressive"}, {"method": "ngram", "num_speculative_tokens": 2}],
                "sweeps": [{"workloads": ["fib", "json"], "max_tokens": [64], "repetitions": 3}]}],
}
BASE, NGRAM = "tp1-autoregressive", "tp1-ngram-k2"
# output_tok_s per host, config and workload, repetitions 0, 1, 2; h2 runs twice as fast as h1
TOK = {("h1", BASE, "fib"): [10.0, 12.0, 14.0], ("h1", BASE, "json"): [20.0, 22.0, 24.0],
       ("h1", NGRAM, "fib"): [15.0, 18.0, 21.0], ("h1", NGRAM, "json"): [30.0, 33.0, 36.0]}
TOK.update({("h2", c, w): [2 * v for v in vs] for (_, c, w), vs in list(TOK.items())})

Key = tuple[str, str, str]  # host, config_id, workload
Row = tuple[int, Optional[float], str, Optional[float]]  # n, tok_s_mean, status, speedup
Summary = dict[Key, Row]


def line_of(rep: int, workload: str) -> int:
    """requests.jsonl holds repetition by repetition, cell by cell (fib, then json), as the agent writes it."""
    return rep * 2 + ["fib", "json"].index(workload) + 1


def write_run(root: Path) -> Path:
    run_dir = root / "results" / "run-bad"
    configs = matrix.expand(SUITE)
    for host in ("h1", "h2"):
        write_json(run_dir / host / "host.json", {
            "host": host, "hostname": host, "os": "Debian GNU/Linux 12", "kernel": "6.1.0", "arch": "x86_64",
            "cpu": {"model": "x86", "cores": 2}, "memory_total_mib": 8000, "gpus": {"count": 0, "devices": []},
            "engine": {"name": "vllm", "version": "0.11.0", "patches": [], "build": None}, "agent_python": "3.11.2",
            "model": {**SUITE["model"], "digest": "sha256:0"}})
        for cfg in configs:
            d = run_dir / host / cfg["config_id"]
            config = {k: v for k, v in cfg.items() if k not in ("command", "env", "prompts")}
            config.update(command=redact_argv(cfg["command"]), environment=redact_env(cfg["env"]), host=host,
                          engine_version="0.11.0")
            write_json(d / "config.json", config)
            identity = {"host": host, "config_id": cfg["config_id"], "method": cfg["method"],
                        "method_params": cfg["method_params"], "tp": cfg["tp"], "engine": cfg["engine"],
                        "model": cfg["model"]["name"], "phase": cfg["phase"]}
            rows = []
            for rep in range(3):
                for cell in cfg["cells"]:
                    tok = TOK[(host, cfg["config_id"], cell["workload"])][rep]
                    e2e = cell["max_tokens"] / tok
                    rows.append({**identity, "workload": cell["workload"], "max_tokens": cell["max_tokens"],
                                 "context_tokens": cell["context_tokens"], "concurrency": cell["concurrency"],
                                 "rep": rep, "prompt_tokens": 40, "completion_tokens": cell["max_tokens"],
                                 "ttft_s": 0.05, "e2e_s": e2e, "output_tok_s": tok,
                                 "decode_tok_s": (cell["max_tokens"] - 1) / (e2e - 0.05), "itl_mean_s": 0.01,
                                 "itl_p50_s": 0.01, "chunks": cell["max_tokens"], "finish_reason": "length",
                                 "accept_length": None if cfg["method"] == "autoregressive" else 1.8,
                                 "ok": True, "error": None})
            write_jsonl(d / "requests.jsonl", rows)
            (d / "server.log").write_text("INFO: Application startup complete.\n")
            write_json(d / "status.json", {
                "config_id": cfg["config_id"], "status": "ok", "reason": None, "config_digest": "0" * 16,
                "detail": None, "log_tail": "", "started_at": "2026-12-01T10:00:00.000+00:00",
                "finished_at": "2026-12-01T10:02:00.000+00:00", "ready_s": 20.5, "wall_s": 120.0, "timed_s": 90.0,
                "requests": len(rows), "requests_ok": len(rows)})
    assert collector_main(["stamp", str(run_dir), "start", "--suite", "bad-results", "--hosts", "h1", "h2"]) == 0
    assert collector_main(["stamp", str(run_dir), "finish", "--suite", "bad-results", "--hosts", "h1", "h2"]) == 0
    return run_dir


def intact() -> dict[Key, tuple[int, Optional[float], str]]:
    return {k: (3, sum(v) / 3, "ok") for k, v in TOK.items()}


def with_speedups(rows: dict[Key, tuple[int, Optional[float], str]]) -> Summary:
    """The expected speedup of each row: its mean over the same host and workload's baseline mean."""
    out: Summary = {}
    for (host, cid, w), (n, m, status) in rows.items():
        base = rows.get((host, BASE, w))
        speedup = m / base[1] if m is not None and base is not None and base[1] is not None else None
        out[(host, cid, w)] = (n, m, status, speedup)
    return out


def _num(v: Any) -> Optional[float]:
    if v is None or v == "" or (isinstance(v, float) and math.isnan(v)):
        return None
    return float(v)


def summary_of(records: list[dict[str, Any]]) -> Summary:
    out: Summary = {}
    for r in records:
        key = (r["host"], r["config_id"], r["workload"])
        assert key not in out, f"two rows for {key}"
        out[key] = (int(r["n"]), _num(r["tok_s_mean"]), r["status"], _num(r["speedup"]))
    return out


def summary_of_csv(text: str) -> Summary:
    return summary_of(list(csv.DictReader(io.StringIO(text))))


def assert_same(got: Summary, rows: dict[Key, tuple[int, Optional[float], str]]) -> None:
    want = with_speedups(rows)
    assert set(got) == set(want), f"rows {sorted(set(got) ^ set(want))} differ"
    for k, (n, mean, status, speedup) in want.items():
        g = got[k]
        assert (g[0], g[2]) == (n, status), f"{k}: got {g}, want {want[k]}"
        for got_v, want_v in ((g[1], mean), (g[3], speedup)):
            assert (got_v is None) == (want_v is None), f"{k}: got {g}, want {want[k]}"
            # abs: the csv has 4 decimals
            assert want_v is None or got_v == pytest.approx(want_v, abs=1e-4), f"{k}: got {g}, want {want[k]}"


# ---------------------------------------------------------------------------------------------------------------
# Damages
# ---------------------------------------------------------------------------------------------------------------

def edit_line(host: str, cid: str, n: int, change: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    """Replace line `n` of a requests.jsonl by change(row): a dict is dumped as JSON, str/bytes written raw."""
    def apply(run_dir: Path) -> None:
        path = run_dir / host / cid / "requests.jsonl"
        lines = path.read_bytes().splitlines()
        new = change(json.loads(lines[n - 1]))
        lines[n - 1] = new if isinstance(new, bytes) else (new if isinstance(new, str) else json.dumps(new)).encode()
        path.write_bytes(b"\n".join(lines) + b"\n")
    return apply


def without(key: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda row: {k: v for k, v in row.items() if k != key}


def setting(key: str, value: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda row: {**row, key: value}


def truncate_last_line(host: str, cid: str) -> Callable[[Path], None]:
    """The last line cut short with no newline: a copy or a disk that stopped mid-write."""
    def apply(run_dir: Path) -> None:
        path = run_dir / host / cid / "requests.jsonl"
        data = path.read_bytes().rstrip(b"\n")
        path.write_bytes(data[:len(data) - 60])
    return apply


def write_file(rel: str, data: str) -> Callable[[Path], None]:
    return lambda run_dir: (run_dir / rel).write_text(data)


def remove(rel: str) -> Callable[[Path], None]:
    return lambda run_dir: (run_dir / rel).unlink()


def patch_json(rel: str, **fields: Any) -> Callable[[Path], None]:
    def apply(run_dir: Path) -> None:
        obj = json.loads((run_dir / rel).read_text())
        write_json(run_dir / rel, {**obj, **fields})
    return apply


@dataclass
class Damage:
    apply: Callable[[Path], None]
    file: str  # relative to the run folder
    line: Optional[int]  # the line the problem names, or None for a whole file
    reason: str  # text the problem holds
    changes: dict[Key, Optional[tuple[int, Optional[float], str]]] = field(default_factory=dict)  # None: no row

    def expected(self) -> dict[Key, tuple[int, Optional[float], str]]:
        want = intact()
        for k, v in self.changes.items():
            if v is None:
                del want[k]
            else:
                want[k] = v
        return want


def gone(host: str, cid: str) -> dict[Key, None]:
    return {(host, cid, w): None for w in ("fib", "json")}


def no_data(host: str, cid: str) -> dict[Key, tuple[int, None, str]]:
    return {(host, cid, w): (0, None, "no_data") for w in ("fib", "json")}


def mean(*v: float) -> float:
    return sum(v) / len(v)


BAD_STATUS = '{\n  "config_id": "tp1-ngram-k2",\n  "status": "ok",\n  "reason": nul\n}\n'
DAMAGES = [
    pytest.param(Damage(truncate_last_line("h1", NGRAM), f"h1/{NGRAM}/requests.jsonl", line_of(2, "json"),
                        "malformed JSON", {("h1", NGRAM, "json"): (2, mean(30, 33), "ok")}), id="truncated-last-line"),
    pytest.param(Damage(edit_line("h1", BASE, line_of(0, "fib"), without("workload")), f"h1/{BASE}/requests.jsonl",
                        1, "missing field 'workload'", {("h1", BASE, "fib"): (2, mean(12, 14), "ok")}),
                 id="line-missing-workload"),
    pytest.param(Damage(edit_line("h1", BASE, line_of(0, "json"), without("ok")), f"h1/{BASE}/requests.jsonl", 2,
                        "missing field 'ok'", {("h1", BASE, "json"): (2, mean(22, 24), "ok")}), id="line-missing-ok"),
    pytest.param(Damage(edit_line("h1", BASE, line_of(1, "json"), setting("concurrency", "1")),
                        f"h1/{BASE}/requests.jsonl", 4, "field 'concurrency' should be an integer, got '1'",
                        {("h1", BASE, "json"): (2, mean(20, 24), "ok")}), id="line-concurrency-string"),
    pytest.param(Damage(edit_line("h1", NGRAM, line_of(2, "fib"), setting("output_tok_s", "fast")),
                        f"h1/{NGRAM}/requests.jsonl", 5, "field 'output_tok_s' should be a finite number or null",
                        {("h1", NGRAM, "fib"): (2, mean(15, 18), "ok")}), id="line-tok_s-string"),
    pytest.param(Damage(edit_line("h1", BASE, line_of(1, "fib"), setting("ok", "true")), f"h1/{BASE}/requests.jsonl",
                        3, "field 'ok' should be a boolean, got", {("h1", BASE, "fib"): (2, mean(10, 14), "ok")}),
                 id="line-ok-string"),
    pytest.param(Damage(edit_line("h1", BASE, line_of(2, "json"),
                                  lambda row: json.dumps({**row, "output_tok_s": float("nan")})),
                        f"h1/{BASE}/requests.jsonl", 6, "should be a finite number or null, got nan",
                        {("h1", BASE, "json"): (2, mean(20, 22), "ok")}), id="line-tok_s-nan"),
    pytest.param(Damage(edit_line("h1", BASE, line_of(0, "json"), lambda row: "[1, 2, 3]"),
                        f"h1/{BASE}/requests.jsonl", 2, "not a JSON object (got list)",
                        {("h1", BASE, "json"): (2, mean(22, 24), "ok")}), id="line-not-an-object"),
    pytest.param(Damage(edit_line("h1", BASE, line_of(2, "fib"), lambda row: b"\xff\xfe\x00garbage"),
                        f"h1/{BASE}/requests.jsonl", 5, "malformed JSON",
                        {("h1", BASE, "fib"): (2, mean(10, 12), "ok")}), id="line-binary-garbage"),
    pytest.param(Damage(edit_line("h1", NGRAM, line_of(0, "fib"), setting("config_id", BASE)),
                        f"h1/{NGRAM}/requests.jsonl", 1, f"config_id '{BASE}' is not its folder's ('{NGRAM}')",
                        {("h1", NGRAM, "fib"): (2, mean(18, 21), "ok")}), id="line-of-another-config"),
    pytest.param(Damage(edit_line("h2", NGRAM, line_of(1, "fib"), without("output_tok_s")),
                        f"h2/{NGRAM}/requests.jsonl", 3, "ok request without output_tok_s",
                        {("h2", NGRAM, "fib"): (2, mean(30, 42), "ok")}), id="ok-line-without-tok_s"),
    pytest.param(Damage(write_file(f"h1/{NGRAM}/requests.jsonl", ""), f"h1/{NGRAM}/requests.jsonl", None,
                        "empty, though status.json says ok", no_data("h1", NGRAM)), id="empty-requests-file"),
    pytest.param(Damage(remove(f"h1/{NGRAM}/requests.jsonl"), f"h1/{NGRAM}/requests.jsonl", None,
                        "missing, though status.json says ok", no_data("h1", NGRAM)), id="missing-requests-file"),
    pytest.param(Damage(remove(f"h1/{NGRAM}/status.json"), f"h1/{NGRAM}/status.json", None,
                        "missing (config incomplete or interrupted); config skipped", gone("h1", NGRAM)),
                 id="config-without-status"),
    pytest.param(Damage(patch_json(f"h2/{BASE}/status.json", status="running"), f"h2/{BASE}/status.json", None,
                        "status 'running' is not ok|failed|skipped; config skipped",
                        gone("h2", BASE)), id="status-bad-value"),
    pytest.param(Damage(write_file(f"h1/{NGRAM}/status.json", BAD_STATUS), f"h1/{NGRAM}/status.json", 4,
                        "malformed JSON", gone("h1", NGRAM)), id="status-malformed"),
    pytest.param(Damage(write_file(f"h1/{NGRAM}/status.json", '["ok"]'), f"h1/{NGRAM}/status.json", None,
                        "not a JSON object (got list); config skipped", gone("h1", NGRAM)), id="status-not-object"),
    pytest.param(Damage(write_file(f"h1/{NGRAM}/config.json", '{"engine": "vllm", "cells": ['),
                        f"h1/{NGRAM}/config.json", 1, "malformed JSON"), id="config-json-malformed"),
    pytest.param(Damage(remove("h2/host.json"), "h2/host.json", None,
                        "missing; host facts unknown; its configs are kept"), id="host-json-missing"),
    pytest.param(Damage(write_file("h2/host.json", '{"host": "h2", "gpus": {"count": '), "h2/host.json", 1,
                        "malformed JSON"), id="host-json-malformed"),
    pytest.param(Damage(write_file("run.json", '{"run_id": "run-bad",\n "started_at": 2026-12-01}'), "run.json", 2,
                        "malformed JSON"), id="run-json-malformed"),
    pytest.param(Damage(remove("run.json"), "run.json", None, "missing; run metadata unknown"), id="run-json-missing"),
]


def problem_for(problems: list[str], run_dir: Path, damage: Damage) -> str:
    """The one problem the damage causes; it names the file, and the line where there is one."""
    where = f"{run_dir / damage.file}:{damage.line}: " if damage.line else f"{run_dir / damage.file}: "
    assert len(problems) == 1, problems
    assert problems[0].startswith(where), (where, problems)
    assert damage.reason in problems[0], (damage.reason, problems)
    return problems[0]


def test_intact_run_has_no_problems_and_every_row(tmp_path: Path) -> None:
    """The control: the undamaged run loads without a problem and its table is the full expectation."""
    run = load_run(write_run(tmp_path))
    assert run.problems == []
    assert_same(summary_of(table(run).to_dict("records")), intact())
    assert run.meta["run_id"] == "run-bad" and set(run.hosts) == {"h1", "h2"}


@pytest.mark.parametrize("damage", DAMAGES)
def test_damage_is_named_skipped_and_the_rest_reported(tmp_path: Path, damage: Damage,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = write_run(tmp_path)
    damage.apply(run_dir)
    run = load_run(run_dir)
    problem = problem_for(run.problems, run_dir, damage)
    assert_same(summary_of(table(run).to_dict("records")), damage.expected())
    # the command line: the same problem as a warning on stderr, the same table on stdout
    assert collector_main(["report", str(run_dir), "--format", "csv"]) == 0
    out = capsys.readouterr()
    assert f"warning: {problem}" in out.err.splitlines()
    assert_same(summary_of_csv(out.out), damage.expected())


def test_all_damages_at_once_through_the_command_line(tmp_path: Path) -> None:
    """`python -m collector report` on a run with damage in every kind of file: every problem named on stderr
    and in the md report's problem list, every intact row in the csv."""
    run_dir = write_run(tmp_path)
    picked = {p.id: p.values[0] for p in DAMAGES}
    damages = [picked[i] for i in ("truncated-last-line", "line-missing-workload", "line-of-another-config",
                                   "status-bad-value", "host-json-malformed", "run-json-malformed")]
    want = intact()
    for d in damages:
        d.apply(run_dir)
        for k, v in d.changes.items():
            if v is None:
                want.pop(k, None)
            else:
                want[k] = v
    res = subprocess.run([sys.executable, "-m", "collector", "report", str(run_dir), "--format", "csv"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    warnings = [line for line in res.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == len(damages), warnings
    for d in damages:
        where = f"{run_dir / d.file}:{d.line}: " if d.line else f"{run_dir / d.file}: "
        assert any(w.startswith(f"warning: {where}") and d.reason in w for w in warnings), (where, warnings)
    assert_same(summary_of_csv(res.stdout), want)
    md = subprocess.run([sys.executable, "-m", "collector", "report", str(run_dir), "--format", "md"], cwd=REPO,
                        capture_output=True, text=True, timeout=60)
    assert md.returncode == 0, md.stderr
    assert md.stdout.startswith("# Run run-bad")  # run.json is damaged: the folder name stands in
    listed = md.stdout.split("## Problems in the results (skipped)", 1)[1]
    assert all(f"- {w.removeprefix('warning: ')}" in listed for w in warnings)


"""The report's flags and the figures beside tok/s: `suspect` (the server's counters disagree, with both figures),
`noisy` (cv above 5%), `cold_start`, time per output token, and each burst's aggregate tok/s with its speedup."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from collector.load import load_run
from collector.report import render
from collector.tables.speedup import bursts, table
from tests.collector.test_collector import FIB, MAX_TOKENS, cell, make_config, make_run, row


def patch_status(folder: Path, **fields: Any) -> None:
    path = folder / "status.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def rewrite_rows(folder: Path, change: Any) -> None:
    path = folder / "requests.jsonl"
    rows = [change(json.loads(line)) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


SUSPECT = {"verdict": "suspect", "generation_tokens": {"server": 192, "rows": 193, "ok": False},
           "why": "generation_tokens: server 192 vs rows 193"}


@pytest.fixture()
def run_dir(tmp_path: Path) -> Path:
    run = make_run(tmp_path)
    base = make_config(run, "h1", "tp1-autoregressive", method="autoregressive", cells=[cell("fib")],
                       samples={FIB: [10.0, 10.2, 9.9]})
    patch_status(base, counters={"verdict": "ok"}, cold_start={"first_ttft_s": 0.9, "cell_median_ttft_s": 0.01,
                                                                "ratio": 90.0, "outlier": True})
    spec = make_config(run, "h1", "tp1-ngram", method="ngram", method_params={"num_speculative_tokens": 2},
                       cells=[cell("fib")], samples={FIB: [20.0, 30.0, 25.0]})
    # gpu_state as agent.gpusample summarises the real H200 capture under load (SW power cap active)
    patch_status(spec, counters=SUSPECT, gpu_state={"samples": 15, "gpus": [], "throttled": [
        {"gpu": 0, "reason": "sw_power_cap", "kind": "power cap", "samples": 10, "of": 15}]})
    rewrite_rows(spec, lambda r: {**r, "tpot_s": 0.04})
    return run


def test_flags_and_their_figures(run_dir: Path) -> None:
    df = table(load_run(run_dir))
    base, spec = row(df, "h1", "tp1-autoregressive"), row(df, "h1", "tp1-ngram")
    assert base["flags"] == "cold_start" and "first TTFT 0.9 s vs cell median 0.01 s" in base["checks"]
    assert base["cv"] == pytest.approx(0.01531, abs=1e-4)                # 10.033 ± 0.153: not noisy
    assert spec["cv"] == pytest.approx(0.2) and spec["flags"] == "suspect,throttled,noisy"   # 25 ± 5
    assert spec["checks"] == ("counters: generation_tokens: server 192 vs rows 193; GPU 0 power cap (sw_power_cap) "
                              "in 10 of 15 samples")
    assert spec["tpot_mean_s"] == pytest.approx(0.04) and pd_na(base["tpot_mean_s"])
    md = render(load_run(run_dir), "md")
    assert "## Checks that did not pass" in md
    assert "- h1 tp1-ngram [suspect,throttled,noisy]: counters: generation_tokens: server 192 vs rows 193" in md
    assert "[suspect,throttled,noisy]" in md.split("```")[1]              # the hand-run lines say it too
    csv = render(load_run(run_dir), "csv").splitlines()
    assert ",cv,tpot_mean_s,burst_tok_s_mean,burst_speedup,burst_speedup_ci_low,burst_speedup_ci_high,flags,checks," \
        "ttft_p50_s," in csv[0]


def pd_na(v: Any) -> bool:
    return v is None or v != v


def test_a_burst_is_its_tokens_over_first_send_to_last_finish() -> None:
    rows = [{"rep": 0, "ok": True, "completion_tokens": 100, "sent_s": 0.0, "done_s": 2.0},
            {"rep": 0, "ok": True, "completion_tokens": 100, "sent_s": 0.1, "done_s": 4.0},
            {"rep": 1, "ok": True, "completion_tokens": 100, "sent_s": 5.0, "done_s": 6.0},
            {"rep": 1, "ok": True, "completion_tokens": 100, "sent_s": 5.0, "done_s": 7.0},
            {"rep": 2, "ok": False, "completion_tokens": None, "sent_s": 8.0, "done_s": 9.0},
            {"rep": 2, "ok": True, "completion_tokens": 100, "sent_s": 8.0, "done_s": 9.0}]
    assert bursts(rows) == [50.0, 100.0]                          # a burst with a failed request is not one
    assert bursts([{"rep": 0, "ok": True, "completion_tokens": 9}]) == []   # rows without times (older runs)


def test_burst_throughput_and_its_speedup_at_concurrency(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    c4 = ("fib", MAX_TOKENS, 0, 4)

    def timed(per_burst_s: dict[int, float]) -> Any:
        def change(r: dict[str, Any]) -> dict[str, Any]:
            return {**r, "sent_s": float(r["rep"] * 100), "done_s": r["rep"] * 100 + per_burst_s[r["rep"] % 2]}
        return change
    base = make_config(run, "h1", "tp1-autoregressive", method="autoregressive", cells=[cell("fib", concurrency=4)],
                       samples={c4: [10.0] * 8})
    spec = make_config(run, "h1", "tp1-ngram", method="ngram", method_params={"num_speculative_tokens": 2},
                       cells=[cell("fib", concurrency=4)], samples={c4: [20.0] * 8})
    for folder, seconds in ((base, {0: 4.0, 1: 5.0}), (spec, {0: 8.0, 1: 8.0})):
        # make_config numbers the rows 0..7 as repetitions: regroup them into two bursts of four
        rewrite_rows(folder, lambda r: {**r, "rep": r["rep"] // 4})
        rewrite_rows(folder, timed(seconds))
    df = table(load_run(run))
    b, s = row(df, "h1", "tp1-autoregressive", concurrency=4), row(df, "h1", "tp1-ngram", concurrency=4)
    tokens = 4 * MAX_TOKENS
    assert b["burst_tok_s_mean"] == pytest.approx((tokens / 4 + tokens / 5) / 2)
    assert s["burst_tok_s_mean"] == pytest.approx(tokens / 8)
    # per request the method is 2x faster; what the server delivers per burst is lower: the crossover
    assert s["speedup"] == pytest.approx(2.0)
    assert s["burst_speedup"] == pytest.approx((tokens / 8) / ((tokens / 4 + tokens / 5) / 2))
    assert s["burst_speedup"] < 1 and s["burst_speedup_ci_low"] < s["burst_speedup_ci_high"]

"""SGLang's path end to end on this machine: `bench.yml -l local` with `bench_engine: sglang` and ct200's methods
(the baseline, DFlash on both scheduling paths, DDTree budgets) and server flags, served by the stand-in engine's
SGLang dialect (SGLang itself runs on GPUs only). The agent renders SGLang's flags, checks them against the
stand-in's `--help`, reads `/generate`'s `meta_info` and `/metrics`, and the collector makes the DDTree table."""
from __future__ import annotations

import json

import pytest

from .conftest import Bench

CT200_ARGS = ["--mem-fraction-static", "0.80", "--attention-backend", "flashinfer", "--disable-radix-cache",
              "--trust-remote-code", "--enable-metrics"]


def test_the_sglang_methods_of_ct200_run_end_to_end(bench: Bench) -> None:
    run = "it-sglang"
    configs = [{"method": "autoregressive"},
               {"method": "dflash", "block_size": 16, "id": "dflash"},
               {"method": "dflash", "block_size": 16, "id": "dflash-nooverlap",
                "server_args": ["--disable-overlap-schedule"]},
               {"method": "ddtree", "budget": 8, "block_size": 16, "server_args": ["--page-size", "1"],
                "env": {"STANDIN_ACCEPT": "3"}},
               {"method": "ddtree", "budget": 16, "block_size": 16, "server_args": ["--page-size", "1"],
                "env": {"STANDIN_ACCEPT": "5"}}]
    extra = {**bench.standin(STANDIN_ACCEPT="4"), "run_id": run, "bench_engine": "sglang",
             "bench_server_args": CT200_ARGS, "bench_env": {"HF_HUB_OFFLINE": "1"}, "bench_repetitions": 2,
             "bench_phases": [{"name": "tp1", "tp": 1, "configs": configs,
                               "sweeps": [{"workloads": ["fib", "json"], "max_tokens": [64],
                                           "concurrency": [1, 2]}]}]}
    res = bench.run(extra, timeout=600)
    assert res.returncode == 0, res.stdout[-4000:]
    # the harness's runs draw no plot (bench_report_plots=false): the play says so and the page has none
    assert "plots:  not drawn (bench_report_plots=false): specfleet plot" in res.stdout
    assert not list((bench.results / run).glob("plots/*")) and "<p>No plots.</p>" in \
        (bench.results / run / "report.html").read_text()
    host = bench.results / run / "local"
    ids = ["tp1-autoregressive", "tp1-dflash", "tp1-dflash-nooverlap", "tp1-ddtree-b8", "tp1-ddtree-b16"]
    for cid in ids:
        status = json.loads((host / cid / "status.json").read_text())
        assert status["status"] == "ok", status
        assert status["counters"]["verdict"] == "ok", status["counters"]  # sglang:* counters against the rows
        # the server's verify steps (0.5.15 on) against the rows' own, from each request's meta_info
        assert ("verify_steps" in status["counters"]) == (cid != "tp1-autoregressive"), status["counters"]
        command = json.loads((host / cid / "config.json").read_text())["command"]
        assert command[1:3] == ["-m", "sglang.launch_server"] and "--enable-metrics" in command
    ddtree = json.loads((host / "tp1-ddtree-b16/config.json").read_text())["command"]
    assert ddtree[ddtree.index("--speculative-algorithm") + 1] == "DDTREE"
    assert ddtree[ddtree.index("--speculative-ddtree-budget") + 1] == "16"
    rows = {r["config_id"]: r for r in json.loads((bench.results / run / "report.json").read_text())["rows"]
            if r["workload"] == "fib" and r["concurrency"] == 1}
    assert rows["tp1-autoregressive"]["accept_length_mean"] is None
    # the stand-in's acceptance per config: 64 tokens, the first from prefill, the other 63 over its verify steps
    assert abs(rows["tp1-ddtree-b8"]["accept_length_mean"] - 63 / 21) < 0.01
    assert abs(rows["tp1-ddtree-b16"]["accept_length_mean"] - 63 / 13) < 0.01
    # each speedup is its cell's tok/s over the baseline's (which is faster is the stand-in's pace on this machine)
    base = rows["tp1-autoregressive"]["tok_s_mean"]
    for cid in ids[1:]:
        assert rows[cid]["speedup"] == pytest.approx(rows[cid]["tok_s_mean"] / base, rel=1e-3), rows[cid]
    assert "DDTree" in (bench.results / run / "report.md").read_text()

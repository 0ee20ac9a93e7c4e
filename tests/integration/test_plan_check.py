"""Plan mode, check mode and bad input: nothing starts."""
from __future__ import annotations

import re

from .conftest import Bench


def test_plan_mode_for_ct200_prints_every_config_without_connecting(bench: Bench) -> None:
    res = bench.run({"plan": True}, limit="ct200", timeout=120)
    assert res.returncode == 0, res.stdout[-3000:]
    out = res.stdout
    assert "Plan for ct200: 24 configs" in out and "timed requests, estimated" in out
    assert len(re.findall(r"^\[\d+/24\] tp\d-", out, re.M)) == 24
    assert ("cmd: /opt/specfleet/sglang/bin/python -m sglang.launch_server --model-path /models/Qwen3.6-27B"
            in out)
    assert "--speculative-algorithm DDTREE" in out and "--speculative-ddtree-budget 64" in out
    assert "env: HF_HUB_OFFLINE=1 SGLANG_ENABLE_SPEC_V2=1" in out
    assert "UNREACHABLE" not in out and not bench.host_dir.exists()


def test_plan_mode_selects_phases(bench: Bench) -> None:
    res = bench.run({"plan": True, "phases": "tp4"}, limit="ct200", timeout=120)
    assert res.returncode == 0, res.stdout[-3000:]
    assert "Plan for ct200: 8 configs" in res.stdout and "tp1-" not in res.stdout.split("Plan for ct200")[1]


def test_check_mode_starts_nothing(bench: Bench) -> None:
    res = bench.run({"run_id": "it-check"}, "--check", timeout=300)
    assert res.returncode == 0, res.stdout[-3000:]
    assert "Plan for local: 4 configs" in res.stdout
    assert not (bench.host_dir / "results").exists() and not bench.results.exists()


def test_bad_matrix_is_rejected_before_any_server_starts(bench: Bench) -> None:
    bad = {"bench_phases": [{"name": "tp1", "tp": 2, "configs": [{"method": "autoregressive"},
                                                                 {"method": "ngram", "num_speculative_tokens": 2},
                                                                 {"method": "ngram", "num_speculative_tokens": 2}],
                             "sweeps": [{"workloads": ["fib", "sonnet"], "max_tokens": [64]}]}]}
    res = bench.run(bad, timeout=120)
    assert res.returncode != 0
    assert "bench_phases[0].tp: 2 is above the host's GPU count (0)" in res.stdout
    assert "bench_phases[0].configs[2]: duplicate config id 'tp1-ngram-k2'" in res.stdout
    assert "bench_phases[0].sweeps[0].workloads[1]: unknown workload 'sonnet'" in res.stdout
    assert not bench.host_dir.exists() and not bench.results.exists()

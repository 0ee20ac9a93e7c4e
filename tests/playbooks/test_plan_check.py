"""Plan mode with extra vars and bad input: nothing starts. (The README's plan and check commands run as typed
in test_readme_local.py.)"""
from __future__ import annotations

import re

from .conftest import Bench


def test_a_mapping_set_in_part_keeps_the_documented_defaults(bench: Bench) -> None:
    """One key of each mapping variable set as an extra var (which replaces ct200's whole mapping): the plan shows
    that key and the role's documented defaults for the others, and the configs carry the same values."""
    res = bench.run({"plan": True, "bench_timeouts": {"health_s": 300}, "bench_sampling": {"ignore_eos": True},
                     "bench_estimate": {"tok_s": 100}}, limit="ct200", timeout=120)
    assert res.returncode == 0, res.stdout[-3000:]
    assert "bench_timeouts: health_s=300 request_s=900 stop_s=60 release_s=120" in res.stdout
    assert "bench_sampling: temperature=0.0 ignore_eos=true" in res.stdout
    assert "bench_estimate: startup_s=120 tok_s=100 prefill_tok_s=5000" in res.stdout
    # 27 configs at the role's startup_s (120 s each) and 100 tok/s: the estimate follows the filled values
    assert re.search(r"Plan for ct200: 27 configs, \d+ timed requests, estimated \d+:\d\d:\d\d", res.stdout)


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

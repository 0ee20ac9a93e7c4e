"""The agreement benchmark's arithmetic (the paired ratio interval and its verdict, lumps, the saved rows'
report) and its null server, run for real with specfleet's client."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from agent.engines import ENGINES
from agent.measure import Endpoint
from agent.server import free_port
from benchmarks import agreement
from benchmarks.agreement import _unit, _wait_listening, paired_ratio_ci, report_rows, specfleet_unit, verdict


def test_shared_noise_cancels_in_pairs():
    # both clients see the same swings (load on the machine): the ratio is exact, the interval a point
    load = [1.0, 0.5, 2.0, 0.8, 1.3]
    a = [100 * x for x in load]
    b = [50 * x for x in load]
    ratio, lo, hi = paired_ratio_ci(a, b)
    assert ratio == pytest.approx(2.0)
    assert lo == pytest.approx(2.0) and hi == pytest.approx(2.0)


def test_interval_is_the_paired_delta_method():
    a, b = [10.0, 12.0, 11.0, 13.0], [10.0, 11.0, 12.0, 11.0]
    ma, mb = sum(a) / 4, sum(b) / 4
    d = [x / ma - y / mb for x, y in zip(a, b)]
    md = sum(d) / 4
    se = math.sqrt(sum((x - md) ** 2 for x in d) / 3) / 2
    ratio, lo, hi = paired_ratio_ci(a, b)
    assert ratio == pytest.approx(ma / mb)
    assert lo == pytest.approx(ratio * math.exp(-3.182446305284263 * se))  # t(0.975, 3 df)
    assert hi == pytest.approx(ratio * math.exp(3.182446305284263 * se))


def test_degenerate_and_unequal_samples():
    assert paired_ratio_ci([1.0], [2.0]) == (0.5, None, None)
    assert paired_ratio_ci([], []) == (None, None, None)
    with pytest.raises(ValueError):
        paired_ratio_ci([1.0, 2.0], [1.0])


@pytest.mark.parametrize("lo, hi, word", [(0.99, 1.01, "agree"), (0.97, 1.01, "unresolved"),
                                          (1.03, 1.10, "differ"), (0.90, 0.97, "differ"),
                                          (None, None, "unresolved")])
def test_verdict(lo, hi, word):
    assert verdict(lo, hi) == word


def test_a_stream_that_arrives_in_a_lump_is_counted():
    # TTFT 0.74 s of a 0.76 s request: the first chunk came with nearly all of the response
    u = _unit([256, 256], [0.76, 0.73], [0.74, 0.04], 1.5)
    assert u.coalesced == 1
    assert _unit([256], [0.73], [0.04], 0.73).coalesced == 0


def test_report_pools_saved_rows_and_sets_the_null_server_apart(tmp_path, capsys):
    def row(server, i, ttft_a, ttft_b):
        unit = {"tok_s": 300.0, "unit_tok_s": 300.0, "tokens": [256], "coalesced": 0}
        return json.dumps({"server": server, "concurrency": 1, "max_tokens": 256, "gap_s": 0.0, "pair": i,
                           "workload": "fib", "first": "specfleet", "t_s": float(i),
                           "specfleet": {**unit, "ttft_ms": ttft_a}, "vllm": {**unit, "ttft_ms": ttft_b}})
    rows = [row("null", i, 0.5, 1.0) for i in range(9)]
    rows += [row("engine", i, 37.5 + i % 3, 38.0 + i % 3) for i in range(9)]
    # a row written before the null server existed counts as an engine row
    old = json.loads(row("engine", 9, 39.5, 40.0))
    del old["server"], old["specfleet"]["coalesced"], old["vllm"]["coalesced"]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(rows + [json.dumps(old)]) + "\n")
    report_rows([path])
    out = capsys.readouterr().out
    assert "concurrency 1: 10 pairs" in out
    assert "specfleet 0.50 ms, vLLM 1.00 ms" in out
    ttft = next(line for line in out.splitlines() if "mean TTFT" in line)
    assert ttft.split()[3:5] == ["38.60", "39.10"]  # the engine rows' means, the null rows set apart


def test_null_server_streams_what_the_client_counts():
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(Path(agreement.__file__).with_name("null_server.py")), str(port)])
    try:
        _wait_listening(port, 30.0)
        cfg = {"timeouts": {"request_s": 30}, "model": {"name": "null"},
               "sampling": {"temperature": 0.0, "ignore_eos": True}}
        for n in (1, 3):  # one connection after another, then several at once
            u = specfleet_unit(Endpoint(ENGINES["vllm"], port), cfg, "hello", 64, n, f"null-{n}")
            assert u.tokens == [64] * n
            assert 0 < u.ttft_ms < 1000
    finally:
        proc.terminate()
        proc.wait()

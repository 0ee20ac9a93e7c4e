"""agent.counters on vLLM's real /metrics text (scraped from the embedded engine: tests/fixtures/vllm-metrics-*.txt)
and agent.measure's order and cold-start check, agent.hostload's /proc arithmetic."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent import counters, hostload, measure
from agent.engines import ENGINES
from tests.conftest import ROOT

VLLM = ENGINES["vllm"]
FIXTURES = ROOT / "tests/fixtures"


def rows(tokens: list[int], steps: list[int] | None = None, accepted: list[int] | None = None) -> list[dict[str, Any]]:
    return [{"ok": True, "completion_tokens": t, "spec_steps": None if steps is None else steps[i],
             "spec_accepted_tokens": None if accepted is None else accepted[i]} for i, t in enumerate(tokens)]


def test_the_real_metrics_text_is_read_summed_over_labels() -> None:
    before = counters.parse((FIXTURES / "vllm-metrics-before.txt").read_text(), VLLM.counters or {})
    after = counters.parse((FIXTURES / "vllm-metrics-after.txt").read_text(), VLLM.counters or {})
    assert set(before) >= {"generation_tokens", "prompt_tokens", "requests", "drafts", "accepted_tokens"}
    # 4 timed requests of 32 tokens with ngram k=2 between the two scrapes (see the fixture README)
    assert after["generation_tokens"] - before["generation_tokens"] == 128
    assert after["requests"] - before["requests"] == 4   # request_success summed over its finished_reason labels
    # what the four requests themselves reported: 32 tokens, 1 verify step accepting 2 drafts each
    got = counters.check(before, after, rows([32] * 4, [1] * 4, [2] * 4), speculative=True)
    assert got["verdict"] == "ok" and got["accept_length"]["server"] == got["accept_length"]["rows"] == 3.0


def test_a_sample_line_with_labels_and_one_without() -> None:
    text = ('# HELP x\nvllm:generation_tokens_total{engine="0",model_name="m"} 10.0\n'
            'vllm:generation_tokens_total{engine="1",model_name="m"} 5\nvllm:generation_tokens_created 1.7e9\n'
            'vllm:request_success_total 3\nvllm:request_success_total{finished_reason="length"} NaN\n')
    assert counters.parse(text, VLLM.counters or {}) == {"generation_tokens": 15.0, "requests": 3.0}


def test_agreement_is_ok_with_both_figures() -> None:
    before = {"generation_tokens": 100.0, "requests": 2.0, "drafts": 10.0, "accepted_tokens": 5.0}
    after = {"generation_tokens": 228.0, "requests": 6.0, "drafts": 60.0, "accepted_tokens": 55.0}
    # the rows: 4 requests, 128 tokens; 50 verify steps, 50 accepted drafts -> 1 + 50/50 = 2.0 as the server
    got = counters.check(before, after, rows([32] * 4, [10, 15, 5, 20], [10, 15, 5, 20]), speculative=True)
    assert got["verdict"] == "ok"
    assert got["generation_tokens"] == {"server": 128, "rows": 128, "ok": True}
    assert got["requests"] == {"server": 4, "rows": 4, "ok": True}
    assert got["verify_steps"] == {"server": 50, "rows": 50, "ok": True}  # vLLM: a draft per verify step
    assert got["accepted_tokens"] == {"server": 50, "rows": 50, "ok": True}
    assert got["accept_length"]["server"] == 2.0 and got["accept_length"]["rows"] == 2.0


def test_the_weighting_is_by_verify_steps_not_by_request() -> None:
    """Two requests: 10 steps accepting 10 (2.0) and 30 steps accepting 0 (1.0). Per steps: 1 + 10/40 = 1.25, the
    server's figure; the plain mean of the per-request means (1.5) would be 20% off."""
    before = {"generation_tokens": 0.0, "requests": 0.0, "drafts": 0.0, "accepted_tokens": 0.0}
    after = {"generation_tokens": 50.0, "requests": 2.0, "drafts": 40.0, "accepted_tokens": 10.0}
    got = counters.check(before, after, rows([20, 30], [10, 30], [10, 0]), speculative=True)
    assert got["accept_length"]["rows"] == 1.25 and got["verdict"] == "ok"


@pytest.mark.parametrize("change, which", [
    ({"generation_tokens": 229.0}, "generation_tokens: server 129 vs rows 128"),
    ({"requests": 7.0}, "requests: server 5 vs rows 4"),
    ({"accepted_tokens": 57.0}, "accept_length: server 2.04 vs rows 2.0"),
    # counted exactly, where the acceptance length's 1% would let one token through
    ({"accepted_tokens": 56.0}, "accepted_tokens: server 51 vs rows 50"),
    ({"drafts": 61.0, "accepted_tokens": 56.0}, "verify_steps: server 51 vs rows 50"),
])
def test_any_disagreement_is_suspect_with_the_two_figures(change: dict[str, float], which: str) -> None:
    before = {"generation_tokens": 100.0, "requests": 2.0, "drafts": 10.0, "accepted_tokens": 5.0}
    after = {"generation_tokens": 228.0, "requests": 6.0, "drafts": 60.0, "accepted_tokens": 55.0, **change}
    got = counters.check(before, after, rows([32] * 4, [10, 15, 5, 20], [10, 15, 5, 20]), speculative=True)
    assert got["verdict"] == "suspect" and which in got["why"]


def test_without_counters_nothing_is_claimed() -> None:
    assert counters.check(None, {"generation_tokens": 1.0}, rows([1]), False)["verdict"] == "unchecked"
    base = counters.check({"generation_tokens": 0.0}, {"generation_tokens": 3.0}, rows([3]), speculative=False)
    assert base == {"verdict": "ok", "generation_tokens": {"server": 3, "rows": 3, "ok": True}}


def test_the_order_is_shuffled_by_round_and_recorded_by_seed() -> None:
    cells = [{"repetitions": 3}, {"repetitions": 3}, {"repetitions": 1}, {"repetitions": 3}]
    one, again, other = measure.order(cells, 7), measure.order(cells, 7), measure.order(cells, 8)
    assert one == again and one != other                                   # the seed reproduces it
    assert sorted(one) == sorted((r, i) for i, c in enumerate(cells) for r in range(c["repetitions"]))
    assert [r for r, _ in one] == sorted(r for r, _ in one)                 # round by round
    for seed in range(200):
        seq = [i for _, i in measure.order(cells, seed)]
        assert all(a != b for a, b in zip(seq, seq[1:])), seed              # never one cell twice in a row
    assert measure.order([{"repetitions": 3}], 1) == [(0, 0), (1, 0), (2, 0)]


def test_a_cold_first_request_is_an_outlier() -> None:
    cell = {"workload": "fib", "max_tokens": 32, "context_tokens": 0, "concurrency": 1}
    warm = [{**cell, "ttft_s": t} for t in (0.90, 0.010, 0.011, 0.012)]
    got = measure.cold_start(warm)
    assert got == {"first_ttft_s": 0.9, "cell_median_ttft_s": 0.011, "ratio": 81.818, "outlier": True}
    assert measure.cold_start([{**cell, "ttft_s": 0.011}, *warm[1:]])["outlier"] is False
    assert measure.cold_start(warm[:1]) is None                            # nothing to compare with


def test_host_load_splits_engine_and_other_cpu(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "100").mkdir(parents=True)
    (proc / "200").mkdir()
    tick = hostload.TICK

    def write(busy: int, engine: int, other: int, load: str) -> None:
        (proc / "stat").write_text(f"cpu  {busy} 0 0 1000 50 0 0 0 0 0\ncpu0 1 2 3\n")
        (proc / "100/stat").write_text(f"100 (python3 -m (vllm)) S 1 100 100 0 -1 0 0 0 0 0 {engine} 0 0 0\n")
        (proc / "200/stat").write_text(f"200 (other) S 1 200 200 0 -1 0 0 0 0 0 {other} 0 0 0\n")
        (proc / "loadavg").write_text(f"{load} 0.5 0.4 1/100 200\n")
    write(10 * tick, 2 * tick, 1 * tick, "0.50")
    before = hostload.sample(lambda pid: pid == 100, proc)
    write(30 * tick, 14 * tick, 5 * tick, "1.75")
    after = hostload.sample(lambda pid: pid == 100, proc)
    got = hostload.summary(before, after, 10.0)
    assert got is not None and (got["engine_cpu_s"], got["other_cpu_s"], got["other_cpus"]) == (12.0, 8.0, 0.8)
    assert (got["loadavg_1m_start"], got["loadavg_1m_end"]) == (0.5, 1.75)
    assert hostload.summary(None, after, 10.0) is None


SGLANG = ENGINES["sglang"]


def test_sglang_verify_steps_are_checked_where_the_server_counts_them() -> None:
    """SGLang 0.5.15 on counts verify steps (`sglang:spec_verify_calls_total`, per finished request): the rows'
    steps must sum to its delta; a build without the counter leaves the check out."""
    text = ('sglang:generation_tokens_total{model_name="m"} %d\nsglang:num_requests_total{model_name="m"} %d\n'
            'sglang:spec_verify_calls_total{model_name="m"} %d\n')
    before = counters.parse(text % (10, 1, 4), SGLANG.counters or {})
    after = counters.parse(text % (74, 3, 30), SGLANG.counters or {})
    got = counters.check(before, after, rows([32, 32], [12, 14], [19, 17]), speculative=True)
    assert got["verdict"] == "ok" and got["verify_steps"] == {"server": 26, "rows": 26, "ok": True}
    got = counters.check(before, after, rows([32, 32], [12, 13], [19, 18]), speculative=True)
    assert got["verdict"] == "suspect" and "verify_steps: server 26 vs rows 25" in got["why"]
    old = text.rsplit("sglang:spec_verify", 1)[0]  # 0.5.11: no such counter
    got = counters.check(counters.parse(old % (10, 1), SGLANG.counters or {}),
                         counters.parse(old % (74, 3), SGLANG.counters or {}), rows([32, 32], [12, 14], [19, 17]),
                         speculative=True)
    assert got["verdict"] == "ok" and "verify_steps" not in got


def test_a_counter_printed_rounded_is_judged_within_its_rounding() -> None:
    # llama.cpp prints counters as a C++ stream prints a double: six significant digits
    names = {"generation_tokens": "llamacpp:tokens_predicted_total", "drafts": "llamacpp:spec_decode_num_drafts_total"}
    before = counters.parse("llamacpp:tokens_predicted_total 1.23457e+06\n", names)
    after = counters.parse("llamacpp:tokens_predicted_total 1.23469e+06\n", names)
    assert before["generation_tokens~"] == 5.0 and counters.blur("2048") == 0.0 and counters.blur("3.5e+02") == 5.0
    rows = [{"ok": True, "completion_tokens": 64}] * 2  # 128 tokens; the printed difference reads 120
    assert counters.check(before, after, rows, False)["verdict"] == "ok"
    far = [{"ok": True, "completion_tokens": 64}] * 3  # 192: beyond the two readings' rounding (±10)
    assert counters.check(before, after, far, False)["verdict"] == "suspect"
    exact = counters.parse("llamacpp:tokens_predicted_total 1200\n", names)
    assert counters.check(exact, counters.parse("llamacpp:tokens_predicted_total 1320\n", names), rows,
                          False)["verdict"] == "suspect"  # printed whole: exactly or not at all

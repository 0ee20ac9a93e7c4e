"""The acceptance per config (collector/tables/acceptance.py): run folders built by hand with known verify steps s,
accepted tokens a and drafted tokens d per request, every expected figure worked out here from them."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

import pytest
from scipy import stats

from collector import request_lines
from collector.load import load_run
from collector.outputs.html import _named
from collector.report import render
from collector.tables.acceptance import COLUMNS, acceptance
from collector.vocab import na, params_words
from tests.collector.test_collector import cell, make_config, make_run

HOST = "h1"
SPEC = "tp1-draft_model-k3-synth2.5"
PARAMS = {"num_speculative_tokens": 3, "synth_len": 2.5}
# (a, s, d) of the requests with verify steps of SPEC
STEPPED = [(10, 8, 24), (20, 12, 36), (31, 15, 45), (5, 6, 18)]
BURST = [(7, 12), (9, 12)]  # (a, d) of its requests in a burst: the burst's length on each, no steps of their own


def request(config_id: str, method: str, params: dict[str, Any], rep: int, ok: bool = True,
            concurrency: int = 1, **spec: Any) -> str:
    """A request line of cell fib at `concurrency`, with the speculative fields given."""
    return json.dumps({"host": HOST, "config_id": config_id, "engine": "llamacpp", "model": "m", "method": method,
                       "method_params": params, "tp": 1, "workload": "fib", "max_tokens": 128, "context_tokens": 0,
                       "concurrency": concurrency, "rep": rep, "completion_tokens": 128, "ttft_s": 0.05,
                       "e2e_s": 1.0, "output_tok_s": 128.0, "ok": ok, "error": None if ok else "boom", **spec})


def config(run_dir: Path, config_id: str, method: str, lines: list[str], params: Optional[dict[str, Any]] = None,
           counters: Optional[dict[str, Any]] = None) -> None:
    d = make_config(run_dir, HOST, config_id, method=method, method_params=params or {}, cells=[cell("fib")],
                    extra_lines=lines)
    if counters is not None:
        status = json.loads((d / "status.json").read_text())
        (d / "status.json").write_text(json.dumps({**status, "counters": counters}))


@pytest.fixture()
def run_dir(tmp_path: Path) -> Path:
    """A baseline; SPEC: four requests with steps, two burst rows and a failed request (with steps it must not
    count), counters suspect; a config with one request with steps; one whose requests carry no steps (one with 0
    steps), without counters; and a failed speculative config with no requests."""
    run = make_run(tmp_path)
    config(run, "tp1-autoregressive", "autoregressive",
           [request("tp1-autoregressive", "autoregressive", {}, r, spec_accepted_tokens=0, spec_draft_tokens=0)
            for r in range(3)], counters={"verdict": "ok"})
    lines = [request(SPEC, "draft_model", PARAMS, r, spec_accepted_tokens=a, spec_steps=s, spec_draft_tokens=d,
                     accept_length=1 + a / s, accept_scope="request") for r, (a, s, d) in enumerate(STEPPED)]
    lines += [request(SPEC, "draft_model", PARAMS, 9, concurrency=2, spec_accepted_tokens=a, spec_steps=None,
                      spec_draft_tokens=d, accept_length=2.0, accept_scope="burst") for a, d in BURST]
    lines.append(request(SPEC, "draft_model", PARAMS, 10, ok=False, spec_accepted_tokens=100, spec_steps=100,
                         spec_draft_tokens=300))
    config(run, SPEC, "draft_model", lines, PARAMS, counters={"verdict": "suspect", "checks": {}})
    config(run, "tp1-eagle3-k3", "eagle3",
           [request("tp1-eagle3-k3", "eagle3", {"num_speculative_tokens": 3}, 0, spec_accepted_tokens=12,
                    spec_steps=10)], {"num_speculative_tokens": 3}, counters={"verdict": "unchecked", "why": "x"})
    config(run, "tp1-ngram-k2", "ngram",
           [request("tp1-ngram-k2", "ngram", {"num_speculative_tokens": 2}, r, accept_length=1.5) for r in range(2)]
           + [request("tp1-ngram-k2", "ngram", {"num_speculative_tokens": 2}, 2, spec_steps=0,
                      spec_accepted_tokens=0)], {"num_speculative_tokens": 2})
    make_config(run, HOST, "tp1-dflash", method="dflash", method_params={"block_size": 4}, cells=[cell("fib")],
                status="failed", reason="oom")
    return run


def expected_interval(pairs: list[tuple[int, int]]) -> tuple[float, float, float]:
    """1 + R and its 95% interval by the ratio estimator, from (a, s) pairs, worked out from its definition."""
    n = len(pairs)
    r = sum(a for a, _ in pairs) / sum(s for _, s in pairs)
    s_mean = sum(s for _, s in pairs) / n
    se = math.sqrt(sum((a - r * s) ** 2 for a, s in pairs) / (n * (n - 1))) / s_mean
    half = stats.t.ppf(0.975, n - 1) * se
    return 1 + r, 1 + r - half, 1 + r + half


def rows_of(run_dir: Path) -> dict[str, dict[str, Any]]:
    return {r["config_id"]: r for r in acceptance(load_run(run_dir)).to_dict("records")}


def test_pooled_length_interval_rate_and_burst_rows(run_dir: Path) -> None:
    got = rows_of(run_dir)[SPEC]
    a = sum(x[0] for x in STEPPED)
    s = sum(x[1] for x in STEPPED)
    assert got["accept_length"] == 1 + a / s  # 1 + 66/41, exactly: verify-step weighted, not a mean of lengths
    assert got["accept_length"] != pytest.approx(sum(1 + x[0] / x[1] for x in STEPPED) / len(STEPPED))
    length, low, high = expected_interval([(x[0], x[1]) for x in STEPPED])
    assert (got["accept_length_ci_low"], got["accept_length_ci_high"]) == pytest.approx((low, high), rel=1e-12)
    assert low < length < high
    # the rate: every ok request that carries its drafted tokens, the burst rows too; the failed one in nothing
    assert got["acceptance_rate"] == pytest.approx((a + sum(x[0] for x in BURST))
                                                   / (sum(x[2] for x in STEPPED) + sum(x[1] for x in BURST)))
    assert got["draft_tokens_per_step"] == pytest.approx(sum(x[2] for x in STEPPED) / s)
    assert (got["requests"], got["requests_with_steps"], got["burst_rows"]) == (6, 4, 2)
    assert (got["method"], got["params"], got["counters"]) == ("draft_model", "num_speculative_tokens 3, synth_len 2.5",
                                                               "suspect")


def test_blanks_where_a_figure_cannot_be_worked_out(run_dir: Path) -> None:
    rows = rows_of(run_dir)
    assert list(rows) == ["tp1-dflash", SPEC, "tp1-eagle3-k3", "tp1-ngram-k2"]  # the time table's order, no baseline
    one = rows["tp1-eagle3-k3"]  # one request with steps: a length, no interval; no drafted tokens: no rate
    assert one["accept_length"] == 1 + 12 / 10
    assert all(math.isnan(one[k]) for k in ("accept_length_ci_low", "accept_length_ci_high", "acceptance_rate",
                                            "draft_tokens_per_step"))
    assert (one["requests"], one["requests_with_steps"], one["counters"]) == (1, 1, "unchecked")
    none = rows["tp1-ngram-k2"]  # accept_length on its rows, no steps (0 steps do not count): nothing to pool
    assert (none["requests"], none["requests_with_steps"], none["burst_rows"]) == (3, 0, 0) and na(none["counters"])
    assert all(math.isnan(none[k]) for k in ("accept_length", "accept_length_ci_low", "acceptance_rate"))
    failed = rows["tp1-dflash"]
    assert (failed["requests"], failed["requests_with_steps"]) == (0, 0) and math.isnan(failed["accept_length"])


def test_md_section_and_json_key(run_dir: Path) -> None:
    run = load_run(run_dir)
    md = render(run, "md")
    section = md.split("## Acceptance per config\n", 1)[1].split("\n## ", 1)[0]
    length, low, high = expected_interval([(x[0], x[1]) for x in STEPPED])
    line = next(x for x in section.splitlines() if x.startswith(f"| {HOST} ") and f" {SPEC} " in x)
    assert f" {length:.2f} [{low:.2f}, {high:.2f}] " in line
    assert f"- {HOST} `{SPEC}`: draft_model, num_speculative_tokens 3, synth_len 2.5" in section
    assert "- accept_length: " in section and "- burst_rows: " in section
    assert md.index("## Acceptance per config") < md.index("## Time per config")
    doc = json.loads(render(run, "json"))
    got = {r["config_id"]: r for r in doc["acceptance_per_config"]}
    assert list(doc["acceptance_per_config"][0]) == COLUMNS
    assert got[SPEC]["accept_length"] == pytest.approx(length, abs=1e-6)
    assert got["tp1-ngram-k2"]["accept_length"] is None and got["tp1-ngram-k2"]["counters"] is None
    assert got["tp1-eagle3-k3"]["accept_length_ci_low"] is None
    assert _named("Acceptance per config") == ("acceptance", "acceptance per config")  # the page's section


def test_a_run_with_only_a_baseline_has_no_section(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    config(run, "tp1-autoregressive", "autoregressive",
           [request("tp1-autoregressive", "autoregressive", {}, r) for r in range(3)])
    loaded = load_run(run)
    assert "Acceptance per config" not in render(loaded, "md")
    assert json.loads(render(loaded, "json"))["acceptance_per_config"] == []


def test_the_plain_reader_reads_the_same(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = {c.config_id: c.spec for c in load_run(run_dir).configs}
    monkeypatch.setattr(request_lines, "msgspec", None)
    assert {c.config_id: c.spec for c in load_run(run_dir).configs} == fast


def test_params_in_words() -> None:
    assert params_words(PARAMS) == "num_speculative_tokens 3, synth_len 2.5"
    assert params_words(json.dumps({"synth_rates": [0.5, 0.25], "budget": 16})) == "synth_rates 0.5/0.25, budget 16"
    assert params_words({}) == params_words(None) == ""

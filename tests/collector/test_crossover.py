"""Where speculation pays, on runs with a known answer: request lines written the way the agent writes them
(configs from `matrix.expand`, rows through `records.request_row`, files through the agent's `record`), each load's
throughput set so that a config's ratio to the baseline is exact, and every expected crossover worked out by hand.

The rule (collector/crossover.py): the first load where the ratio goes from >= 1 to < 1, interpolated linearly in
load between the measured loads around it; a failed load is left out and named; its interval where the interval's
bounds cross 1 the same way.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

import pandas as pd
import pytest

from agent import records
from agent.config_run import Host, Result, fresh_folder, record
from agent.engines import ENGINES
from agent.records import Outcome
from agent.store import HostStore, write_json
from collector import crossover
from collector.__main__ import main as collector_main
from collector.load import load_run
from collector.report import render
from collector.stats import t_quantile
from collector.tables.speedup import table
from controller import matrix

HOST, TOKENS = "cpu1", 64
LOADS = [1, 2, 4, 8]
RATES: list[Any] = [1, 2, 4, "inf"]
BASE_TOK_S = 100.0  # the baseline's throughput at every load
SPREAD = (5 / 6, 1.0, 7 / 6)  # each load's three repetitions: mean × these (relative std 1/6)
# Each config's throughput ratio to the baseline at each load (None: every request of that load failed)
RATIOS: dict[str, list[Optional[float]]] = {
    "ngram-k2": [1.5, 1.2, 0.8, 0.6],       # crosses between c2 and c4: 2 + 0.2 / 0.4 × 2 = 3
    "ngram-k4": [0.9, 0.8, 0.7, 0.5],       # never pays
    "ngram-k3": [1.4, 1.3, None, 0.7],      # c4 failed: interpolated between c2 and c8, 2 + 0.3 / 0.6 × 6 = 5
    "draft_model-k3": [1.2, 1.1, 1.05, 1.01],  # pays everywhere measured
}
OPEN_RATIOS: dict[str, list[Optional[float]]] = {"ngram-k2": [1.3, 1.1, 0.9, 0.7]}  # 2 + 0.1 / 0.2 × 2 = 3 req/s
SLO = {"ttft_ms": 500, "attainment": 0.9}
SLOW_TTFT = {"ngram-k2": {4, 8}}  # loads whose requests miss the TTFT limit (1 s against 0.5 s)


def suite(with_open: bool) -> dict[str, Any]:
    sweeps: list[dict[str, Any]] = [{"name": "load", "workloads": ["fib"], "max_tokens": [TOKENS],
                                     "concurrency": LOADS}]
    if with_open:
        sweeps.append({"name": "rate", "workloads": ["qsort"], "max_tokens": [TOKENS], "request_rates": RATES,
                       "requests": 4, "methods": ["ngram-k2"]})
    return {"suite_name": "crossover", "engine": "vllm", "engine_python": "/opt/vllm/bin/python",
            "model": {"name": "tiny", "path": "/models/tiny"}, "draft_model": {"name": "d", "path": "/models/d"},
            "repetitions": 3, "slo": SLO,
            "phases": [{"name": "tp1", "configs": [
                {"method": "autoregressive"}, {"method": "ngram", "num_speculative_tokens": 2},
                {"method": "ngram", "num_speculative_tokens": 4}, {"method": "ngram", "num_speculative_tokens": 3},
                {"method": "draft_model", "num_speculative_tokens": 3}], "sweeps": sweeps}]}


def _rows(identity: dict[str, Any], cell: dict[str, Any], ratio: Optional[float], spread: tuple[float, ...],
          slow: bool, late: float = 0.0) -> list[dict[str, Any]]:
    """Every repetition of one cell: throughput BASE_TOK_S × ratio × spread[rep] over the repetition's span."""
    out = []
    open_loop = cell.get("request_rate") is not None
    n = cell["requests"] if open_loop else cell["concurrency"]
    rate = cell.get("request_rate")
    for rep, s in enumerate(spread):
        if ratio is None:
            for i in range(n):
                out.append(records.request_row(identity, cell, rep, {
                    "slot": i, "ok": False, "error": "HTTP 500: boom", "sent_s": 0.0, "done_s": 0.01}))
            continue
        span = n * TOKENS / (BASE_TOK_S * ratio * s)
        for i in range(n):
            sent = 0.0 if not open_loop or rate == "inf" else i / rate
            done = span  # every request ends with the span: the repetition's throughput is exact
            ttft = 1.0 if slow else 0.1
            row = {"slot": i, "prompt_tokens": 10, "completion_tokens": TOKENS, "ttft_s": ttft,
                   "e2e_s": done - sent, "output_tok_s": TOKENS / (done - sent),
                   "tpot_s": (done - sent - ttft) / (TOKENS - 1), "chunk_gap_max_s": 0.01, "ok": True,
                   "error": None, "sent_s": sent, "done_s": done}
            if open_loop:
                row["scheduled_s"] = sent - late * (i % 2)  # every other request sent `late` after it was due
            out.append(records.request_row(identity, cell, rep, row))
    return out


def write_run(root: Path, ratios: dict[str, list[Optional[float]]] = RATIOS, spread: tuple[float, ...] = SPREAD,
              name: str = "run-x", with_open: bool = True, late: float = 0.0) -> Path:
    run_dir = root / "results" / name
    store = HostStore(run_dir, HOST)
    host = Host(suite=suite(with_open), engine=ENGINES["vllm"], store=store, engine_info={"version": "0.20.0"})
    write_json(store.dir / "host.json", {"host": HOST, "hostname": HOST, "gpus": {"count": 0, "devices": []}})
    for cfg in matrix.expand(suite(with_open)):
        lab = cfg["config_id"].removeprefix("tp1-")
        folder = fresh_folder(store, cfg["config_id"])
        identity = {"host": HOST, "config_id": cfg["config_id"], "method": cfg["method"],
                    "method_params": cfg["method_params"], "tp": cfg["tp"], "engine": cfg["engine"],
                    "model": cfg["model"]["name"], "phase": cfg["phase"]}
        rows = []
        for cell in cfg["cells"]:
            if cell.get("request_rate") is not None:
                at = RATES.index(cell["request_rate"])
                ratio = 1.0 if lab == "autoregressive" else OPEN_RATIOS[lab][at]
                rows += _rows(identity, cell, ratio, spread, False, late)
                continue
            at = LOADS.index(cell["concurrency"])
            ratio = 1.0 if lab == "autoregressive" else ratios[lab][at]
            rows += _rows(identity, cell, ratio, spread, cell["concurrency"] in SLOW_TTFT.get(lab, ()))
        record(host, cfg, Result(Outcome.OK, rows=rows, argv=cfg["command"], fields={"ready_s": 1.0}), folder,
               "2026-12-01T10:00:00.000+00:00")
    assert collector_main(["stamp", str(run_dir), "start", "--suite", "x", "--hosts", HOST]) == 0
    assert collector_main(["stamp", str(run_dir), "finish", "--suite", "x", "--hosts", HOST]) == 0
    return run_dir


def half_width(spread: tuple[float, ...]) -> float:
    """The log half-width of every ratio's 95% interval: both samples have the same relative spread."""
    m = sum(spread) / len(spread)
    rel_var = sum((x - m) ** 2 for x in spread) / (len(spread) - 1) / m ** 2 / len(spread)
    return t_quantile(0.975, 2 * (len(spread) - 1)) * math.sqrt(2 * rel_var)


def cross(loads: list[float], values: list[float]) -> float:
    """Where the line through the first (>= 1, < 1) pair of points crosses 1."""
    for i in range(len(values) - 1):
        if values[i] >= 1 > values[i + 1]:
            return loads[i] + (values[i] - 1) / (values[i] - values[i + 1]) * (loads[i + 1] - loads[i])
    raise AssertionError("no crossing")


def tables_of(md: str) -> list[dict[str, str]]:
    """The body rows of every pipe table in `md`, each by its table's header."""
    out, header = [], None
    for line in md.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not line.startswith("|:"):
            out.append(dict(zip(header, cells)))
    return out


def pays_of(run_dir: Path) -> dict[tuple[str, str], dict[str, Any]]:
    got = crossover.table(table(load_run(run_dir)))
    return {(r["config_id"].removeprefix("tp1-"), r["axis"]): r for r in got.to_dict("records")}


@pytest.mark.parametrize("ratios, want", [
    ([1.5, 1.2, 0.8, 0.6], 3.0),
    ([1.4, 1.3, None, 0.7], 5.0),
    ([2.0, 0.5], 1 + 1 / 1.5),
    ([0.9, 1.2, 0.6, 0.8], 2 + 0.2 / 0.6 * 2),   # below 1 first: the first fall after a load that pays
    ([1.0, 0.5], 1.0),                             # exactly 1 pays (a ratio of 1 is not below the baseline)
])
def test_the_crossover_is_the_first_fall_below_one_interpolated_in_load(ratios: list[Optional[float]],
                                                                       want: float) -> None:
    points = [crossover.Point(float(load), r, r, r, "ok" if r is not None else "oom")
              for load, r in zip(LOADS, ratios)]
    got = crossover.crossing(points, "concurrency")
    assert got.kind == "crosses" and got.at == pytest.approx(want)


@pytest.mark.parametrize("ratios, kind, text", [
    ([1.2, 1.1, 1.0], "everywhere", "pays everywhere measured"),
    ([0.9, 0.5, 0.99], "never", "never pays"),
    ([None, None], "other", "no load measured"),
    ([0.8, 1.2, 1.3], "other", "pays from c2 on, not below"),
])
def test_a_ratio_that_stays_on_one_side_has_no_crossover(ratios: list[Optional[float]], kind: str,
                                                         text: str) -> None:
    got = crossover.crossing([crossover.Point(float(load), r) for load, r in zip(LOADS, ratios)], "concurrency")
    assert (got.at, got.kind, got.text) == (None, kind, text)


def test_a_fall_between_a_rate_and_all_at_once_is_not_interpolated() -> None:
    points = [crossover.Point(1.0, 1.3), crossover.Point(2.0, 1.1), crossover.Point(math.inf, 0.9)]
    got = crossover.crossing(points, "request_rate")
    assert (got.at, got.low, got.high) == (None, 2.0, math.inf)
    assert got.text == "above 2 req/s, below all at once (not interpolated)"


def test_known_crossovers_from_a_constructed_run(tmp_path: Path) -> None:
    """Closed loop (fib at c1, c2, c4, c8): the exact crossover of each config, its interval where the interval's
    bounds cross 1, and the loads where each pays."""
    pays = pays_of(write_run(tmp_path))
    h = math.exp(half_width(SPREAD))
    k2 = pays[("ngram-k2", "concurrency")]
    assert k2["crossover_kind"] == "crosses"
    assert k2["crossover"] == pytest.approx(3.0)
    assert k2["crossover_low"] == pytest.approx(cross(LOADS, [r / h for r in RATIOS["ngram-k2"]]))  # type: ignore
    assert k2["crossover_high"] == pytest.approx(cross(LOADS, [r * h for r in RATIOS["ngram-k2"]]))  # type: ignore
    assert k2["crossover_low"] < 3.0 < k2["crossover_high"]
    assert (k2["best_speedup"], k2["best_at"], k2["pays_at"]) == (pytest.approx(1.5), "c1", "c1–c2")
    assert k2["loads"] == "c1, c2, c4, c8" and (k2["load_min"], k2["load_max"]) == (1.0, 8.0)
    never = pays[("ngram-k4", "concurrency")]
    assert (never["crossover_kind"], never["crossover_text"], never["pays_at"]) == ("never", "never pays",
                                                                                     "nowhere measured")
    assert pd.isna(never["crossover"])
    everywhere = pays[("draft_model-k3", "concurrency")]
    assert (everywhere["crossover_kind"], everywhere["pays_at"]) == ("everywhere", "c1–c8")
    gap = pays[("ngram-k3", "concurrency")]
    assert gap["crossover"] == pytest.approx(5.0)
    assert gap["not_measured"] == "c4: no ok request"
    assert gap["pays_at"] == "c1–c2"  # the failed load is no evidence either way
    base = pays[("autoregressive", "concurrency")]
    assert pd.isna(base["crossover"]) and pd.isna(base["best_speedup"])


def test_goodput_crossover_and_the_highest_load_within_limits(tmp_path: Path) -> None:
    """ngram-k2's requests miss the TTFT limit at c4 and c8: its goodput there is 0, so its goodput ratio falls from
    1.2 at c2 to 0 at c4 (crossing at 2 + 0.2 / 1.2 × 2); it is within limits up to c2, the baseline up to c8."""
    run = load_run(write_run(tmp_path))
    df = table(run)
    k2 = df[(df["config_id"] == "tp1-ngram-k2") & (df["request_rate"].isna())].set_index("concurrency")
    assert list(k2["slo_met"]) == [1.0, 1.0, 0.0, 0.0]
    assert list(k2["within_slo"]) == [True, True, False, False]
    assert k2.loc[2, "goodput_tok_s"] == pytest.approx(k2.loc[2, "burst_tok_s_mean"])
    assert k2.loc[4, "goodput_tok_s"] == 0.0
    assert json.loads(k2.loc[1, "slo"]) == SLO
    pays = {(r["config_id"], r["axis"]): r for r in crossover.table(df).to_dict("records")}
    got = pays[("tp1-ngram-k2", "concurrency")]
    assert got["goodput_crossover"] == pytest.approx(2 + 0.2 / 1.2 * 2)
    assert got["max_load_within_slo"] == "c2"
    assert pays[("tp1-autoregressive", "concurrency")]["max_load_within_slo"] == "c8"


def test_open_loop_rates_cross_with_all_at_once_last(tmp_path: Path) -> None:
    """qsort at 1, 2, 4 req/s and all at once (4 requests a repetition, each sent on time): the crossover between
    2 and 4 req/s, the rate each repetition achieved, and the rows kept apart from the closed-loop ones."""
    run_dir = write_run(tmp_path)
    df = table(load_run(run_dir))
    rate_rows = df[df["request_rate"].notna()]
    assert sorted(set(rate_rows["config_id"])) == ["tp1-autoregressive", "tp1-ngram-k2"]
    assert set(rate_rows["concurrency"]) == {0}
    k2 = rate_rows[rate_rows["config_id"] == "tp1-ngram-k2"].set_index("request_rate")
    assert list(k2.index) == [1.0, 2.0, 4.0, math.inf]
    assert k2.loc[2.0, "achieved_rate"] == pytest.approx(2.0)
    assert k2.loc[2.0, "send_lag_p99_s"] == 0.0 and "behind_schedule" not in k2.loc[2.0, "flags"]
    assert pd.isna(k2.loc[math.inf, "achieved_rate"])  # all sent at once: no rate to speak of
    got = pays_of(run_dir)[("ngram-k2", "request_rate")]
    assert got["crossover"] == pytest.approx(3.0)
    assert got["loads"] == "1 req/s, 2 req/s, 4 req/s, all at once"
    doc = json.loads(render(load_run(run_dir), "json"))
    assert {r["request_rate"] for r in doc["rows"]} == {None, 1, 2, 4, "inf"}
    assert any(r["axis"] == "request_rate" and r["crossover"] == pytest.approx(3.0)
               for r in doc["where_speculation_pays"])


@pytest.mark.parametrize("late, flagged", [(0.0, False), (0.05, False), (0.3, True)])
def test_a_client_that_sent_late_is_flagged_behind_schedule(tmp_path: Path, late: float, flagged: bool) -> None:
    """Every other request of the open-loop cells sent `late` seconds after it was due: the p99 of the lag is
    reported, and past 0.1 s the cell is flagged; closed-loop cells have no schedule to keep."""
    df = table(load_run(write_run(tmp_path, late=late)))
    opened = df[df["request_rate"].notna()]
    assert list(opened["send_lag_p99_s"]) == pytest.approx([late] * len(opened), abs=1e-9)
    assert {"behind_schedule" in f.split(",") for f in opened["flags"]} == {flagged}
    closed = df[df["request_rate"].isna()]
    assert closed["send_lag_p99_s"].isna().all() and not closed["flags"].str.contains("behind_schedule").any()


def test_the_report_shows_where_speculation_pays(tmp_path: Path) -> None:
    """report.md's section: one row per config swept over loads with its crossover, the failed load named, the
    limits in words; the html page has the section and the plot with a star per crossover."""
    run_dir = write_run(tmp_path)
    md = render(load_run(run_dir), "md", wide=True)
    section = md[md.index("## Where speculation pays"):md.index("### Per load")]
    rows = {(r["config"], r["cell"]): r for r in tables_of(section)}
    k2 = rows[("tp1-ngram-k2", "fib, 64 tok")]
    assert (k2["best"], k2["pays at"], k2["within limits up to"]) == ("1.50x at c1", "c1–c2", "c2")
    assert k2["crossover"].startswith("3 (") and k2["goodput crossover"].startswith("2.33 (")
    never = rows[("tp1-ngram-k4", "fib, 64 tok")]
    assert (never["loads"], never["best"], never["pays at"], never["crossover"]) == (
        "c1, c2, c4, c8", "0.90x at c1", "nowhere measured", "never pays")
    assert rows[("tp1-ngram-k3", "fib, 64 tok")]["not measured"] == "c4: no ok request"
    assert rows[("tp1-ngram-k2", "qsort, 64 tok")]["loads"] == "1 req/s, 2 req/s, 4 req/s, all at once"
    assert "Latency limits: ttft ≤ 500 ms (90% of requests)" in section
    start = md.index("### Per load")
    per_load = {(r["cell"], r["config"]): r for r in tables_of(md[start:md.index("\n## ", start)])}
    assert per_load[("fib, 64 tok, c4", "tp1-ngram-k2")]["within limits"] == "0%"  # all missed the TTFT limit
    assert float(per_load[("qsort, 64 tok, 2 req/s", "tp1-ngram-k2")]["achieved req/s"]) == 2.0
    assert collector_main(["report", str(run_dir), "--write"]) == 0
    svg = (run_dir / "plots" / "throughput-vs-latency-cpu1-tp1.svg").read_text()
    assert 'id="p0-crossover-tp1-ngram-k2"' in svg and 'id="p0-crossover-tp1-ngram-k3"' in svg
    assert "crossover-tp1-ngram-k4" not in svg.split('id="p1')[0]  # never crosses: no star
    assert 'id="pays"' in (run_dir / "report.html").read_text()


def test_compare_calls_a_crossover_that_moved_down_a_regression(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """ngram-k2 at c2 is 1.10x the baseline in A and 1.05x in B (each repetition within 0.1%): no cell regressed
    past the 5% threshold, but its crossover moved from c2.67 to c2.4, intervals apart: exit 1 on that alone. The
    other way round it moved up: exit 0."""
    narrow = (0.999, 1.0, 1.001)
    a = write_run(tmp_path / "a", {**RATIOS, "ngram-k2": [1.5, 1.1, 0.8, 0.6]}, spread=narrow, with_open=False)
    b = write_run(tmp_path / "b", {**RATIOS, "ngram-k2": [1.5, 1.05, 0.8, 0.6]}, spread=narrow, with_open=False)
    assert collector_main(["compare", str(a), str(b), "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["regressed"] == [] and doc["broken"] == []
    moved = {(m["config_id"], m["what"]): m for m in doc["crossovers"]}
    assert moved[("tp1-ngram-k2", "throughput")]["moved"] == "down"
    # its goodput (every request misses the TTFT limit from c4 on) crossed 1 at c2.18 and now at c2.10
    assert doc["crossovers_moved_down"] == ["cpu1 tp1-ngram-k2, fib, 64 tok over concurrency (throughput)",
                                            "cpu1 tp1-ngram-k2, fib, 64 tok over concurrency (goodput)"]
    assert moved[("tp1-ngram-k4", "throughput")]["moved"] == "same"  # never pays in either
    assert moved[("tp1-draft_model-k3", "throughput")]["moved"] == "same"  # pays everywhere in both
    assert collector_main(["compare", str(b), str(a)]) == 0
    text = capsys.readouterr().out
    assert "## Where speculation stops paying" in text
    assert "cpu1 tp1-ngram-k2, fib, 64 tok over concurrency (throughput): A 2.4" in text and "moved up" in text

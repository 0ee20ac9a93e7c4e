"""Packed configs in the report. A config that ran beside others (status.json `neighbours`) is flagged `packed`,
its slot and neighbours named where the flags are explained. The pack check (config.json `pack_check_of`: the
phase's baseline measured again while the other slots are busy) is never the baseline and no row of the speedup
table; it has its own section, "Baseline alone vs packed", in every format and in report-pack-check.csv.
Every expected figure is worked out by hand.
"""
from __future__ import annotations

import csv
import io
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from collector import PACK_FILE
from collector.__main__ import main as collector_main
from collector.load import load_run
from collector.report import render
from collector.tables.pack_check import pack_check
from collector.tables.speedup import table
from tests.collector.test_checks import patch_status
from tests.collector.test_collector import FIB, MAX_TOKENS, cell, make_config, make_run, row

BASE, CHECK = "tp1-autoregressive", "tp1-autoregressive-packed"
T4 = 2.7764451051977987  # Student t 0.975 quantile, 4 degrees of freedom
HALF = T4 * math.sqrt(1 / 54)  # every sample below is mean x (5/6, 1, 7/6): the interval is ratio x exp(+-HALF)
QSORT = ("qsort", MAX_TOKENS, 0, 1)


def unwrapped(md: str) -> str:
    """The md report with each wrapped paragraph or list item back on one line (the default md fits 120
    columns)."""
    return re.sub(r"\n +(?=\S)", " ", md)


def near(cid: str, slot: int, up: float, timed: float) -> dict[str, Any]:
    return {"config_id": cid, "slot": slot, "overlap_s": up, "timed_overlap_s": timed}


def patch_config(folder: Path, **fields: Any) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


@pytest.fixture()
def run_dir(tmp_path: Path) -> Path:
    """One packed phase on h1: the baseline alone (fib 10/12/14, qsort 20/24/28), its pack check beside DFlash
    (80 s of timed requests together) and n-gram (up together, never measuring together: 0 s), at 0.9 of the
    baseline on fib (9/10.8/12.6) and 1.0 on qsort; DFlash (fib 20/24/28) on slot 1 beside the pack check and
    n-gram; n-gram on slot 2, its fib 30/36/42."""
    run = make_run(tmp_path)
    make_config(run, "h1", BASE, method="autoregressive", cells=[cell("fib"), cell("qsort")],
                samples={FIB: [10.0, 12.0, 14.0], QSORT: [20.0, 24.0, 28.0]})
    check = make_config(run, "h1", CHECK, method="autoregressive", cells=[cell("fib"), cell("qsort")],
                        samples={FIB: [9.0, 10.8, 12.6], QSORT: [20.0, 24.0, 28.0]})
    patch_config(check, pack_check_of=BASE)
    patch_status(check, slot={"index": 0, "gpus": [0], "cpus": "0-3"},
                 neighbours=[near("tp1-dflash", 1, 95.0, 80.0), near("tp1-ngram", 2, 30.0, 0.0)])
    dflash = make_config(run, "h1", "tp1-dflash", method="dflash", method_params={"block_size": 16},
                         cells=[cell("fib")], samples={FIB: [20.0, 24.0, 28.0]})
    patch_status(dflash, slot={"index": 1, "gpus": [1, 2], "cpus": None},
                 neighbours=[near(CHECK, 0, 95.0, 80.0), near("tp1-ngram", 2, 40.0, 12.5)])
    ngram = make_config(run, "h1", "tp1-ngram", method="ngram", method_params={"num_speculative_tokens": 2},
                        cells=[cell("fib")], samples={FIB: [30.0, 36.0, 42.0]})
    patch_status(ngram, neighbours=[near(CHECK, 0, 30.0, 0.0), near("tp1-dflash", 1, 40.0, 12.5)])
    return run


def test_the_pack_check_is_neither_baseline_nor_row(run_dir: Path) -> None:
    """Speedups are against the baseline measured alone: DFlash 24 / 12 = 2 (against the pack check's 10.8 it
    would be 2.22), n-gram 36 / 12 = 3; the pack check has no row, in the table or the hand-run lines."""
    df = table(load_run(run_dir))
    assert CHECK not in set(df["config_id"])
    assert row(df, "h1", "tp1-dflash")["speedup"] == pytest.approx(2.0)
    assert row(df, "h1", "tp1-ngram")["speedup"] == pytest.approx(3.0)
    assert row(df, "h1", BASE)["speedup"] == pytest.approx(1.0)
    assert row(df, "h1", BASE, "qsort")["tok_s_mean"] == pytest.approx(24.0)
    md = render(load_run(run_dir), "md")
    assert f"h1 {CHECK}:" not in md.split("```")[1]


def test_a_config_beside_others_is_flagged_packed_with_its_neighbours_named(run_dir: Path) -> None:
    df = table(load_run(run_dir))
    dflash, ngram, base = row(df, "h1", "tp1-dflash"), row(df, "h1", "tp1-ngram"), row(df, "h1", BASE)
    assert dflash["flags"] == ngram["flags"] == "packed,noisy"  # noisy: every sample here varies by 1/6
    assert base["flags"] == "noisy" and base["checks"] == ""  # the baseline ran alone: no neighbours
    assert dflash["checks"] == ("packed on slot 1 (GPUs 1,2) beside tp1-autoregressive-packed (slot 0: 95.0 s up "
                                "together, 80.0 s measuring together), tp1-ngram (slot 2: 40.0 s up together, 12.5 s "
                                "measuring together)")
    assert ngram["checks"].startswith("packed beside tp1-autoregressive-packed (slot 0: 30.0 s up together, 0.0 s")
    md = render(load_run(run_dir), "md")
    assert "## Checks that did not pass, and packing" in md
    assert f"- h1 tp1-dflash [packed,noisy]: {dflash['checks']}" in unwrapped(md)
    assert "[packed,noisy]" in md.split("```")[1]  # the hand-run lines say it too
    rows = {(r["config_id"], r["workload"]): r for r in csv.DictReader(io.StringIO(render(load_run(run_dir), "csv")))}
    assert rows[("tp1-ngram", "fib")]["flags"] == "packed,noisy"
    doc = json.loads(render(load_run(run_dir), "json"))
    assert {r["config_id"]: r["flags"] for r in doc["rows"]}["tp1-dflash"] == "packed,noisy"


def test_baseline_alone_against_packed_by_cell(run_dir: Path) -> None:
    """fib: alone 12 ± 2 (n=3), packed 10.8 ± 1.8 (n=3), packed/alone 0.9 in 0.9 x exp(+-HALF) = [0.62, 1.31]:
    not significant. qsort: 24 and 24, ratio 1 in exp(+-HALF). Measuring beside it: DFlash (80 s), not n-gram
    (0 s of timed requests together)."""
    checked = pack_check(load_run(run_dir)).set_index("workload")
    assert list(checked.index) == ["fib", "qsort"]
    fib, qsort = checked.loc["fib"], checked.loc["qsort"]
    assert (fib["baseline_config_id"], fib["pack_check_config_id"]) == (BASE, CHECK)
    assert (fib["alone_n"], fib["packed_n"], fib["alone_status"], fib["packed_status"]) == (3, 3, "ok", "ok")
    assert (fib["alone_tok_s_mean"], fib["alone_tok_s_std"]) == pytest.approx((12.0, 2.0))
    assert (fib["packed_tok_s_mean"], fib["packed_tok_s_std"]) == pytest.approx((10.8, 1.8))
    assert fib["packed_over_alone"] == pytest.approx(0.9)
    assert fib["packed_over_alone_ci_low"] == pytest.approx(0.9 * math.exp(-HALF), rel=1e-9)
    assert fib["packed_over_alone_ci_high"] == pytest.approx(0.9 * math.exp(HALF), rel=1e-9)
    assert fib["packed_over_alone_significant"] == "no"
    assert qsort["packed_over_alone"] == pytest.approx(1.0)
    assert qsort["packed_over_alone_ci_high"] == pytest.approx(math.exp(HALF), rel=1e-9)
    assert fib["beside"] == qsort["beside"] == "tp1-dflash (slot 1): 80.0 s"


def test_the_section_in_every_format_and_its_csv(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert collector_main(["report", str(run_dir), "--format", "md", "--write"]) == 0
    bullet = f"- h1 `{CHECK}` (`{BASE}` measured again), measuring beside: tp1-dflash (slot 1): 80.0 s"
    assert bullet in unwrapped(capsys.readouterr().out)
    md = render(load_run(run_dir), "md", wide=True)  # each table whole (by default split to fit 120 columns)
    start = md.index("## Baseline alone vs packed")
    section = md[start:md.index("\n## ", start)]
    assert bullet in section
    lines = [line for line in section.splitlines() if line.startswith("| h1")]
    assert len(lines) == 2
    assert [c.strip() for c in lines[0].strip("|").split("|")] == [
        "h1", "1", "fib, 128 tok", BASE, "12.0 ± 2.0 (n=3)", "10.8 ± 1.8 (n=3)",
        f"0.90 [{0.9 * math.exp(-HALF):.2f}, {0.9 * math.exp(HALF):.2f}]", "no"]
    got = list(csv.DictReader(io.StringIO((run_dir / PACK_FILE).read_text())))
    assert [(r["workload"], r["alone_tok_s_mean"], r["packed_tok_s_mean"], r["packed_over_alone"], r["beside"])
            for r in got] == [("fib", "12.0000", "10.8000", "0.9000", "tp1-dflash (slot 1): 80.0 s"),
                              ("qsort", "24.0000", "24.0000", "1.0000", "tp1-dflash (slot 1): 80.0 s")]
    doc = json.loads((run_dir / "report.json").read_text())
    assert [(r["workload"], r["packed_over_alone"]) for r in doc["baseline_alone_vs_packed"]] == [
        ("fib", pytest.approx(0.9)), ("qsort", pytest.approx(1.0))]
    assert CHECK not in {r["config_id"] for r in doc["rows"]}
    # the pack check gone (a run re-reported after it was removed): the stale file goes too
    for f in (run_dir / "h1" / CHECK).iterdir():
        f.unlink()
    (run_dir / "h1" / CHECK).rmdir()
    assert collector_main(["report", str(run_dir), "--format", "csv", "--write"]) == 0
    assert not (run_dir / PACK_FILE).exists()
    assert json.loads((run_dir / "report.json").read_text())["baseline_alone_vs_packed"] == []
    assert "Baseline alone vs packed" not in (run_dir / "report.md").read_text()


def test_a_failed_pack_check_keeps_its_row_with_the_reason(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    make_config(run, "h1", BASE, method="autoregressive", cells=[cell("fib")], samples={FIB: [10.0, 12.0, 14.0]})
    check = make_config(run, "h1", CHECK, method="autoregressive", cells=[cell("fib")], status="failed",
                        reason="oom")
    patch_config(check, pack_check_of=BASE)
    checked = pack_check(load_run(run))
    assert len(checked) == 1
    r = checked.iloc[0]
    assert (r["alone_status"], r["alone_n"], r["packed_status"], r["packed_n"]) == ("ok", 3, "oom", 0)
    assert pd_na(r["packed_over_alone"]) and r["packed_over_alone_significant"] == "" and r["beside"] == ""
    md = render(load_run(run), "md")
    assert "| oom" in md[md.index("## Baseline alone vs packed"):]
    assert "no other config was in its timed requests at the same time" in unwrapped(md)
    assert CHECK not in set(table(load_run(run))["config_id"])


def test_a_pack_check_that_lost_its_config_json_is_still_no_baseline(run_dir: Path) -> None:
    """config.json gone: the identity comes from the request lines, and `<baseline>-packed` beside its baseline is
    still taken for the pack check (else it would pair with DFlash as a second baseline: 24 / 10.8)."""
    (run_dir / "h1" / CHECK / "config.json").unlink()
    run = load_run(run_dir)
    assert any(f"{CHECK}/config.json: missing" in p for p in run.problems)
    df = table(run)
    assert CHECK not in set(df["config_id"])
    assert row(df, "h1", "tp1-dflash")["speedup"] == pytest.approx(2.0)
    assert pack_check(run).set_index("workload").loc["fib", "packed_over_alone"] == pytest.approx(0.9)


def test_runs_without_packing_are_reported_as_before(tmp_path: Path) -> None:
    """No neighbours, no pack_check_of (older runs): no flag, no section, an empty list in report.json, and a
    config named `...-packed` whose config.json says nothing of a pack check is an ordinary row."""
    run = make_run(tmp_path)
    make_config(run, "h1", BASE, method="autoregressive", cells=[cell("fib")], samples={FIB: [10.0, 12.0, 14.0]})
    make_config(run, "h1", "tp1-dflash-packed", method="dflash", cells=[cell("fib")], samples={FIB: [20.0, 24.0, 28.0]})
    loaded = load_run(run)
    df = table(loaded)
    assert not any("packed" in f for f in df["flags"])
    assert row(df, "h1", "tp1-dflash-packed")["speedup"] == pytest.approx(2.0)
    assert pack_check(loaded).empty
    md = render(loaded, "md")
    assert "[packed" not in md and "Baseline alone vs packed" not in md and ", and packing" not in md
    assert json.loads(render(loaded, "json"))["baseline_alone_vs_packed"] == []


def test_damaged_neighbours_do_not_stop_the_report(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    make_config(run, "h1", BASE, method="autoregressive", cells=[cell("fib")], samples={FIB: [10.0, 12.0, 14.0]})
    spec = make_config(run, "h1", "tp1-ngram", method="ngram", cells=[cell("fib")], samples={FIB: [15.0, 15.0, 15.0]})
    patch_status(spec, slot="one", neighbours=["tp1-x", {"config_id": "tp1-y", "timed_overlap_s": "long"}])
    r = row(table(load_run(run)), "h1", "tp1-ngram")
    assert r["flags"] == "packed"  # 15, 15, 15: not noisy
    assert r["checks"] == "packed beside tp1-x, tp1-y (slot None: ? s up together, ? s measuring together)"
    assert "Baseline alone vs packed" not in render(load_run(run), "md")


def pd_na(v: Any) -> bool:
    return v is None or v != v

"""`compare RUN_A RUN_B`: two results folders built on disk per the results contract (one host, the same configs
before and after an engine bump), compared in-process and through the command line in a subprocess. The expected
ratios are worked out by hand, their intervals by an independent computation of the report's interval.

Run A (before) and run B (after), cell fib (128 tokens) unless said otherwise:
- tp1-autoregressive: the same samples in both; B also measures qsort (a cell only in B);
- tp1-dflash: 20% slower in B with tight repetitions (relative std 1%): regressed;
- tp1-ngram: 2% slower in B with noisy repetitions (relative std 20%): no significant change;
- tp1-draft_model: 3% slower in B, tight: slower, but within the default 5% threshold (a regression at 2%);
- tp1-ddtree-b8, -b32: the same in both; -b16 failed with oom in B; -b64 only in A.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import pytest

from collector.__main__ import COMMANDS, add_command
from collector.compare import compare
from collector.load import load_run
from collector.views import WIDTH
from tests.collector.test_collector import cell, expected_log_ratio_ci, make_config, make_run

REPO = Path(__file__).resolve().parents[2]
HOST = "h1"
TIGHT = [99.0, 100.0, 101.0]  # relative std 1%
NOISY = [80.0, 100.0, 120.0]  # relative std 20%
FIB, QSORT = ("fib", 128, 0, 1), ("qsort", 128, 0, 1)
BEFORE = {"commit": "1111aaaa2222", "patches": ["0001-ddtree.patch"], "driver": "550.54.15"}
AFTER = {"commit": "3333bbbb4444", "patches": ["0001-ddtree.patch", "0002-ddtree-budget.patch"],
         "driver": "560.35.03"}


def scaled(xs: Sequence[float], factor: float) -> list[float]:
    return [x * factor for x in xs]


def write_host(run_dir: Path, env: dict[str, Any]) -> None:
    """host.json with the engine build and driver of `env`."""
    path = run_dir / HOST / "host.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({
        "host": HOST, "hostname": HOST,
        "gpus": {"count": 1, "driver_version": env["driver"], "cuda_version": "12.4",
                 "devices": [{"name": "NVIDIA H200", "memory_total_mib": 143771}]},
        "engine": {"name": "vllm", "version": "0.1.0", "commit": env["commit"], "patches": env["patches"]}}))


def write_run(root: Path, run_id: str, env: dict[str, Any], tok: Mapping[str, Optional[list[float]]],
              failed: Sequence[str] = (), qsort: bool = False) -> Path:
    """One run: a config per entry of `tok` (its fib samples; None: not in this run), those in `failed` failed
    with oom, the baseline also measuring qsort when `qsort`."""
    run_dir = make_run(root, run_id)
    write_host(run_dir, env)
    for config_id, samples in tok.items():
        if samples is None:
            continue
        method = config_id.split("-")[1]
        params = {"budget": int(config_id.rsplit("-b", 1)[1])} if method == "ddtree" else {}
        cells, by_cell = [cell("fib")], {FIB: samples}
        if qsort and method == "autoregressive":
            cells.append(cell("qsort"))
            by_cell[QSORT] = TIGHT
        if config_id in failed:
            make_config(run_dir, HOST, config_id, method=method, method_params=params, cells=cells,
                        status="failed", reason="oom")
        else:
            make_config(run_dir, HOST, config_id, method=method, method_params=params, cells=cells,
                        samples=by_cell)
    return run_dir


DFLASH_A = scaled(TIGHT, 2.0)
DFLASH_B = scaled(DFLASH_A, 0.8)
A_TOK = {"tp1-autoregressive": TIGHT, "tp1-dflash": DFLASH_A, "tp1-ngram": NOISY, "tp1-draft_model": scaled(TIGHT, 1.2),
         **{f"tp1-ddtree-b{b}": scaled(TIGHT, 1.5) for b in (8, 16, 32, 64)}}
B_TOK = {**A_TOK, "tp1-dflash": DFLASH_B, "tp1-ngram": scaled(NOISY, 0.98),
         "tp1-draft_model": scaled(A_TOK["tp1-draft_model"], 0.97), "tp1-ddtree-b64": None}


@pytest.fixture()
def runs(tmp_path: Path) -> tuple[Path, Path]:
    return (write_run(tmp_path / "a", "before", BEFORE, A_TOK),
            write_run(tmp_path / "b", "after", AFTER, B_TOK, failed=["tp1-ddtree-b16"], qsort=True))


def parser() -> argparse.ArgumentParser:
    """A command line with the `compare` subcommand, as the collector's wires it up."""
    p = argparse.ArgumentParser(prog="collector")
    add_command(p.add_subparsers(dest="cmd", required=True), COMMANDS["compare"])
    return p


def run_cli(*argv: str) -> int:
    """`compare ARGV...` in this process: its exit status."""
    args = parser().parse_args(["compare", *argv])
    return int(args.func(args))


def by_config(result: Any, config_id: str, workload: str = "fib") -> Any:
    found = [c for c in result.rows if c.config_id == config_id and c.workload == workload]
    assert len(found) == 1, found
    return found[0]


def test_twenty_percent_slower_with_tight_repetitions_regressed(runs: tuple[Path, Path]) -> None:
    """B ÷ A = 0.8 exactly, with the report's interval for a ratio of means; only that cell regressed."""
    result = compare(load_run(runs[0]), load_run(runs[1]))
    dflash = by_config(result, "tp1-dflash")
    assert dflash.ratio == pytest.approx(0.8)
    lo, hi = expected_log_ratio_ci(DFLASH_B, DFLASH_A)
    assert (dflash.ci_low, dflash.ci_high) == (pytest.approx(lo), pytest.approx(hi))
    assert hi < 1
    assert [c.config_id for c in result.regressed] == ["tp1-dflash"]
    assert result.text().split("## Regressed\n\n", 1)[1].startswith("- h1 tp1-dflash, fib, 128 tok: 0.80 [")


def test_small_changes_do_not_regress(runs: tuple[Path, Path]) -> None:
    """2% slower with noisy repetitions: the interval spans 1. 3% slower with tight ones: slower, but within the
    5% threshold; at a 2% threshold it regressed."""
    a, b = load_run(runs[0]), load_run(runs[1])
    result = compare(a, b)
    ngram = by_config(result, "tp1-ngram")
    assert ngram.ratio == pytest.approx(0.98)
    assert ngram.ci_low < 1 < ngram.ci_high
    assert ngram.verdict == "not_significant"
    draft = by_config(result, "tp1-draft_model")
    assert draft.ratio == pytest.approx(0.97)
    assert draft.ci_high < 1
    assert draft.verdict == "slower_within_threshold"
    assert by_config(result, "tp1-ddtree-b8").verdict == "not_significant"  # the same samples in both
    assert sorted(c.config_id for c in compare(a, b, threshold=0.02).regressed) == ["tp1-dflash", "tp1-draft_model"]


def test_swapped_runs_improve(runs: tuple[Path, Path]) -> None:
    """A against B: the 20% slowdown is a 25% improvement (named as such, exit status unaffected: none regressed),
    the 3% slowdown a gain within the threshold; B's failed cell is now on side A."""
    result = compare(load_run(runs[1]), load_run(runs[0]))
    assert (by_config(result, "tp1-dflash").ratio, by_config(result, "tp1-dflash").verdict) == (
        pytest.approx(1.25), "improved")
    assert by_config(result, "tp1-draft_model").verdict == "faster_within_threshold"
    assert result.regressed == []
    assert "## Improved\n\n- h1 tp1-dflash, fib, 128 tok: 1.25 [" in result.text()
    assert by_config(result, "tp1-ddtree-b16").a.status == "failed: oom"


def test_cells_in_one_run_and_failed_cells_listed(runs: tuple[Path, Path]) -> None:
    """ddtree-b64 only in A, the baseline's qsort only in B, ddtree-b16 failed with oom in B: each listed with
    what its run measured, none with a ratio and none regressed."""
    result = compare(load_run(runs[0]), load_run(runs[1]))
    only_a, only_b = by_config(result, "tp1-ddtree-b64"), by_config(result, "tp1-autoregressive", "qsort")
    failed = by_config(result, "tp1-ddtree-b16")
    assert (only_a.verdict, only_a.b, only_b.verdict, only_b.a) == ("only_a", None, "only_b", None)
    assert (failed.verdict, failed.a.status, failed.b.status) == ("not_ok", "ok", "failed: oom")
    assert [c.ratio for c in (only_a, only_b, failed)] == [None, None, None]
    text = result.text()
    assert "## Only in A\n\n- h1 tp1-ddtree-b64, fib, 128 tok: 150.0 ± 1.5 tok/s (n=3)\n" in text
    assert "## Only in B\n\n- h1 tp1-autoregressive, qsort, 128 tok: 100.0 ± 1.0 tok/s (n=3)\n" in text
    assert ("## Failed or skipped in a run\n\n"
            "- h1 tp1-ddtree-b16, fib, 128 tok: A 150.0 ± 1.5 tok/s (n=3); B failed: oom\n") in text
    assert result.counts()["only_a"] == result.counts()["only_b"] == result.counts()["not_ok"] == 1


def test_environment_differences_shown(runs: tuple[Path, Path]) -> None:
    """Engine commit, patches and driver, each with its value in A and in B; none when a run meets itself."""
    a, b = load_run(runs[0]), load_run(runs[1])
    text = compare(a, b).text()
    section = text.split("## Environment differences\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    for before, after in ((BEFORE["commit"], AFTER["commit"]), (BEFORE["driver"], AFTER["driver"]),
                          (", ".join(BEFORE["patches"]), ", ".join(AFTER["patches"]))):
        assert [line for line in section if line.endswith(f": {before} → {after}")], (before, section)
    assert len(section) == 3
    same = compare(a, load_run(runs[0])).text()
    assert "## Environment differences\n\nnone\n" in same


def test_text_fits_120_columns_and_sorts_budgets_by_number(runs: tuple[Path, Path]) -> None:
    """The default text stays within 120 columns, the wide one lays every column out in one table; rows, text
    and JSON list DDTree budgets 8, 16, 32, 64 in that order, after the baseline."""
    result = compare(load_run(runs[0]), load_run(runs[1]))
    text, wide = result.text(), result.text(wide=True)
    assert max(map(len, text.splitlines())) <= WIDTH
    assert max(map(len, wide.splitlines())) > WIDTH
    header = wide.split("## Every cell\n\n", 1)[1].splitlines()[0]
    assert [h.strip() for h in header.strip("|").split("|")] == [
        "host", "engine", "model", "tp", "workload", "max_tokens", "context_tokens", "concurrency", "request_rate",
        "config_id",
        "method", "method_params", "a_n", "a_tok_s_mean", "a_tok_s_std", "a_status", "a_engine", "b_n",
        "b_tok_s_mean", "b_tok_s_std", "b_status", "b_engine", "ratio", "ci_low", "ci_high", "verdict"]
    budgets = ["tp1-ddtree-b8", "tp1-ddtree-b16", "tp1-ddtree-b32", "tp1-ddtree-b64"]
    assert [c.config_id for c in result.rows if c.workload == "fib"] == [
        "tp1-autoregressive", "tp1-dflash", *budgets, "tp1-draft_model", "tp1-ngram"]
    table = text.split("### h1 (vllm) tp1: fib, 128 tok\n\n", 1)[1].split("\n\n", 1)[0]
    assert table.index("| tp1-ddtree-b8 ") < table.index("| tp1-ddtree-b32 ")
    assert "tp1-ddtree-b16" not in table  # failed in B: listed below, not in the table
    doc = json.loads(result.to_json())
    assert [c["config_id"] for c in doc["cells"] if "ddtree" in c["config_id"]] == budgets


def test_command_exits_1_naming_the_regression(runs: tuple[Path, Path]) -> None:
    """`python -m collector compare A B` in its own process: exit 1, the regressed cell named in the text."""
    res = subprocess.run([sys.executable, "-m", "collector", "compare", *map(str, runs)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stderr
    assert "## Regressed\n\n- h1 tp1-dflash, fib, 128 tok: 0.80 [" in res.stdout
    assert "| tp1-dflash " in res.stdout


def test_exit_codes_and_json(runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """JSON names the regressed cell (exit 1) and the broken one (ok in A, failed in B: exit 1 even at a
    threshold no cell exceeds); 0 for a run against itself; 2 for a missing folder, for one without results and for
    a threshold that is no fraction."""
    a, b = map(str, runs)
    assert run_cli(a, b, "--format", "json") == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["regressed"] == ["h1 tp1-dflash, fib, 128 tok"]
    assert (doc["run_a"], doc["run_b"], doc["threshold"]) == ("before", "after", 0.05)
    assert {"host": HOST, "label": "driver", "a": BEFORE["driver"], "b": AFTER["driver"]} in doc["environment"]
    assert doc["broken"] == ["h1 tp1-ddtree-b16, fib, 128 tok"]  # ok in A, failed (oom) in B: exit 1 on its own
    assert run_cli(a, b, "--threshold", "0.25") == 1
    capsys.readouterr()
    assert run_cli(a, b, "--threshold", "0.25", "--format", "json") == 1
    doc = json.loads(capsys.readouterr().out)
    assert (doc["regressed"], doc["broken"]) == ([], ["h1 tp1-ddtree-b16, fib, 128 tok"])
    assert run_cli(a, a) == 0
    capsys.readouterr()
    assert run_cli(a, str(tmp_path / "no-such-run")) == 2
    assert "no such run folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert run_cli(str(tmp_path / "empty"), b) == 2
    assert "no config results" in capsys.readouterr().err
    with pytest.raises(SystemExit) as bad:
        run_cli(a, b, "--threshold", "1.5")
    assert bad.value.code == 2
    assert "--threshold" in capsys.readouterr().err


def test_every_argument_has_help() -> None:
    """`compare --help` explains each argument."""
    subcommands = argparse.ArgumentParser().add_subparsers()
    add_command(subcommands, COMMANDS["compare"])
    sub = subcommands.choices["compare"]
    actions = [a for a in sub._actions if not isinstance(a, argparse._HelpAction)]
    assert {a.dest for a in actions} == {"run_a", "run_b", "threshold", "format", "wide"}
    assert all(a.help for a in actions)
    shown = sub.format_help()
    for a in actions:
        assert (a.option_strings[0] if a.option_strings else a.metavar) in shown

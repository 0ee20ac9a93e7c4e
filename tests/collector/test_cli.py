"""The `specfleet` command: every argument explained in --help, and a real install (`pip install .`, not in place)
whose command reports a run from any folder, without the project's checkout on the path."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from collector.__main__ import main
from tests.collector.test_collector import FIB, cell, make_config, make_run

ROOT = Path(__file__).resolve().parents[2]


def parsers() -> dict[str, argparse.ArgumentParser]:
    """The command's parser and each subcommand's, by name, as argparse built them."""
    captured: dict[str, argparse.ArgumentParser] = {}
    real = argparse.ArgumentParser.parse_args

    def grab(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> argparse.Namespace:
        captured["specfleet"] = self
        raise SystemExit(0)

    argparse.ArgumentParser.parse_args = grab  # type: ignore[method-assign,assignment]
    try:
        with pytest.raises(SystemExit):
            main([])
    finally:
        argparse.ArgumentParser.parse_args = real  # type: ignore[method-assign]
    top = captured["specfleet"]
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return {"specfleet": top, **sub.choices}


def test_every_argument_of_every_command_has_help_text() -> None:
    found = parsers()
    assert {"report", "compare", "plot", "where", "pull", "stamp", "unpack", "finish", "verdict"} <= set(found)
    missing = [f"{name} {a.dest}" for name, p in found.items() for a in p._actions
               if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) and not a.help]
    assert missing == []
    sub = next(a for a in found["specfleet"]._actions if isinstance(a, argparse._SubParsersAction))
    assert all(c.help for c in sub._choices_actions), "every command is listed with a line in specfleet --help"


@pytest.mark.slow
def test_pip_install_gives_a_specfleet_command_that_runs_without_the_checkout(tmp_path: Path) -> None:
    target = tmp_path / "site"
    res = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                          str(ROOT)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    command = target / "bin" / "specfleet"
    assert command.is_file()
    env = {**os.environ, "PYTHONPATH": str(target)}
    away = tmp_path / "elsewhere"
    away.mkdir()
    where = subprocess.run([sys.executable, "-c", "import collector, agent; print(collector.__file__, agent.__file__)"],
                           cwd=away, env=env, capture_output=True, text=True, timeout=60)
    assert where.stdout.split() == [str(target / "collector/__init__.py"), str(target / "agent/__init__.py")]
    shown = subprocess.run([sys.executable, str(command), "--help"], cwd=away, env=env, capture_output=True,
                           text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    for name in ("report", "compare", "plot", "pull"):
        assert name in shown.stdout
    missing = subprocess.run([sys.executable, str(command), "report", str(away / "no-such-run")], cwd=away, env=env,
                             capture_output=True, text=True, timeout=60)
    assert (missing.returncode, missing.stderr.strip()) == (2, f"no such run folder: {away / 'no-such-run'}")
    run_dir = make_run(tmp_path)
    make_config(run_dir, "h1", "tp1-autoregressive", method="autoregressive", cells=[cell("fib")],
                samples={FIB: [10.0, 12.0, 14.0]})
    make_config(run_dir, "h1", "tp1-dflash", method="dflash", method_params={"num_speculative_tokens": 4},
                cells=[cell("fib")], samples={FIB: [20.0, 24.0, 28.0]}, accept=[3.0, 3.5, 4.0])
    csv = subprocess.run([sys.executable, str(command), "report", str(run_dir), "--format", "csv"], cwd=away,
                         env=env, capture_output=True, text=True, timeout=120)
    assert csv.returncode == 0, csv.stderr
    lines = csv.stdout.splitlines()
    assert len(lines) == 3 and lines[0].startswith("host,") and "tp1-dflash" in lines[2]
    wrote = subprocess.run([sys.executable, str(command), "report", str(run_dir), "--write"], cwd=away, env=env,
                           capture_output=True, text=True, timeout=300)
    assert wrote.returncode == 0, wrote.stderr
    told = subprocess.run([sys.executable, str(command), "where", "--results", str(tmp_path / "results")], cwd=away,
                          env=env, capture_output=True, text=True, timeout=60)
    assert told.returncode == 0, told.stderr
    assert told.stdout.splitlines()[0].startswith(f"report: {run_dir / 'report.html'}")
    assert (run_dir / "report.html").stat().st_size > 0 and list((run_dir / "plots").glob("*.png"))


@pytest.mark.parametrize(("fail_on", "code"), [("none_ok", 0), ("any", 1), ("never", 0)])
def test_finish_closes_the_session_writes_the_report_and_judges_in_one_process(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], fail_on: str, code: int) -> None:
    """What the report step of the playbooks runs: run.json closed with the session's hosts, every report file
    written, the markdown report printed, then the verdict as one JSON line; exit 1 only when it fails."""
    run_dir = make_run(tmp_path)
    make_config(run_dir, "h1", "tp1-autoregressive", method="autoregressive", cells=[cell("fib")],
                samples={FIB: [10.0, 12.0, 14.0]})
    make_config(run_dir, "h1", "tp1-dflash", method="dflash", method_params={"num_speculative_tokens": 4},
                cells=[cell("fib")], status="failed", reason="oom")
    assert main(["finish", str(run_dir), "--suite", "s", "--fail-on", fail_on, "--hosts", "h1"]) == code
    out = capsys.readouterr().out.splitlines()
    verdict = json.loads(out[-1])
    assert verdict["ok"] is (code == 0)
    assert verdict["lines"][0].startswith("h1: 2 configs: 1 ok, 1 failed, 0 skipped (oom 1)")
    assert ("fails the run" in verdict["lines"][0]) is (code == 1)
    assert "\n".join(out[:-1]).strip() == (run_dir / "report.md").read_text().strip()
    for name in ("report.csv", "report.json", "report.html"):
        assert (run_dir / name).is_file(), name
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["finished_at"] != "2026-11-30T08:00:00+00:00" and meta["hosts"] == ["h1"] and meta["suite"] == "s"

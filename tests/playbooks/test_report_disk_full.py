"""The role's report step on a full disk, through real ansible-playbook: the controller's results folder is a small
tmpfs holding a run written by the agent's own record writers, filled; `bench.yml -l local --tags bench_report`
(the report step alone, as README's rebuild of a report) must fail with the step's own line (the space problem, its
path, exit status 3) and never read it as a verdict; with room again, the same command brings the run home."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tests import playbook
from tests.collector.test_exit_status import agent_run, files
from tests.disk import fill, tmpfs


def fatal(out: str, at: int) -> str:
    """The failed task's result that starts at line `at` of the output, its wrapped lines joined."""
    lines = out.splitlines()[at:]
    return " ".join(line.strip() for line in lines[:next((i for i, s in enumerate(lines) if not s.strip()),
                                                           len(lines))])


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_full_disk_fails_the_report_step_with_its_own_message_and_the_same_command_brings_the_run_home(
        tmp_path: Path) -> None:
    with tmpfs(tmp_path / "fs") as fs:
        run_dir = agent_run(fs / "results", "run-00", host="local")
        extra = tmp_path / "vars.yml"
        extra.write_text(yaml.safe_dump({"bench_controller_results": str(fs / "results"), "run_id": "run-00",
                                         "bench_report_plots": False}))
        args = ["bench.yml", "-l", "local", "--tags", "bench_report", "-e", f"@{extra}"]
        host_files = files(run_dir / "local")
        filler = fill(fs)
        full = playbook.play(args, timeout=300)
        assert full.rc != 0, full.out[-3000:]
        failed = [fatal(full.out, i) for i, line in enumerate(full.out.splitlines()) if line.startswith("fatal:")]
        assert len(failed) == 1, playbook.why(full.out)
        assert "msg: 'the report step (specfleet finish, exit status 3) failed: specfleet finish: closing the run " \
               f"and writing its report failed: {fs}/results/run-00/" in failed[0], failed[0]
        assert "No space left on device; free space on the filesystem that holds" in failed[0], failed[0]
        for wrong in ("from_json", "has no attribute", "Traceback", "bench_fail_on"):
            assert wrong not in full.out, wrong
        assert files(run_dir / "local") == host_files  # nothing lost
        filler.unlink()
        again = playbook.play(args, timeout=300)
        assert again.rc == 0, playbook.why(again.out)
        assert "local: 2 configs: 2 ok, 0 failed, 0 skipped" in again.out
        assert (run_dir / "report.md").read_text().startswith("# Run run-00")
        assert files(run_dir / "local") == host_files

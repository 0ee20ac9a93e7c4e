"""gpu_smoke through the real ansible-playbook on a machine without a GPU (connection local): in check mode its GPU
facts and CUDA checks are reported, not failed (in provision.yml --check the driver userspace and torch are not
installed yet when it runs); a real run fails on them."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests import playbook

pytestmark = pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU machine: tests/gpu runs there")


def smoke(*args: str) -> subprocess.CompletedProcess[str]:
    return playbook.play(["-i", "localhost,", "-c", "local", "tests/gpu/smoke.yml",
                          "-e", f"ansible_python_interpreter={sys.executable}",
                          "-e", "gpu_smoke_python=/no/such/python", *args], timeout=300).proc


def test_check_mode_reports_the_gpu_checks_instead_of_failing() -> None:
    run = smoke("--check")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "check mode: nvidia-smi failed" in run.stdout and "0 GPU(s) seen, 1 expected" in run.stdout
    assert "check mode: the smoke test failed: " in run.stdout


def test_a_real_run_fails_on_them() -> None:
    run = smoke()
    assert run.returncode != 0
    assert "nvidia-smi failed" in run.stdout and "Fail clearly on a driver/library version mismatch" in run.stdout

"""On a real NVIDIA host only (skipped elsewhere): GPU facts and the memory-release wait, live.

A child process in its own process group holds GPU memory; the test kills the group as the
suite does after a config and measures how long nvidia-smi takes to show the memory back.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from agent import fingerprint, gpu

pytestmark = pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="no nvidia-smi: not a GPU host")

HOLD = r"""
import sys, time, torch
x = torch.empty(int(sys.argv[1]) * 2**30, dtype=torch.uint8, device="cuda")
x.fill_(1); torch.cuda.synchronize()
print("held", flush=True)
time.sleep(600)
"""


def used() -> dict[int, int]:
    return gpu.used_by_index(gpu.parse_query_csv(gpu.query() or ""))


def test_fingerprint_reads_the_gpus() -> None:
    info = fingerprint.gpus()
    print("gpus:", {k: v for k, v in info.items() if k != "topology"})
    assert info["count"] >= 1 and info["driver_version"] and info["cuda_version"]
    assert info["devices"][0]["memory.total"] > 0
    assert gpu.driver_from_proc(open("/proc/driver/nvidia/version").read()) == info["driver_version"] \
        if os.path.exists("/proc/driver/nvidia/version") else True


def test_memory_release_after_killing_the_group() -> None:
    idle = used()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, "20"], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        held = used()
        print("idle MiB", idle, "held MiB", held)
        assert not gpu.released(idle, held)
        t0 = time.monotonic()
        ok, now = gpu.wait_released(idle, 2.0)  # still held: the next config must not start
        assert not ok and time.monotonic() - t0 >= 2.0
        t_kill = time.monotonic()
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        t_exit = time.monotonic() - t_kill
        ok, now = gpu.wait_released(idle, 60.0, interval=0.05)
        t_free = time.monotonic() - t_kill
        print(f"kill->exit {t_exit:.3f} s, kill->memory released {t_free:.3f} s, used after {now}")
        assert ok
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)

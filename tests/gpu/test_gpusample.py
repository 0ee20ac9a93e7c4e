"""On a real NVIDIA host only (skipped elsewhere): the GPU-state sampler against the real driver.

One nvidia-smi samples at 1 Hz while a child process runs bf16 matrix products; the lines must come
in as they are sampled (about one a second on this host's clock, not in bursts), the driver must
answer one of the reason prefixes, its Active/Not Active answers must agree with the bitmask as
decoded here, and no nvidia-smi may be left after the block.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent import gpu, gpusample, records

pytestmark = pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="no nvidia-smi: not a GPU host")

LOAD = r"""
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    for _ in range(20): c = a @ b
    torch.cuda.synchronize()
"""


def smi_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and (p / "comm").exists()
            and (p / "comm").read_text().strip() == "nvidia-smi"]


def test_sampler_on_the_real_gpu(tmp_path: Path) -> None:
    before = smi_pids()
    path = tmp_path / "gpu.jsonl"
    with gpusample.Sampler(path) as s:
        end = time.monotonic() + 30  # a hang detector: the first sample is the driver's to give
        while not (path.exists() and path.read_text().count("\n") >= 1):
            assert time.monotonic() < end, "no sample from nvidia-smi within 30 s"
            time.sleep(0.05)
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-c", LOAD, "5"], check=True, timeout=120)
        t1 = time.monotonic()
    assert smi_pids() == before, "nvidia-smi left running"
    rows = gpusample.read(path)
    print("prefix", s.prefix, "lines", len(rows), "note", s.note)
    assert s.prefix in gpu.REASON_PREFIXES and s.note is None
    assert all(records.problem(r, records.GPU_SAMPLE) is None for r in rows)
    gpu0 = [r for r in rows if r["index"] == rows[0]["index"]]
    gaps = [b["mono_s"] - a["mono_s"] for a, b in zip(gpu0, gpu0[1:])]
    # as sampled, not in bursts (a buffered pipe gives gaps near 0); how late a line may come is the host's load
    assert gaps and all(g > 0.5 for g in gaps[1:]), gaps
    for r in rows:
        for reason in gpu.THROTTLE_KINDS:
            assert r[reason] == bool(r["reasons_mask"] & gpu.REASON_BITS[reason]), r
    state = s.summary(t0, t1)
    print(state)
    assert state is not None and state["samples"] >= 4
    g = state["gpus"][0]
    assert g["clocks.sm"]["max"] > 0 and g["power.draw"]["max"] > 0 and g["utilization.gpu"]["max"] >= 50

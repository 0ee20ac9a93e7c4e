"""On a real NVIDIA host only (skipped elsewhere): a packed suite with one GPU slot per GPU, run by the agent for
real with the stand-in engine (tests/standin/engine.py, not an inference engine) as every server.

Each server must see exactly its slot's GPU (device_count, CUDA_VISIBLE_DEVICES, the UUID nvidia-smi gives that
index), its memory must show on that GPU while it runs and on no GPU while nothing holds it, and the release
check before a config must wait for the memory its slot's previous server left behind (the stand-in keeps it a
few seconds after its stop, out of the agent's reach) and for nothing else. With one GPU the configs run in turn on
its one slot; with two or more, at least one config must start while another GPU is still held.
The same run with every figure printed: `python3 -m benchmarks.gpu_pack`.
"""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="no nvidia-smi: not a GPU host"),
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the stand-in engine needs torch"),
]

HOLD_MIB = 4096
DELAY_S = 5.0


def test_each_packed_server_sees_only_its_gpu_and_waits_only_for_its_own_release(tmp_path: Path) -> None:
    from benchmarks import gpu_pack

    gpus = gpu_pack.smi_gpus()
    slots = [{"gpus": [g["index"]]} for g in gpus]
    run = gpu_pack.run_case(tmp_path, "packed", gpus, True, slots, 3, HOLD_MIB, DELAY_S)
    gpu_pack.print_run(run)
    idle = {g["index"]: g["used_mib"] for g in gpus}
    uuid = {g["index"]: g["uuid"] for g in gpus}
    for c in run["configs"]:
        assert c["status"] == "ok", c
        assert len(c["gpus"]) == 1 and c["slot"] is not None
        (g,) = c["gpus"]
        seen = c["standin"]
        assert seen["device_count"] == len(c["gpus"]), seen
        assert seen["cuda_visible_devices"] == str(g) and seen["cuda_device_order"] == "PCI_BUS_ID"
        assert [d["uuid"] for d in seen["devices"]] == [uuid[g]]
        low, _ = c["memory_while_running"][g]
        assert low >= idle[g] + 0.9 * HOLD_MIB, (c["config_id"], c["memory_while_running"], idle)
        wait = c["release_wait"]
        assert wait is not None and wait["gpus"] == [g] and wait["ok"]
        rel = c.get("release")
        if rel is None:  # the first config on its slot: nothing to wait for
            assert wait["wait_s"] < gpu_pack.WAIT_SLACK_S, (c["config_id"], wait)
            continue
        # it started only once its slot's previous server had let go, and it waited for that
        assert rel["t_freeing"] is not None and rel["t_back"] is not None, rel
        assert c["t_start"] >= rel["t_freeing"], (c["config_id"], rel)
        assert wait["wait_s"] >= DELAY_S - 3.0, (c["config_id"], wait)
        assert wait["to"] <= max(wait["from"], rel["t_back"]) + gpu_pack.WAIT_SLACK_S, (c["config_id"], wait, rel)
    # memory only where a server or holder of the run was
    assert run["n_stray"] == 0, run["stray_memory"]
    if len(gpus) >= 2:
        assert any(c["started_while_held"] for c in run["configs"])
        assert any(c["neighbours"] for c in run["configs"])
    assert gpu_pack.problems(run) == []

"""ct200's own profile end to end on th1 of the shared test hosts (`make testhosts`): host_vars/ct200.yml's matrix,
its three phases packed (`bench_pack: true`), the systemd backend with ct200's device list and server flags, served
by the stand-in engine's SGLang dialect (tests/standin: the pinned build's flags and DDTree's, as built from the pull
request) under the hardened unit.

The GPUs are a stand-in of eight H200s: nvidia-smi answers from the real captures (tests/fakes/nvidia-smi with
NVIDIA_SMI_GPUS=8) and the device nodes carry the captured majors, so that slots, `DeviceAllow=`,
`CUDA_VISIBLE_DEVICES` and the release check run. The model folders are shaped like Qwen3.6-27B and its drafter
(their config.json, sparse weight files of the real sizes), so that the memory fit runs on the host.

Each server's startup takes half a second, spent in SGLang's phases and logged with SGLang's messages, so that
where startup goes is read from each server.log into status.json and the report's time table.

Scaled down in tokens and requests only: every phase, config, sweep, workload and concurrency is ct200's; output
lengths are divided by 16, contexts by 10, and each cell runs once.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from controller import passthrough
from tests.agent.test_fit import QWEN36
from tests.controller.test_offsite_fit import DRAFTER, FILES, TARGET
from tests.hosts.testhosts import TestHosts
from tests.hosts.testhosts import run as run_command
from tests.standin import ENGINE

from .conftest import ROOT, Bench

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="test hosts need root")
HOST = "th1"
CT200 = yaml.safe_load((ROOT / "host_vars/ct200.yml").read_text())
CAPTURES = ROOT / "tests/fixtures/nvidia-h200"
GPU_DIR = "/opt/specfleet-gpu"        # the nvidia-smi stand-in and its captures on th1
STANDIN_DIR = "/opt/specfleet/sglang-standin"
GPUS = 8
# Qwen3.6-27B's weights in 11 shards (52 GB in all) and its DFlash drafter's in one file, as the off-site fit's Hub
# lists them: here as sparse files
TARGET_FILES = {n: size for n, size in FILES[TARGET].items() if n.startswith("model-")}
DRAFT_FILES = {n: size for n, size in FILES[DRAFTER].items() if n.endswith(".safetensors")}
DRAFT_CONFIG = {"num_hidden_layers": 5, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                "hidden_size": 5120, "torch_dtype": "bfloat16", "max_position_embeddings": 262144}


def scaled(sweeps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """ct200's sweeps with output lengths / 16, contexts / 10 and one repetition: the same cells, fewer tokens; and
    request rates × 16 with a quarter of the requests: the same schedules, as much shorter as the answers."""
    out = []
    for sweep in sweeps:
        s = dict(sweep)
        s["max_tokens"] = [max(8, m // 16) for m in sweep["max_tokens"]]
        if "context_tokens" in sweep:
            s["context_tokens"] = [c // 10 for c in sweep["context_tokens"]]
        if "request_rates" in sweep:
            s["request_rates"] = [r if r == "inf" else r * 16 for r in sweep["request_rates"]]
            s["requests"] = max(4, sweep["requests"] // 4)
        s["repetitions"] = 1
        out.append(s)
    return out


def nodes() -> dict[str, tuple[int, int]]:
    """ct200's NVIDIA nodes on an eight-GPU host: the captured ones, and GPUs 1-7 with the nvidia major."""
    listing = passthrough.nvidia_dev_listing((CAPTURES / "dev-nvidia.txt").read_text())
    found = {n["path"]: (n["major"], n["minor"]) for n in listing}
    major = found["/dev/nvidia0"][0]
    return {**found, **{f"/dev/nvidia{i}": (major, i) for i in range(1, GPUS)}}


def ssh(th: TestHosts, command: str, data: bytes | None = None, timeout: float = 120) -> str:
    proc = subprocess.run(th.ssh_command(HOST, command), input=data, capture_output=True, timeout=timeout)
    assert proc.returncode == 0, (command, proc.stdout[-2000:], proc.stderr[-2000:])
    return proc.stdout.decode()


@pytest.fixture
def ct200_host(testhosts: TestHosts) -> Iterator[dict[str, Any]]:
    """th1 dressed as ct200 for one test: the GPU stand-in, the device nodes, the model folders and the SGLang
    stand-in; all of it removed afterwards (the other test-host tests see a host without GPUs)."""
    made = nodes()
    folders = sorted({os.path.dirname(p) for p in made} - {"/dev"})
    models = {CT200["bench_model"]["path"]: (QWEN36 | {"max_position_embeddings": 262144}, TARGET_FILES),
              CT200["bench_draft_model"]["path"]: (DRAFT_CONFIG, DRAFT_FILES)}
    wrapper = (f"#!/bin/sh\nexport NVIDIA_SMI_CAPTURES={GPU_DIR}/captures NVIDIA_SMI_GPUS={GPUS}\n"
               f"exec /usr/bin/python3 {GPU_DIR}/nvidia-smi \"$@\"\n")
    engine = (f"#!/bin/sh\nexport STANDIN_STEP_S=0.0005 STANDIN_STARTUP_S=0.5\n"
              f"exec /usr/bin/python3 {STANDIN_DIR}/engine.py \"$@\"\n")
    tar = subprocess.run(["tar", "-C", str(ROOT), "-cf", "-", "--transform", "s,^tests/fixtures/nvidia-h200,captures,",
                          "--transform", "s,^tests/fakes/,,", "tests/fakes/nvidia-smi", "tests/fixtures/nvidia-h200"],
                         capture_output=True, check=True).stdout
    try:
        ssh(testhosts, f"mkdir -p {GPU_DIR} {STANDIN_DIR} && tar -C {GPU_DIR} -xf -", tar)
        ssh(testhosts, "cat > /usr/local/bin/nvidia-smi && chmod 755 /usr/local/bin/nvidia-smi", wrapper.encode())
        ssh(testhosts, f"cat > {STANDIN_DIR}/engine.py", ENGINE.read_bytes())
        ssh(testhosts, f"cat > {STANDIN_DIR}/python && chmod 755 {STANDIN_DIR}/python", engine.encode())
        ssh(testhosts, " && ".join([f"mkdir -p {' '.join(folders)}"] + [
            f"mknod -m 0666 {p} c {major} {minor}" for p, (major, minor) in made.items()]))
        for path, (config, files) in models.items():
            ssh(testhosts, f"mkdir -p {path} && cat > {path}/config.json && "
                           + " && ".join(f"truncate -s {size} {path}/{name}" for name, size in files.items())
                           + f" && chmod -R a+rX {path.rsplit('/', 1)[0]}", json.dumps(config).encode())
        yield {"bench_engine_python": f"{STANDIN_DIR}/python"}
    finally:
        run_command(testhosts.ssh_command(HOST, "rm -rf /usr/local/bin/nvidia-smi " + " ".join(
            shlex.quote(p) for p in [GPU_DIR, STANDIN_DIR, *made, *folders, "/models"])), check=False)


def test_ct200_profile_runs_end_to_end_packed_on_eight_stand_in_gpus(ct200_host: dict[str, Any],
                                                                    testhosts: TestHosts, tmp_path: Path) -> None:
    run = "it-ct200"
    bench = Bench(tmp_path)
    keys = ("bench_suite_name", "bench_engine", "bench_gpu_count", "bench_backend", "bench_service_device_allow",
            "bench_model", "bench_draft_model", "bench_server_args", "bench_env", "bench_sampling",
            "bench_timeouts", "bench_estimate")
    phases = [{**p, "sweeps": scaled(p["sweeps"])} for p in CT200["bench_phases"]]
    extra = {**{k: CT200[k] for k in keys}, "bench_phases": phases, "bench_pack": True, "run_id": run,
             "bench_engine_python": ct200_host["bench_engine_python"],
             "bench_timeouts": {**CT200["bench_timeouts"], "health_s": 120, "request_s": 120, "release_s": 30}}
    # the plan, read from the host: the engine's flags and every config's memory fit, from the model folders and
    # nvidia-smi's memory (the 52 GB target fits one 141 GB GPU at 0.80, with room for each cell's KV cache)
    plan = bench.run({**extra, "plan": True}, limit=HOST, timeout=300).stdout
    (tmp_path / "plan.txt").write_text(plan)
    assert "Plan for th1: 27 configs" in plan, plan[-4000:]
    assert len(re.findall(r"^\s+memory: fits: budget 140\.\d GiB × 0\.80 = 112\.\d GiB per GPU; weights 48\.4 GiB",
                          plan, re.M)) == 27, plan[-6000:]
    for tp in (1, 4, 8):
        assert f"    tp {tp}: 9/9 fit" in plan, plan[-3000:]

    res = bench.run(extra, limit=HOST, timeout=1500)
    out = res.stdout
    (tmp_path / "out.txt").write_text(out)
    assert res.returncode == 0, out[-6000:]
    host = bench.results / run / HOST
    ids = [f"{p['name']}-{c.get('id') or cid(c)}" for p in CT200["bench_phases"] for c in p["configs"]]
    assert len(ids) == 27
    statuses = {i: json.loads((host / i / "status.json").read_text()) for i in ids}
    assert {i: s["status"] for i, s in statuses.items() if s["status"] != "ok"} == {}, out[-4000:]

    for i, s in statuses.items():
        config = json.loads((host / i / "config.json").read_text())
        tp = int(i[2])
        # packed phases: each config on its slot's GPUs, and the server saw exactly them (the stand-in logs its
        # environment); tp 8 takes the whole host: one slot, nothing packed
        [seen] = [json.loads(line.split("STANDIN ", 1)[1]) for line in (host / i / "server.log").read_text()
                  .splitlines() if "STANDIN {" in line]
        assert seen["mark"].startswith(f"{run}/{i}/"), seen
        if tp < GPUS:
            assert len(s["slot"]["gpus"]) == tp, (i, s["slot"])
            assert seen["cuda_visible_devices"] == ",".join(map(str, s["slot"]["gpus"])), (i, seen)
            assert seen["cuda_device_order"] == "PCI_BUS_ID", seen
        else:
            assert s.get("slot") is None and not s.get("neighbours"), (i, s.get("slot"), s.get("neighbours"))
        cmd = config["command"]
        assert cmd[1:3] == ["-m", "sglang.launch_server"] and cmd[cmd.index("--tp-size") + 1] == str(tp)
        # where its startup went, from SGLang's own log lines (weights, KV cache, graphs, serving), in order
        marks = s["startup"]
        assert set(marks) == {"weights", "kv_cache", "graphs", "serving"}, (i, marks)
        assert 0 < marks["weights"] <= marks["kv_cache"] <= marks["graphs"] <= marks["serving"] < 30, (i, marks)
        # counted from the same launch as ready_s: the serving mark (logged as the listener opens, rounded to 0.1 s)
        # comes no later than the first health check answered; that check polls every 0.25 s, on a loaded machine
        # later (a hang detector only: not a claim on its pace)
        assert marks["serving"] <= s["ready_s"] + 0.2 and s["ready_s"] - marks["serving"] < 30, \
            (i, marks, s["ready_s"])
        # SGLang's counters agree with the rows: tokens, finished requests, verify steps (0.5.15 on)
        assert s["counters"]["verdict"] == "ok", (i, s["counters"])
        assert ("verify_steps" in s["counters"]) == ("autoregressive" not in i), (i, s["counters"])
    # packed: the baseline first on slot 0, then as many configs at once as the phase has slots
    for phase, slots in (("tp1", 8), ("tp4", 2)):
        assert statuses[f"{phase}-autoregressive"]["slot"]["index"] == 0
        busy = {statuses[i]["slot"]["index"] for i in ids if i.startswith(phase)}
        assert busy == set(range(slots)), (phase, busy)
        beside = [len(statuses[i]["neighbours"]) for i in ids if i.startswith(phase)]
        assert max(beside) >= slots - 1, (phase, beside)
    # ct200's report: the DDTree section, the packed marks, the environment header of the run
    report = (bench.results / run / "report.md").read_text()
    assert "DDTree" in report and "[packed]" in report
    timing = report[report.index("## Time per config (seconds)"):]
    columns = next(line for line in timing.splitlines() if line.startswith("| host"))
    assert all(f" {k}_s " in columns for k in ("weights", "kv_cache", "graphs", "ready")), timing[:600]
    header = r"- th1: GPUs 8x NVIDIA H200 \(140 GiB\); driver 580\.159\.04; CUDA 13\.0; engine sglang 0\.5\.15;"
    assert re.search(header, report), report[:1500]
    host_json = json.loads((host / "host.json").read_text())
    assert host_json["gpus"]["count"] == GPUS and host_json["engine"]["name"] == "sglang"
    starts = Counter(e["config_id"] for e in map(json.loads, (host / "events.jsonl").read_text().splitlines())
                     if e["event"] == "config_start")
    assert set(starts) == set(ids) and set(starts.values()) == {1}


def cid(config: dict[str, Any]) -> str:
    """A config's id as the matrix names it when it gives none."""
    if config["method"] == "ddtree":
        return f"ddtree-b{config['budget']}"
    return config["method"]

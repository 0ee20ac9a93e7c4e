"""ct200's device allow list under real systemd, on th1 of the shared test hosts (`make testhosts`, whose systemd
enforces device policies: `--device-policy` in tests/hosts/README.md).

Device nodes are made with the majors and minors of a real H200 host (tests/fixtures/nvidia-h200); the bench role
renders the engine's unit with ct200's `bench_service_device_allow`, and a probe runs as an instance of that unit,
started the way the agent starts a config (its env file, the unit's user and sandbox). It opens each node: with no
driver here, a node the list allows fails with ENXIO only, a node outside it with EPERM (the unit's device policy),
while root outside any unit gets ENXIO from all of them.
"""
from __future__ import annotations

import json
import os
import shlex
import time
import uuid
from pathlib import Path

import pytest
import yaml

from agent.pack import Slot
from agent.systemd import DROPIN_DIR, DROPIN_NAME, SystemdServer, device_allow, env_file_text, slot_dropin
from controller import passthrough
from tests import playbook
from tests.hosts.testhosts import TestHosts

from .conftest import ROOT

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="test hosts need root")
CAPTURES = ROOT / "tests/fixtures/nvidia-h200"
CT200 = yaml.safe_load((ROOT / "host_vars/ct200.yml").read_text())
HOST, OTHER = "th1", "th2"
# Opens each path read-write and reports the errno's name; the only output line starts with "device-probe".
PROBE = """
import errno, json, os, sys
result = {}
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDWR))
        result[path] = "opened"
    except OSError as exc:
        result[path] = errno.errorcode.get(exc.errno, str(exc.errno))
print("device-probe " + json.dumps({"uid": os.getuid(), "open": result}), flush=True)
"""


def capture_nodes() -> tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]]]:
    """The H200's NVIDIA nodes (all covered by ct200's list), and nodes of its majors that the list leaves out:
    nvidia-modeset (nvidia's own major 195, which `char-nvidia` would let in), an NVSwitch node and an InfiniBand
    verbs node (the first minor of uverbs)."""
    listing = passthrough.nvidia_dev_listing((CAPTURES / "dev-nvidia.txt").read_text())
    allowed = {n["path"]: (n["major"], n["minor"]) for n in listing}
    majors = passthrough.proc_devices((CAPTURES / "proc-devices.txt").read_text())
    refused = {"/dev/nvidia-modeset": (majors["nvidia"], passthrough.NVIDIA_MODESET_MINOR),
               "/dev/nvidia-nvswitch0": (majors["nvidia-nvswitch"], 0),
               "/dev/infiniband/uverbs0": (majors["infiniband_verbs"], 192)}
    return allowed, refused


def probe_result(text: str) -> dict:
    [line] = [ln for ln in text.splitlines() if ln.startswith("device-probe ")]
    return json.loads(line.removeprefix("device-probe "))


def role_vars(tmp_path: Path, host: str) -> Path:
    """ct200's backend, engine, GPU count and device list, on a test host (its model folders are the test hosts')."""
    path = tmp_path / f"vars-{host}.yml"
    keys = ("bench_backend", "bench_engine", "bench_gpu_count", "bench_service_device_allow")
    path.write_text(yaml.safe_dump({"bench_service_hosts": host, **{k: CT200[k] for k in keys}}))
    return path


def test_ct200_units_open_the_nvidia_nodes_and_nothing_else(testhosts: TestHosts, tmp_path: Path) -> None:
    t0 = time.monotonic()
    allowed, refused = capture_nodes()
    assert len(allowed) == 6 and CT200["bench_backend"] == "systemd"
    paths = [*allowed, *refused, "/dev/null"]
    instance = f"devprobe-{uuid.uuid4().hex[:8]}"
    unit = f"specfleet-{CT200['bench_engine']}@{instance}.service"
    unit_file = f"/etc/systemd/system/specfleet-{CT200['bench_engine']}@.service"
    env_file = f"/etc/specfleet/units/{instance}.env"
    had_unit_file = testhosts.ssh(HOST, f"test -e {unit_file}", check=False).returncode == 0
    folders = sorted({os.path.dirname(p) for p in [*allowed, *refused]} - {"/dev"})
    try:
        testhosts.ssh(HOST, " && ".join([f"mkdir -p {' '.join(folders)}"] + [
            f"mknod -m 0666 {p} c {major} {minor}" for p, (major, minor) in {**allowed, **refused}.items()]))
        # root, outside any unit: no NVIDIA or InfiniBand driver on this machine, so every node is ENXIO
        outside = probe_result(testhosts.ssh(HOST, f"python3 -c {shlex.quote(PROBE)} {' '.join(paths)}").stdout)
        assert outside["open"] == {**{p: "ENXIO" for p in [*allowed, *refused]}, "/dev/null": "opened"}

        # the bench role's systemd setup with ct200's list, twice (the second run changes nothing)
        args = ["tests/container_roles/bench_service.yml", "-l", HOST, "-e", f"@{role_vars(tmp_path, HOST)}"]
        first = playbook.play(args, timeout=300)
        assert first.rc == 0, first.out[-4000:]
        again = playbook.play(args, timeout=300)
        assert again.rc == 0 and again.recap(HOST)["changed"] == 0, again.out[-4000:]
        unit_text = testhosts.ssh(HOST, f"systemctl cat {unit}").stdout
        assert [line for line in unit_text.splitlines() if line.startswith("Device")] == \
            ["DevicePolicy=closed", *[f"DeviceAllow={p} rw" for p in allowed]]

        # the probe as the unit, started as the agent starts a config
        launch = env_file_text(["/usr/bin/python3", "-c", PROBE, *paths], {})
        testhosts.ssh(HOST, f"printf %s {shlex.quote(launch)} > {env_file} && chmod 0640 {env_file} && "
                            f"systemctl start --wait {unit}")
        journal = ""
        for _ in range(50):  # journald may file the unit's last line just after the unit ended
            journal = testhosts.ssh(HOST, f"journalctl --no-pager -o json -u {unit}").stdout
            if "device-probe" in journal:
                break
            time.sleep(0.2)
        entries = [json.loads(line) for line in journal.splitlines() if line.strip()]
        [probe_entry] = [e for e in entries if str(e.get("MESSAGE", "")).startswith("device-probe ")]
        inside = probe_result(probe_entry["MESSAGE"])
        print(f"root outside any unit: {outside['open']}\n{unit} as uid {inside['uid']}: {inside['open']}")
        assert inside["uid"] == int(testhosts.ssh(HOST, "id -u specfleet").stdout)
        assert inside["open"] == {**{p: "ENXIO" for p in allowed}, **{p: "EPERM" for p in refused},
                                  "/dev/null": "opened"}
        # every allowed path was a node when the unit started, and the invocation's journal (the config's
        # server.log, read as the agent reads it) holds the start and the probe
        assert not [e for e in entries if "Couldn't stat device" in str(e.get("MESSAGE", ""))], entries
        server = SystemdServer(CT200["bench_engine"], instance, [], {}, tmp_path / "server.log", 0)
        server.invocation = probe_entry["_SYSTEMD_INVOCATION_ID"]
        log = testhosts.ssh(HOST, shlex.join(server._journal_argv())).stdout
        assert f"Started {unit}" in log and "device-probe" in log

        # th2 has no NVIDIA node: with ct200's GPU count the role fails before it changes anything
        check = playbook.play(["tests/container_roles/bench_service.yml", "-l", OTHER, "--check",
                               "-e", f"@{role_vars(tmp_path, OTHER)}"], timeout=300)
        assert check.rc != 0
        assert (f"{OTHER} has 8 GPU(s) but bench_service_device_allow resolves to no device here"
                in " ".join(check.out.split())), check.out[-3000:]
        assert testhosts.ssh(OTHER, f"test -e {unit_file}", check=False).returncode != 0
    finally:
        created = [*allowed, *refused, *folders, env_file] + ([] if had_unit_file else [unit_file])
        testhosts.ssh(HOST, f"systemctl reset-failed {unit}; rm -rf {' '.join(created)}; systemctl daemon-reload",
                      check=False)
    print(f"device allow list on {HOST}: {time.monotonic() - t0:.1f} s")


AFFINITY = PROBE.replace('print("device-probe " + json.dumps({"uid": os.getuid(), "open": result}), flush=True)',
                         'print("device-probe " + json.dumps({"uid": os.getuid(), "open": result, '
                         '"cpus": sorted(os.sched_getaffinity(0))}), flush=True)')


def test_a_packed_unit_opens_only_its_slots_gpu_and_runs_on_its_cpus(testhosts: TestHosts, tmp_path: Path) -> None:
    """Four GPU nodes; the unit of a config packed into slot 2 (GPU 2, CPU 1) gets the agent's runtime drop-in:
    GPU 2 and the shared control nodes open (ENXIO, no driver), GPUs 0, 1 and 3 refused (EPERM), the process on
    CPU 1 alone. Without the drop-in the same unit opens all four again."""
    t0 = time.monotonic()
    majors = passthrough.proc_devices((CAPTURES / "proc-devices.txt").read_text())
    gpus = {f"/dev/nvidia{i}": (majors["nvidia"], i) for i in range(4)}
    shared = {"/dev/nvidiactl": (majors["nvidia"], 255), "/dev/nvidia-uvm": (majors["nvidia-uvm"], 0)}
    paths = [*gpus, *shared]
    instance = f"slotprobe-{uuid.uuid4().hex[:8]}"
    unit = f"specfleet-{CT200['bench_engine']}@{instance}.service"
    unit_file = f"/etc/systemd/system/specfleet-{CT200['bench_engine']}@.service"
    env_file = f"/etc/specfleet/units/{instance}.env"
    dropin = DROPIN_DIR / f"{unit}.d" / DROPIN_NAME
    had_unit_file = testhosts.ssh(HOST, f"test -e {unit_file}", check=False).returncode == 0
    cpus = int(testhosts.ssh(HOST, "nproc").stdout)

    def run_probe() -> dict:
        launch = env_file_text(["/usr/bin/python3", "-c", AFFINITY, *paths], {})
        testhosts.ssh(HOST, f"printf %s {shlex.quote(launch)} > {env_file} && chmod 0640 {env_file} && "
                            f"systemctl reset-failed {unit}; systemctl start --wait {unit}")
        for _ in range(50):  # journald may file the unit's last line just after the unit ended
            journal = testhosts.ssh(HOST, f"journalctl --no-pager -o cat -u {unit}").stdout
            found = [ln for ln in journal.splitlines() if ln.startswith("device-probe ")]
            if found:
                return probe_result(found[-1])
            time.sleep(0.2)
        raise AssertionError(f"no probe line in the journal of {unit}")

    try:
        testhosts.ssh(HOST, " && ".join(f"mknod -m 0666 {p} c {major} {minor}"
                                        for p, (major, minor) in {**gpus, **shared}.items()))
        args = ["tests/container_roles/bench_service.yml", "-l", HOST, "-e", f"@{role_vars(tmp_path, HOST)}"]
        first = playbook.play(args, timeout=300)
        assert first.rc == 0, first.out[-4000:]
        shown = testhosts.ssh(HOST, f"systemctl show {unit} -p DeviceAllow").stdout
        allowed = device_allow(shown)
        assert {f"{p} rw" for p in gpus} <= set(allowed), shown
        slot = Slot(2, (2,), "1" if cpus > 1 else "0")
        testhosts.ssh(HOST, f"mkdir -p {dropin.parent} && printf %s {shlex.quote(slot_dropin(slot, allowed))} > "
                            f"{dropin} && systemctl daemon-reload")
        packed = run_probe()
        print(f"{unit} in {slot.describe()}: {packed}")
        assert packed["open"] == {"/dev/nvidia0": "EPERM", "/dev/nvidia1": "EPERM", "/dev/nvidia2": "ENXIO",
                                  "/dev/nvidia3": "EPERM", "/dev/nvidiactl": "ENXIO", "/dev/nvidia-uvm": "ENXIO"}
        assert packed["cpus"] == [int(slot.cpus)]
        testhosts.ssh(HOST, f"rm -f {dropin} && systemctl daemon-reload")
        alone = run_probe()
        assert alone["open"] == {p: "ENXIO" for p in paths} and len(alone["cpus"]) == cpus
    finally:
        created = [*paths, env_file, str(dropin)] + ([] if had_unit_file else [unit_file])
        testhosts.ssh(HOST, f"systemctl reset-failed {unit}; rm -rf {' '.join(created)}; systemctl daemon-reload",
                      check=False)
    print(f"slot confinement on {HOST}: {time.monotonic() - t0:.1f} s")

"""The pve_gpu_passthrough role run for real by ansible-playbook on this machine (connection local).

The host's inputs are simulated in a folder of the test's own: the REAL /proc/devices and
/proc/driver/nvidia/version captured on an H200 host, and device nodes made with mknod using the captured
majors. `pct` and `pveversion` are the stand-ins in tests/fakes (Proxmox cannot run here): they reproduce the
documented interface on a Proxmox-format config file and record every call, which is what the tests count.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .harness import PVE_CT200_CONF, ROOT, RoleRun, run_role

FIXTURES = ROOT / "tests" / "fixtures" / "nvidia-h200"
FAKES = ROOT / "tests" / "fakes"
CTID = 200

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the simulated /dev/nvidia* nodes are made with mknod (needs root)"),
]



def captured_nodes() -> dict[str, tuple[int, int]]:
    """name -> (major, minor) of the character nodes in the real `ls -la /dev/nvidia*` capture (read here with a
    regex of the test's own, not the parser under test)."""
    nodes = {}
    for line in (FIXTURES / "dev-nvidia.txt").read_text().splitlines():
        match = re.match(r"^c\S+\s+\d+\s+\S+\s+\S+\s+(\d+),\s*(\d+)\s.*\s/dev/(nvidia[^/\s]*)$", line)
        if match:
            nodes[match.group(3)] = (int(match.group(1)), int(match.group(2)))
    return nodes


class PveHost:
    """A simulated Proxmox VE host: its input files, device nodes, container 200 and the role's runs."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.proc_devices = tmp / "proc" / "devices"
        self.driver_version = tmp / "proc" / "driver" / "nvidia" / "version"
        self.dev = tmp / "dev"
        self.etc = tmp / "etc"
        self.state = tmp / "var" / "lib" / "specfleet"    # the role's record of the raw lines it wrote
        self.pve = tmp / "pve" / "lxc"          # /etc/pve/lxc and the pct stand-in's state
        self.conf = self.pve / f"{CTID}.conf"
        self.calls_log = tmp / "calls.jsonl"
        for folder in (self.proc_devices.parent, self.driver_version.parent, self.dev, self.etc, self.pve):
            folder.mkdir(parents=True, exist_ok=True)
        self.proc_devices.write_text((FIXTURES / "proc-devices.txt").read_text())
        self.driver_version.write_text((FIXTURES / "proc-driver-version.txt").read_text())
        for name, (major, minor) in captured_nodes().items():
            self.mknod(name, major, minor)
        self.conf.write_text(PVE_CT200_CONF)
        (self.pve / f"{CTID}.status").write_text("running\n")
        self.runs = 0

    def mknod(self, name: str, major: int, minor: int) -> None:
        path = self.dev / name
        if path.exists():
            path.unlink()
        os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))

    def move_uvm_major(self, major: int) -> None:
        """What a reboot can do: nvidia-uvm registered with another major, its nodes recreated with it."""
        text = self.proc_devices.read_text()
        assert "238 nvidia-uvm\n" in text
        self.proc_devices.write_text(text.replace("238 nvidia-uvm\n", f"{major} nvidia-uvm\n"))
        self.mknod("nvidia-uvm", major, 0)
        self.mknod("nvidia-uvm-tools", major, 1)

    def calls(self) -> list[dict[str, Any]]:
        if not self.calls_log.exists():
            return []
        return [json.loads(line) for line in self.calls_log.read_text().splitlines() if line.strip()]

    def run(self, pve_version: str, *args: str, **extra: Any) -> Run:
        """ansible-playbook with the role against this host; returns the run with the calls it made."""
        self.runs += 1
        variables = {
            "pve_gpu_passthrough_gpu_count": 1,
            "pve_gpu_passthrough_ctid": CTID,
            "pve_gpu_passthrough_pve_conf_dir": str(self.pve),
            "pve_gpu_passthrough_proc_devices": str(self.proc_devices),
            "pve_gpu_passthrough_proc_driver_version": str(self.driver_version),
            "pve_gpu_passthrough_dev_dir": str(self.dev),
            "pve_gpu_passthrough_sysconf_dir": str(self.etc),
            "pve_gpu_passthrough_state_dir": str(self.state),
            "pve_gpu_passthrough_manage_service": False,
            **extra,
        }
        before = len(self.calls())
        run = run_role(self.tmp / f"run{self.runs}", "pve_gpu_passthrough", "pvehost", variables, *args,
                       result_var="pve_gpu_passthrough_result", path=[FAKES],
                       env={"PCT_STATE_DIR": str(self.pve), "PCT_LOG": str(self.calls_log),
                            "PVE_MANAGER_VERSION": pve_version})
        return Run(run, self.calls()[before:])


class Run:
    """One ansible-playbook run: its output, recap and the pct/pveversion calls it made."""

    def __init__(self, run: RoleRun, calls: list[dict[str, Any]]) -> None:
        self.proc = run.proc
        self.out = run.out
        self.calls = calls
        self.result = run.result
        self.changed = run.changed
        self.failed = run.failed

    def ok(self) -> Run:
        assert self.proc.returncode == 0 and self.failed == 0, self.out[-4000:]
        return self

    def pct(self, command: str) -> list[list[str]]:
        """argv of the pct calls of one command (set, reboot, start, ...)."""
        return [c["argv"] for c in self.calls if c["argv"][:2] == ["pct", command]]

    def restarts(self) -> list[list[str]]:
        return [c["argv"] for c in self.calls if c["argv"][:2] in (["pct", "reboot"], ["pct", "stop"],
                                                                    ["pct", "start"], ["pct", "shutdown"])]


@pytest.fixture
def host(tmp_path: Path) -> PveHost:
    return PveHost(tmp_path)


def dev_lines(conf: Path) -> list[str]:
    return [ln for ln in conf.read_text().split("\n[")[0].splitlines() if re.match(r"^dev\d+:", ln)]


def raw_lines(conf: Path) -> list[str]:
    return [ln for ln in conf.read_text().split("\n[")[0].splitlines() if ln.startswith("lxc.")]


def test_pve82_sets_devn_entries_then_changes_nothing(host: PveHost) -> None:
    """PVE 8.2: one `pct set` with the four devN entries and one restart; the host files rendered; a second run
    changes nothing and restarts nothing; a moved nvidia-uvm major does not matter to devN entries."""
    first = host.run("8.2.4").ok()
    dev = host.dev
    assert first.pct("set") == [[
        "pct", "set", str(CTID), "--dev0", f"{dev}/nvidia0,mode=0666", "--dev1", f"{dev}/nvidiactl,mode=0666",
        "--dev2", f"{dev}/nvidia-uvm,mode=0666", "--dev3", f"{dev}/nvidia-uvm-tools,mode=0666"]]
    assert first.restarts() == [["pct", "reboot", str(CTID), "--timeout", "120"]]
    assert dev_lines(host.conf) == [f"dev0: {dev}/nvidia0,mode=0666", f"dev1: {dev}/nvidiactl,mode=0666",
                                    f"dev2: {dev}/nvidia-uvm,mode=0666", f"dev3: {dev}/nvidia-uvm-tools,mode=0666"]
    assert raw_lines(host.conf) == []
    assert first.result["method"] == "devn" and first.result["driver_version"] == "580.159.04"
    assert first.result["majors"]["nvidia-uvm"] == 238 and first.result["majors"]["nvidia"] == 195
    assert first.result["restarted"] is True and first.result["changed"] is True

    unit = (host.etc / "systemd/system/nvidia-devices.service").read_text()
    assert unit.startswith("#") and "# Ansible managed" in unit.splitlines()[:3]
    assert "After=systemd-modules-load.service" in unit and "Before=pve-guests.service" in unit
    assert "Type=oneshot" in unit and "WantedBy=multi-user.target" in unit
    execs = [ln for ln in unit.splitlines() if ln.startswith("ExecStart=")]
    assert execs == ["ExecStart=/usr/bin/nvidia-smi", "ExecStart=/usr/bin/nvidia-modprobe -u -c=0"]
    modules = (host.etc / "modules-load.d/nvidia.conf").read_text().splitlines()
    assert [m for m in modules if not m.startswith("#")] == ["nvidia", "nvidia_uvm", "nvidia_modeset"]

    second = host.run("8.2.4").ok()
    assert second.changed == 0, second.out[-3000:]
    assert second.pct("set") == [] and second.restarts() == []
    assert [c["argv"][:2] for c in second.calls] == [["pveversion"], ["pct", "status"], ["pct", "config"],
                                                     ["pct", "config"]]

    host.move_uvm_major(509)
    third = host.run("8.2.4").ok()
    assert third.changed == 0 and third.pct("set") == [] and third.restarts() == []
    assert third.result["majors"]["nvidia-uvm"] == 509


def test_pve74_raw_lines_then_uvm_major_moves(host: PveHost) -> None:
    """PVE 7.4: the raw lines with the captured uvm major 238, no `pct set`, one restart; then nvidia-uvm comes
    back as 509 after a 'reboot': the stale 238 line is replaced and the container restarted exactly once;
    the run after that changes nothing."""
    first = host.run("7.4-17", pve_gpu_passthrough_cgroup_version="2").ok()
    dev = host.dev
    assert first.pct("set") == []
    assert len(first.restarts()) == 1 and first.restarts()[0][:2] == ["pct", "reboot"]
    assert raw_lines(host.conf) == [
        "lxc.cgroup2.devices.allow: c 195:* rwm",
        "lxc.cgroup2.devices.allow: c 238:* rwm",
        f"lxc.mount.entry: {dev}/nvidia0 dev/nvidia0 none bind,optional,create=file",
        f"lxc.mount.entry: {dev}/nvidiactl dev/nvidiactl none bind,optional,create=file",
        f"lxc.mount.entry: {dev}/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file",
        f"lxc.mount.entry: {dev}/nvidia-uvm-tools dev/nvidia-uvm-tools none bind,optional,create=file",
    ]
    assert host.conf.read_text().startswith(PVE_CT200_CONF)
    assert first.result["method"] == "raw" and first.result["cgroup_version"] == "2"

    again = host.run("7.4-17", pve_gpu_passthrough_cgroup_version="2").ok()
    assert again.changed == 0 and again.restarts() == []

    host.move_uvm_major(509)
    moved = host.run("7.4-17", pve_gpu_passthrough_cgroup_version="2").ok()
    lines = raw_lines(host.conf)
    assert "lxc.cgroup2.devices.allow: c 238:* rwm" not in lines
    assert lines.count("lxc.cgroup2.devices.allow: c 509:* rwm") == 1
    assert lines.count("lxc.cgroup2.devices.allow: c 195:* rwm") == 1 and len(lines) == 6
    assert moved.restarts() == [["pct", "reboot", str(CTID), "--timeout", "120"]]
    assert moved.pct("set") == []

    settled = host.run("7.4-17", pve_gpu_passthrough_cgroup_version="2").ok()
    assert settled.changed == 0 and settled.restarts() == []


# The user's own lines, for devices whose modules are not loaded on the captured host (no major in its
# /proc/devices): a DRM card (226), a TUN device (10:200), a framebuffer (29), and a bind mount of /dev/dri.
USER_LINES = ["lxc.cgroup2.devices.allow: c 226:* rwm",
              "lxc.cgroup2.devices.allow: c 10:200 rwm",
              "lxc.cgroup.devices.allow: c 29:* rwm",
              "lxc.mount.entry: /dev/dri dev/dri none bind,optional,create=dir",
              "lxc.mount.entry: /dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir"]


def test_user_lines_stay_byte_for_byte_through_raw_lines_a_moved_major_and_devn(host: PveHost) -> None:
    """A config with the user's own lines (devices whose modules are not loaded, one NVIDIA folder the role does
    not manage) and a snapshot section: raw lines on PVE 7.4, nvidia-uvm moving 238 -> 509, then PVE 8.2 with devN
    entries. Only the lines the role wrote ever change; the user's lines and every other byte stay."""
    user_conf = PVE_CT200_CONF + "\n".join(USER_LINES) + "\n"
    snapshot = "\n[before-gpu]\nlxc.cgroup2.devices.allow: c 238:* rwm\nsnaptime: 1733000000\n"
    host.conf.write_text(user_conf + snapshot)
    v = {"pve_gpu_passthrough_cgroup_version": "2"}

    def main_section() -> list[str]:
        return host.conf.read_text().split("\n[", 1)[0].splitlines()

    host.run("7.4-17", **v).ok()
    lines = main_section()
    assert lines[:len(user_conf.splitlines())] == user_conf.splitlines()
    assert "lxc.cgroup2.devices.allow: c 238:* rwm" in lines
    assert host.conf.read_text().endswith(snapshot)
    record = json.loads((host.state / f"ct{CTID}.json").read_text())
    assert "lxc.cgroup2.devices.allow: c 238:* rwm" in record["lines"] and not set(USER_LINES) & set(record["lines"])

    host.move_uvm_major(509)
    host.run("7.4-17", **v).ok()
    lines = main_section()
    assert lines[:len(user_conf.splitlines())] == user_conf.splitlines()
    assert "lxc.cgroup2.devices.allow: c 238:* rwm" not in lines and "lxc.cgroup2.devices.allow: c 509:* rwm" in lines
    assert host.conf.read_text().endswith(snapshot)
    assert host.run("7.4-17", **v).ok().changed == 0

    devn = host.run("8.2.4").ok()
    assert len(devn.pct("set")) == 1
    # `pct set` rewrites the file in Proxmox's key order: every line but the new devN entries is the user's, as it was
    assert [ln for ln in main_section() if not re.match(r"dev\d+: ", ln)] == user_conf.splitlines()
    assert host.conf.read_text().endswith(snapshot)
    assert json.loads((host.state / f"ct{CTID}.json").read_text())["lines"] == []
    assert host.run("8.2.4").ok().changed == 0


@pytest.mark.parametrize("pve_version", ["8.2.4", "7.4-17"])
def test_check_mode_on_a_fresh_config_reports_changes_and_touches_nothing(host: PveHost, pve_version: str) -> None:
    """--check: changes reported, the config and the host files untouched, no `pct set` and no restart."""
    before = host.conf.read_bytes()
    run = host.run(pve_version, "--check", pve_gpu_passthrough_cgroup_version="2").ok()
    assert run.changed > 0
    assert run.pct("set") == [] and run.restarts() == []
    assert {tuple(c["argv"][:2]) for c in run.calls} <= {("pveversion",), ("pct", "status"), ("pct", "config")}
    assert host.conf.read_bytes() == before
    assert not (host.etc / "systemd/system/nvidia-devices.service").exists()
    assert not (host.etc / "modules-load.d/nvidia.conf").exists()


def test_pending_devn_changes_of_an_interrupted_run_get_their_restart(host: PveHost) -> None:
    """A run set the entries on the running container and stopped before restarting it: `pct config` shows them
    (pending applied), `pct config --current` does not; the role sets nothing and restarts once."""
    dev = host.dev
    names = ["nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]
    host.conf.write_text(PVE_CT200_CONF + "".join(f"dev{i}: {dev}/{n}\n" for i, n in enumerate(names)))
    env = {**os.environ, "PCT_STATE_DIR": str(host.pve), "PCT_LOG": str(host.tmp / "setup-calls.jsonl")}
    args = [a for i, n in enumerate(names) for a in (f"--dev{i}", f"{dev}/{n},mode=0666")]
    subprocess.run([str(FAKES / "pct"), "set", str(CTID), *args], env=env, check=True)
    assert "[pve:pending]" in host.conf.read_text()

    run = host.run("8.2.4").ok()
    assert run.pct("set") == []
    assert run.restarts() == [["pct", "reboot", str(CTID), "--timeout", "120"]]
    assert "[pve:pending]" not in host.conf.read_text()
    assert dev_lines(host.conf)[0] == f"dev0: {dev}/nvidia0,mode=0666"


def test_missing_node_or_module_fails_before_the_container_is_touched(host: PveHost) -> None:
    """No /dev/nvidia-uvm (nvidia-modprobe -u never ran), a GPU count above the host's, or nvidia_uvm not loaded:
    the role fails naming what is wrong and never calls pct."""
    (host.dev / "nvidia-uvm").unlink()
    missing = host.run("8.2.4")
    assert missing.proc.returncode != 0
    assert f"{host.dev}/nvidia-uvm is missing" in missing.out
    assert [c for c in missing.calls if c["argv"][0] == "pct"] == []

    host.mknod("nvidia-uvm", 238, 0)
    two = host.run("8.2.4", pve_gpu_passthrough_gpu_count=2)
    assert two.proc.returncode != 0 and f"{host.dev}/nvidia1 is missing" in two.out

    host.proc_devices.write_text(host.proc_devices.read_text().replace("238 nvidia-uvm\n", ""))
    unloaded = host.run("8.2.4")
    assert unloaded.proc.returncode != 0 and "no nvidia-uvm" in unloaded.out
    assert PVE_CT200_CONF == host.conf.read_text()

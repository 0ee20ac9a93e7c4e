"""GPU passthrough plumbing into a REAL LXC container on this machine (pve_gpu_passthrough_mode: plain_lxc).

There is no GPU here: character nodes made with mknod using the majors captured on a real H200 host
(195:0, 195:255, 238:0, 238:1) stand for the driver's nodes. The role writes the raw lines into the container's
config, starts or restarts it with lxc-start/lxc-stop, and the test checks inside the running container
(lxc-attach) that the nodes are there with those majors, and in the container's device cgroup (v1 on this
machine: devices.list) that `c 195:* rwm` and the nvidia-uvm major are allowed. Then nvidia-uvm "moves" to 509
as after a reboot: the stale line is replaced, the container restarted once and the new major allowed.

The container's rootfs is a copy of the test hosts' cached Debian bookworm rootfs (tests/hosts/testhosts.py: one
debootstrap, with systemd as init, shared with the test hosts of the other tests), kept under .cache/lxc; later
runs reuse the container with a fresh config.
"""
from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.hosts.testhosts import DEFAULT_CACHE, STAMP_PATH, ensure_rootfs, vm_mirror

from .harness import ROOT, run_role

FIXTURES = ROOT / "tests" / "fixtures" / "nvidia-h200"
CACHE = ROOT / ".cache" / "lxc"
LXCPATH = CACHE / "containers"
NAME = "specfleet-gpu-test"
CONTAINER = LXCPATH / NAME
NODES = ["nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="LXC containers and mknod need root"),
    pytest.mark.skipif(shutil.which("lxc-create") is None, reason="LXC is not installed (apt-get install lxc)"),
]


def sh(*argv: str | Path, timeout: float = 120, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, argv))} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def lxc(tool: str, *args: str | Path, **kw: Any) -> subprocess.CompletedProcess[str]:
    return sh(f"lxc-{tool}", "-P", LXCPATH, "-n", NAME, *args, **kw)


def state() -> str:
    return lxc("info", "-s", "-H").stdout.strip()


def init_pid() -> int:
    return int(lxc("info", "-p", "-H").stdout.strip())


def attach(*cmd: str) -> str:
    return lxc("attach", "--clear-env", "--set-var", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "--", *cmd).stdout


def captured_nodes() -> dict[str, tuple[int, int]]:
    """name -> (major, minor) from the real `ls -la /dev/nvidia*` capture (the test's own regex)."""
    nodes = {}
    for line in (FIXTURES / "dev-nvidia.txt").read_text().splitlines():
        match = re.match(r"^c\S+\s+\d+\s+\S+\s+\S+\s+(\d+),\s*(\d+)\s.*\s/dev/(nvidia[^/\s]*)$", line)
        if match:
            nodes[match.group(3)] = (int(match.group(1)), int(match.group(2)))
    return nodes


def create_container() -> None:
    """The container on a copy of the test hosts' rootfs; `config.orig` marks a finished build of that rootfs."""
    source = ensure_rootfs(DEFAULT_CACHE, vm_mirror())
    stamp = (source / STAMP_PATH).read_text()
    rootfs = CONTAINER / "rootfs"
    if (CONTAINER / "config.orig").is_file() and (rootfs / STAMP_PATH).is_file() \
            and (rootfs / STAMP_PATH).read_text() == stamp:
        if not (CONTAINER / "config").is_file():
            fresh_config()
        return
    if CONTAINER.exists():
        sh("lxc-destroy", "-P", LXCPATH, "-n", NAME, "-f", check=False)
        shutil.rmtree(CONTAINER, ignore_errors=True)
    CONTAINER.mkdir(parents=True)
    sh("cp", "-a", f"{source}/.", f"{rootfs}.part", timeout=600)
    (Path(f"{rootfs}.part") / "etc/hostname").write_text(f"{NAME}\n")
    Path(f"{rootfs}.part").rename(rootfs)
    # what the lxc-debian template writes, less the network (fresh_config sets none)
    (CONTAINER / "config.orig").write_text(
        "lxc.include = /usr/share/lxc/config/debian.common.conf\n"
        f"lxc.rootfs.path = dir:{rootfs}\nlxc.uts.name = {NAME}\nlxc.arch = linux64\n"
        "lxc.tty.max = 4\nlxc.pty.max = 1024\n")
    fresh_config()


def fresh_config() -> None:
    """The template's config without network (none is needed) and without an AppArmor profile (none loads here)."""
    keep = [ln for ln in (CONTAINER / "config.orig").read_text().splitlines()
            if not re.match(r"^\s*lxc\.(net\.|apparmor\.)", ln)]
    (CONTAINER / "config").write_text("\n".join(keep + ["lxc.net.0.type = empty",
                                                         "lxc.apparmor.profile = unconfined"]) + "\n")


def stop_container() -> None:
    if state() != "STOPPED":
        lxc("stop", "-k", timeout=60)
        lxc("wait", "-s", "STOPPED", "-t", "30", timeout=40)


@pytest.fixture(scope="module")
def container() -> Iterator[None]:
    """The cached container, stopped, with a fresh config; one test module at a time holds it."""
    CACHE.mkdir(parents=True, exist_ok=True)
    LXCPATH.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "lock", "w") as lock:
        deadline = time.monotonic() + 900
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"{CACHE / 'lock'} held by another test run for 15 minutes")
                time.sleep(1)
        create_container()
        stop_container()
        fresh_config()
        try:
            yield
        finally:
            stop_container()


class Host:
    """This machine as the LXC host: simulated driver files and nodes, and the role's runs."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.proc_devices = tmp / "proc" / "devices"
        self.driver_version = tmp / "proc" / "driver-version"
        self.dev = tmp / "dev"
        self.etc = tmp / "etc"
        for folder in (self.proc_devices.parent, self.dev, self.etc):
            folder.mkdir(parents=True, exist_ok=True)
        self.proc_devices.write_text((FIXTURES / "proc-devices.txt").read_text())
        self.driver_version.write_text((FIXTURES / "proc-driver-version.txt").read_text())
        for name, (major, minor) in captured_nodes().items():
            self.mknod(name, major, minor)
        self.runs = 0

    def mknod(self, name: str, major: int, minor: int) -> None:
        path = self.dev / name
        if path.exists():
            path.unlink()
        os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))

    def run(self, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], int]:
        """ansible-playbook with the role in plain_lxc mode; (process, role result, changed count)."""
        self.runs += 1
        run = run_role(self.tmp / f"run{self.runs}", "pve_gpu_passthrough", "lxchost", {
            "pve_gpu_passthrough_mode": "plain_lxc",
            "pve_gpu_passthrough_lxc_name": NAME,
            "pve_gpu_passthrough_lxc_path": str(LXCPATH),
            "pve_gpu_passthrough_gpu_count": 1,
            "pve_gpu_passthrough_proc_devices": str(self.proc_devices),
            "pve_gpu_passthrough_proc_driver_version": str(self.driver_version),
            "pve_gpu_passthrough_dev_dir": str(self.dev),
            "pve_gpu_passthrough_sysconf_dir": str(self.etc),
            "pve_gpu_passthrough_state_dir": str(self.etc / "state"),
            "pve_gpu_passthrough_manage_service": False,
            "pve_gpu_passthrough_restart_timeout_s": 60,
        }, *args, result_var="pve_gpu_passthrough_result")
        assert run.proc.returncode == 0, run.out[-4000:]
        assert run.recap, run.proc.stdout[-2000:]
        return run.proc, run.result, run.changed


def nodes_inside() -> dict[str, tuple[str, int, int]]:
    """/dev/nvidia* in the running container: name -> (file type, major, minor), read with its own stat."""
    out = attach("stat", "-c", "%n|%F|%Hr|%Lr", *[f"/dev/{n}" for n in NODES])
    nodes = {}
    for line in out.splitlines():
        path, kind, major, minor = line.split("|")
        nodes[path.removeprefix("/dev/")] = (kind, int(major), int(minor))
    return nodes


def device_allow_list() -> set[str]:
    """The container's v1 device cgroup allow list, from lxc-cgroup and from the cgroup file of its init."""
    via_lxc = set(lxc("cgroup", "devices.list").stdout.split("\n"))
    cgroup_line = next(ln for ln in Path(f"/proc/{init_pid()}/cgroup").read_text().splitlines()
                       if re.match(r"^\d+:devices:", ln))
    path = cgroup_line.split(":", 2)[2]
    payload = path[:path.index(NAME) + len(NAME)] if NAME in path else path
    via_file = set((Path("/sys/fs/cgroup/devices") / payload.lstrip("/") / "devices.list").read_text().split("\n"))
    assert via_lxc - {""} == via_file - {""}, (via_lxc, via_file)
    return via_file - {""}


def config_lines() -> list[str]:
    return [ln for ln in (CONTAINER / "config").read_text().splitlines()
            if re.match(r"^lxc\.(cgroup2?\.devices\.allow|mount\.entry)\s*=", ln)]


def test_plain_lxc_passthrough_in_a_real_container(container: None, tmp_path: Path) -> None:
    """--check changes nothing. Stopped container: lines written (cgroup v1 form on this machine), container
    started, nodes and allow list right inside. Second run: nothing changes, no restart. nvidia-uvm moved to 509:
    the stale line replaced, one restart, the new major allowed and seen inside."""
    host = Host(tmp_path)
    assert state() == "STOPPED"
    before = (CONTAINER / "config").read_bytes()
    _, result, changed = host.run("--check")
    assert changed > 0 and result["started"] is True     # would start it ...
    assert state() == "STOPPED" and (CONTAINER / "config").read_bytes() == before   # ... and did nothing

    _, result, changed = host.run()
    assert changed > 0
    assert result["cgroup_version"] == "1" and result["method"] == "raw"
    assert result["started"] is True and result["restarted"] is False
    assert result["driver_version"] == "580.159.04"
    dev = host.dev
    assert config_lines() == [
        "lxc.cgroup.devices.allow = c 195:* rwm",
        "lxc.cgroup.devices.allow = c 238:* rwm",
        f"lxc.mount.entry = {dev}/nvidia0 dev/nvidia0 none bind,optional,create=file",
        f"lxc.mount.entry = {dev}/nvidiactl dev/nvidiactl none bind,optional,create=file",
        f"lxc.mount.entry = {dev}/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file",
        f"lxc.mount.entry = {dev}/nvidia-uvm-tools dev/nvidia-uvm-tools none bind,optional,create=file",
    ]
    assert state() == "RUNNING"
    assert nodes_inside() == {"nvidia0": ("character special file", 195, 0),
                              "nvidiactl": ("character special file", 195, 255),
                              "nvidia-uvm": ("character special file", 238, 0),
                              "nvidia-uvm-tools": ("character special file", 238, 1)}
    allowed = device_allow_list()
    print("inside:", nodes_inside(), "\nallowed:", sorted(allowed))
    assert {"c 195:* rwm", "c 238:* rwm"} <= allowed, allowed
    assert "a *:* rwm" not in allowed     # a real allow list, not everything

    pid = init_pid()
    _, result, changed = host.run()
    assert changed == 0 and result["restarted"] is False and result["started"] is False
    assert init_pid() == pid              # not restarted

    # After a reboot nvidia-uvm is registered as 509 and its nodes are recreated with it.
    host.proc_devices.write_text(host.proc_devices.read_text().replace("238 nvidia-uvm\n", "509 nvidia-uvm\n"))
    host.mknod("nvidia-uvm", 509, 0)
    host.mknod("nvidia-uvm-tools", 509, 1)
    _, result, changed = host.run()
    assert changed > 0 and result["restarted"] is True and result["started"] is True
    lines = config_lines()
    assert "lxc.cgroup.devices.allow = c 238:* rwm" not in lines
    assert lines.count("lxc.cgroup.devices.allow = c 509:* rwm") == 1
    assert lines.count("lxc.cgroup.devices.allow = c 195:* rwm") == 1 and len(lines) == 6
    assert state() == "RUNNING" and init_pid() != pid
    assert nodes_inside()["nvidia-uvm"] == ("character special file", 509, 0)
    allowed = device_allow_list()
    assert {"c 195:* rwm", "c 509:* rwm"} <= allowed and "c 238:* rwm" not in allowed, allowed

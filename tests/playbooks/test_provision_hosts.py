"""playbooks/provision.yml and playbooks/recover.yml for real, over SSH, on two Debian hosts with systemd (test hosts
of this module's own: bridge sfbr1, 10.99.1.0/24, state .work/testhosts-prov): `testct` is the GPU container,
`testpve` the Proxmox host it lives on, reached by delegation as in the real inventory. The inventory gives testct
the variables host_vars/ct200.yml sets, pointed at the stand-ins below.

Every provisioning role runs twice; the first run must change something in every role (a run that does nothing
proves nothing) and the second must report changed=0:
- pve_gpu_passthrough (delegated to testpve): modules-load file; the node-creating oneshot unit installed, enabled
  and started by real systemd; nodes checked against the majors; one `pct set --devN` and one restart. The driver
  version it reads there becomes nvidia_userspace_version and gpu_smoke_host_driver_version of the container.
- nvidia_userspace: kmod installed by apt (through the apt proxy on the bridge), the runfile run once with
  --no-kernel-module, the result verified; the second run finds exactly the host's version and runs nothing.
- cuda_toolkit: the keyring package installed from a file on the host, apt's lists updated, cuda-toolkit-12-8
  installed, /etc/profile.d/cuda.sh written, nvcc checked.
- sglang: git installed by apt; a real git repository (tag v0.0.1) cloned; two real patches applied and recorded;
  a virtualenv bootstrapped from the offline wheelhouse and `pip install -e python` (torch and huggingface_hub from
  the wheelhouse, as SGLang depends on them).
- flash_attn: MAX_JOBS from the container's cgroup limits, the wheel key from the venv's real torch and nvcc, the
  kept wheel of that key installed and its key recorded; nothing is built.
- model_weights: two models fetched by the role's downloader with the real huggingface_hub, the token on stdin (the
  repositories are gated), one checked against a manifest, one with ignore_patterns, both stamped; the second run
  does not contact the Hub.
- gpu_smoke: GPU facts from nvidia-smi, the driver equal to the host's, a service started and healthy.
- bench (tasks_from: service): the service user and the engine's template unit of the systemd backend.
Check mode: provision.yml --check on the fresh hosts passes and changes no file on either host (the hosts' overlay
upper layers are compared); provision.yml --check on the provisioned hosts reports changed=0. Last, a reboot of the
Proxmox host is simulated (nodes gone, unit stopped, nvidia-uvm back with major 509, the container's service down):
recover.yml --check reports exactly the unit and the service and touches nothing, recover.yml brings everything
back, its second run changes nothing.

Stand-ins, only for what cannot exist on a machine without a GPU and without Proxmox, each reproducing the
documented interface (tests/fakes):
- the NVIDIA driver: nvidia-driver/nvidia-smi, nvidia-modprobe and the runfile answer from a simulated kernel side
  in /var/lib/fake-nvidia (the real /proc/devices, /proc/driver/nvidia/version and `nvidia-smi --query-gpu`
  captures of an H200 host; device nodes made with mknod);
- Proxmox VE: pct and pveversion, on a Proxmox-format /etc/pve/lxc/200.conf, recording every call;
- NVIDIA's apt repository (not reachable here): a local flat repository, added by a stand-in cuda-keyring package,
  whose cuda-toolkit-12-8 holds only an nvcc printing the real version text;
- the Hugging Face Hub (not reachable here): hf-hub serves the tiny models over the Hub's HTTP API at HF_ENDPOINT;
- flash-attn's wheel: a pure-Python wheel kept under the key the role computes (a CUDA build cannot run here).

Not run here: gpu_smoke's CUDA smoke test (torch.cuda needs a GPU: tests/gpu; skipped with --skip-tags
gpu_smoke_cuda), a flash-attn build, nvidia-persistenced (part of the driver), nvidia_userspace's apt method
(NVIDIA's packages), a real restart of the container (the stand-in's container is a file). engine_venv runs twice
on the test hosts in test_testhosts_suite.py.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from tests import playbook
from tests.builders import git, make_sglang_source, make_wheel
from tests.hosts.testhosts import TestHosts
from tests.roles.harness import PVE_CT200_CONF, ROOT

STATE = ROOT / ".work/testhosts-prov"
BRIDGE, SUBNET, GATEWAY = "sfbr1", "10.99.1.0/24", "10.99.1.1"
FIXTURES = ROOT / "tests" / "fixtures" / "nvidia-h200"
FAKES = ROOT / "tests" / "fakes"
WHEELHOUSE = ROOT / ".cache/wheelhouse"
MODELS = ROOT / ".cache/models"
STAGE = "/srv/specfleet-test"            # the staging folder, bound read-only into both hosts
FAKE_NVIDIA = "/var/lib/fake-nvidia"     # the simulated kernel side the NVIDIA stand-ins read
CT, PVE = "testct", "testpve"
HOSTS = {CT: "th1", PVE: "th2"}
CTID = 200
TOKEN = "hf_specfleetTestToken0123456789"
HEALTH_PORT = 8099
SKIP = ["--skip-tags", "gpu_smoke_cuda"]  # CUDA on a real GPU only
ROLES = ("pve_gpu_passthrough", "nvidia_userspace", "cuda_toolkit", "sglang", "flash_attn", "model_weights",
         "gpu_smoke", "bench")

HEALTH_UNIT = f"""[Unit]
Description=specfleet test service with a health URL (stands for the engine server)

[Service]
ExecStart=/usr/bin/python3 -m http.server {HEALTH_PORT} --bind 127.0.0.1 --directory {STAGE}/health
"""

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="test hosts need root"),
]


# ------------------------------------------------------------------------------------------------ the staging folder

def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def driver_version() -> str:
    """The kernel module's version in the real capture, read with a regex of the test's own."""
    text = (FIXTURES / "proc-driver-version.txt").read_text()
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+\.\d+)", text)
    assert match, text
    return match.group(1)


def deb(stage: Path, package: str, version: str, arch: str, files: dict[str, tuple[str, int]],
        links: dict[str, str] | None = None) -> Path:
    """A real .deb (dpkg-deb --build) holding `files` {path: (text, mode)} and symlinks {path: target}."""
    root = stage / "build" / package
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN/control").write_text(f"Package: {package}\nVersion: {version}\nArchitecture: {arch}\n"
                                         f"Maintainer: specfleet tests <tests@example.org>\nSection: devel\n"
                                         f"Priority: optional\nDescription: test stand-in of {package}\n")
    for path, (text, mode) in files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(mode)
    for path, link in (links or {}).items():
        (root / path.lstrip("/")).symlink_to(link)
    out = stage / "cuda" / f"{package}_{version}_{arch}.deb"
    out.parent.mkdir(exist_ok=True)
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(out)], check=True,
                   capture_output=True)
    return out


def make_cuda_repo(stage: Path) -> None:
    """NVIDIA's repository as a local flat apt repository: cuda-keyring adds it (as the real one adds NVIDIA's),
    cuda-toolkit-12-8 installs /usr/local/cuda-12.8 with an nvcc that prints the real version text."""
    source = f"deb [trusted=yes] file:{STAGE}/cuda ./\n"
    deb(stage, "cuda-keyring", "1.1-1", "all",
        {"/etc/apt/sources.list.d/cuda-debian12-x86_64.list": (source, 0o644)})
    nvcc = ("#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
            "echo 'Copyright (c) 2005-2025 NVIDIA Corporation'\n"
            "echo 'Cuda compilation tools, release 12.8, V12.8.93'\n"
            "echo 'Build cuda_12.8.r12.8/compiler.35583870_0'\n")
    deb(stage, "cuda-toolkit-12-8", "12.8.93-1", "amd64", {"/usr/local/cuda-12.8/bin/nvcc": (nvcc, 0o755)},
        {"/usr/local/cuda": "cuda-12.8"})
    entries = []
    for path in sorted((stage / "cuda").glob("*.deb")):
        control = subprocess.run(["dpkg-deb", "-f", str(path)], check=True, capture_output=True,
                                 text=True).stdout.rstrip("\n")
        entries.append(f"{control}\nFilename: ./{path.name}\nSize: {path.stat().st_size}\nSHA256: {sha256(path)}\n")
    (stage / "cuda/Packages").write_text("\n".join(entries))


def make_stage(stage: Path) -> Path:
    patches = stage / "patches"
    make_sglang_source(stage / "sglang", patches, dependencies=["torch", "huggingface_hub"])
    nvidia = stage / "nvidia"
    nvidia.mkdir()
    shutil.copy(FAKES / "nvidia-driver/nvidia-runfile", nvidia / f"NVIDIA-Linux-x86_64-{driver_version()}.run")
    shutil.copy(FAKES / "nvidia-driver/nvidia-smi", nvidia / "nvidia-smi")
    captures = stage / "captures"
    captures.mkdir()
    for name in ("proc-devices.txt", "proc-driver-version.txt", "query-gpu.csv"):
        shutil.copy(FIXTURES / name, captures / name)
    make_cuda_repo(stage)
    (stage / "health").mkdir()
    (stage / "health/health").write_text("ok\n")
    for path in [stage, *stage.rglob("*")]:          # readable by everyone inside the hosts (apt's _apt user too)
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | stat.S_IROTH | (stat.S_IXOTH if path.is_dir() else 0))
    return patches


# ---------------------------------------------------------------------------------------------------- the hosts

def wheelhouse_torch() -> str:
    """The torch version pip installs from the wheelhouse (requirements-engine.txt pins it)."""
    versions = sorted(p.name.split("-")[1] for p in WHEELHOUSE.glob("torch-*.whl"))
    assert len(versions) == 1, versions
    return versions[0]


def keep_flash_attn_wheel(th: TestHosts, stage: Path) -> str:
    """The wheel a flash-attn build would have left in the role's cache; returns its key, spelled out here from what
    the role documents the key is made of: the flash-attn, torch, CUDA (nvcc) and Python versions and the arch list."""
    pyver = th.ssh(HOSTS[CT], "python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'").stdout.strip()
    key = f"fa2.8.3-torch{wheelhouse_torch()}-cuda12.8-sm90-py{pyver}"
    make_wheel(stage / "flash-attn" / key / "flash_attn-2.8.3-py3-none-any.whl", "flash_attn", "2.8.3")
    return key


def model_manifest(folder: Path) -> list[dict[str, Any]]:
    return [{"path": p.name, "size": p.stat().st_size, "sha256": sha256(p)} for p in sorted(folder.iterdir())]


def inventory(th: TestHosts, patches: Path, hub: str) -> dict[str, Any]:
    """The container and its Proxmox host, with the variables host_vars/ct200.yml sets, pointed at the stand-ins."""
    driver = "{{ pve_gpu_passthrough_driver_version | default('') }}"
    ct = {
        "ansible_host": th.ip_of(HOSTS[CT]), "pve_host": PVE,
        # Proxmox host side, delegated: the simulated kernel side and the driver tools' stand-ins
        "pve_gpu_passthrough_ctid": CTID, "pve_gpu_passthrough_gpu_count": 1,
        "pve_gpu_passthrough_proc_devices": f"{FAKE_NVIDIA}/proc/devices",
        "pve_gpu_passthrough_proc_driver_version": f"{FAKE_NVIDIA}/proc/driver/nvidia/version",
        "pve_gpu_passthrough_dev_dir": f"{FAKE_NVIDIA}/dev",
        "pve_gpu_passthrough_nvidia_smi": "/opt/specfleet-fakes/nvidia-driver/nvidia-smi",
        "pve_gpu_passthrough_nvidia_modprobe": "/opt/specfleet-fakes/nvidia-driver/nvidia-modprobe",
        "pve_gpu_passthrough_persistenced": False,
        # the container
        "nvidia_userspace_version": driver,
        "nvidia_userspace_runfile_path": f"{STAGE}/nvidia/NVIDIA-Linux-x86_64-{driver_version()}.run",
        "cuda_toolkit_version": "12.8", "cuda_toolkit_gpu_archs": ["9.0"], "cuda_toolkit_driver_version": driver,
        "cuda_toolkit_keyring_deb_path": f"{STAGE}/cuda/cuda-keyring_1.1-1_all.deb",
        "sglang_git_repo": f"{STAGE}/sglang", "sglang_git_ref": "v0.0.1", "sglang_patches_dir": str(patches),
        "sglang_extras": [], "sglang_pip_wheelhouse": "/wheelhouse",
        "flash_attn_enabled": True, "flash_attn_gpu_archs": ["9.0"], "flash_attn_cache_dir": f"{STAGE}/flash-attn",
        "model_weights_hf_token": TOKEN, "model_weights_env": {"HF_ENDPOINT": hub},
        "model_weights_models": [
            {"repo_id": "specfleet/tiny-llama", "revision": "main", "dest": "/models/tiny-llama",
             "manifest": model_manifest(MODELS / "target")},
            {"repo_id": "specfleet/tiny-llama-draft", "revision": "main", "dest": "/models/tiny-llama-draft",
             "ignore_patterns": ["generation_config.json"]},
        ],
        "gpu_smoke_expected_count": 1, "gpu_smoke_python": "/opt/specfleet/sglang/bin/python",
        "gpu_smoke_host_driver_version": driver,
        "gpu_smoke_services": [{"name": "specfleet-health.service",
                                "health_url": f"http://127.0.0.1:{HEALTH_PORT}/health"}],
        "gpu_smoke_health_timeout_s": 30,
        # the benchmark's systemd backend
        "bench_engine": "sglang", "bench_agent_python": "/usr/bin/python3",
        "bench_model": {"name": "tiny-llama", "path": "/models/tiny-llama", "revision": "main"},
        "bench_draft_model": {"name": "tiny-llama-draft", "path": "/models/tiny-llama-draft", "revision": "main"},
    }
    common = {"ansible_user": "root", "ansible_ssh_private_key_file": str(th.key_path),
              "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
                                         "-o LogLevel=ERROR",
              "ansible_python_interpreter": "/usr/bin/python3"}
    return {"all": {"vars": common, "children": {
        "gpu": {"hosts": {CT: ct}},
        "pve": {"hosts": {PVE: {"ansible_host": th.ip_of(HOSTS[PVE])}}}}}}


def setup_hosts(th: TestHosts) -> None:
    """What the hosts hold before any role runs: the Proxmox host's driver (simulated kernel side, its userspace)
    and Proxmox (the pct stand-in on container 200's config); in the container, what the passthrough shows of the
    host's driver, and a service of its own."""
    captures = f"{STAGE}/captures"
    kernel_side = (f"mkdir -p {FAKE_NVIDIA}/proc/driver/nvidia && "
                   f"cp {captures}/proc-driver-version.txt {FAKE_NVIDIA}/proc/driver/nvidia/version && "
                   f"cp {captures}/query-gpu.csv {FAKE_NVIDIA}/gpus.csv")
    version = driver_version()
    th.ssh(HOSTS[PVE], " && ".join([
        kernel_side, f"mkdir -p {FAKE_NVIDIA}/dev", f"cp {captures}/proc-devices.txt {FAKE_NVIDIA}/proc/devices",
        # the host's own driver userspace (the full driver is installed on a real Proxmox host)
        f": > /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{version}",
        f"ln -sf libnvidia-ml.so.{version} /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "mkdir -p /etc/pve/lxc",
        "printf '#!/bin/sh\\nPCT_STATE_DIR=/etc/pve/lxc PCT_LOG=/var/log/pct-calls.jsonl "
        "exec /opt/specfleet-fakes/pct \"$@\"\\n' > /usr/local/sbin/pct",
        "printf '#!/bin/sh\\nPVE_MANAGER_VERSION=8.2.4 PCT_LOG=/var/log/pct-calls.jsonl "
        "exec /opt/specfleet-fakes/pveversion \"$@\"\\n' > /usr/local/sbin/pveversion",
        "chmod 0755 /usr/local/sbin/pct /usr/local/sbin/pveversion",
    ]))
    pve_conf = PVE_CT200_CONF.replace("\n", "\\n")
    th.ssh(HOSTS[PVE], f"printf '{pve_conf}' > /etc/pve/lxc/{CTID}.conf && echo running > /etc/pve/lxc/{CTID}.status")
    unit = HEALTH_UNIT.replace("\n", "\\n")
    th.ssh(HOSTS[CT], f"{kernel_side} && printf '{unit}' > /etc/systemd/system/specfleet-health.service && "
                      "systemctl daemon-reload")


@dataclass
class Hub:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def requests(self) -> list[dict[str, Any]]:
        """The requests for the Hub's own routes (`/api/...`, `/<repo>/resolve/...`). The stand-in listens on the
        test hosts' gateway of this machine, where a benchmark running beside these tests may ask any listener
        `GET /v1/models` (specfleet's foreign-load check, once per config): such a request fetches nothing from the
        Hub, and is not one of provisioning's."""
        if not self.log.exists():
            return []
        rows = [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]
        return [r for r in rows if r["path"].startswith("/api/") or "/resolve/" in r["path"]]


def start_hub(folder: Path) -> Hub:
    ready, log = folder / "hub.url", folder / "hub.jsonl"
    cmd = [sys.executable, str(FAKES / "hf-hub"), "--bind", GATEWAY, "--ready", str(ready), "--log", str(log),
           "--token", TOKEN, "--repo", f"specfleet/tiny-llama={MODELS / 'target'}",
           "--repo", f"specfleet/tiny-llama-draft={MODELS / 'draft'}"]
    with open(folder / "hub.err", "w") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True)
    end = time.monotonic() + 30
    while not ready.exists():
        assert proc.poll() is None, (folder / "hub.err").read_text()
        assert time.monotonic() < end, "the Hub stand-in did not start listening in 30 s"
        time.sleep(0.05)
    return Hub(proc, ready.read_text().strip(), log)


# -------------------------------------------------------------------------------------------------- playbook runs

class Run:
    """One ansible-playbook run: rc, output, and every task result with its role (record_results callback)."""

    def __init__(self, proc: subprocess.CompletedProcess[str], record: Path, seconds: float) -> None:
        self.rc = proc.returncode
        self.out = proc.stdout + proc.stderr
        self.seconds = seconds
        self.data: dict[str, Any] = json.loads(record.read_text()) if record.exists() else {}

    def stats(self, host: str = CT) -> dict[str, int]:
        return self.data.get("stats", {}).get(host, {})

    def tasks(self, name: str) -> list[dict[str, Any]]:
        return [t for t in self.data.get("tasks", []) if t["task"] == name]

    def one(self, name: str) -> dict[str, Any]:
        found = self.tasks(name)
        assert len(found) == 1, (name, len(found), self.out[-3000:])
        return found[0]

    def changed_by_role(self) -> Counter[str]:
        return Counter(t["role"] or "(play)" for t in self.data.get("tasks", []) if t["status"] == "changed")

    def ok(self) -> Run:
        failed = [t for t in self.data.get("tasks", []) if t["status"] in ("failed", "unreachable")]
        assert self.rc == 0 and not failed, self.out[-6000:]
        return self


@dataclass
class World:
    th: TestHosts
    folder: Path
    inventory: Path
    hub: Hub
    flash_key: str
    runs: int = 0

    def play(self, *playbooks: str, check: bool = False, args: tuple[str, ...] = ()) -> Run:
        self.runs += 1
        record = self.folder / f"record-{self.runs}.json"
        played = playbook.play(["-i", str(self.inventory), *playbooks, *SKIP, *args, *(["--check"] if check else [])],
                               env={"ANSIBLE_CALLBACK_PLUGINS": str(ROOT / "tests/container_roles/callback_plugins"),
                                    "ANSIBLE_CALLBACKS_ENABLED": "record_results", "RECORD_RESULTS": str(record),
                                    "ANSIBLE_LOCAL_TEMP": str(self.folder / "ansible-tmp")}, timeout=600)
        run = Run(played.proc, record, played.seconds)
        (self.folder / f"run-{self.runs}.log").write_text(run.out)
        print(f"{' '.join(playbooks)}{' --check' if check else ''}: {run.seconds:.0f} s, "
              f"changed by role {dict(run.changed_by_role())}")
        return run

    def ssh(self, host: str, command: str, check: bool = True) -> str:
        return self.th.ssh(HOSTS[host], command, check=check).stdout

    def pct_calls(self) -> list[list[str]]:
        out = self.ssh(PVE, "cat /var/log/pct-calls.jsonl 2>/dev/null || true")
        return [json.loads(line)["argv"] for line in out.splitlines() if line.strip()]

    def upper(self, host: str) -> dict[str, tuple[Any, ...]]:
        """Every file the host wrote to its overlay since it booted: path -> (type, mode, size, mtime, link)."""
        top = self.th.machine_dir(HOSTS[host]) / "upper"
        seen = {}
        for dirpath, dirnames, filenames in os.walk(top):
            for name in dirnames + filenames:
                path = Path(dirpath, name)
                rel = path.relative_to(top).as_posix()
                if rel.startswith(NOISE):
                    continue
                st = path.lstat()
                seen[rel] = (stat.S_IFMT(st.st_mode), st.st_mode & 0o7777, st.st_size,
                             st.st_mtime_ns if not stat.S_ISDIR(st.st_mode) else 0,
                             os.readlink(path) if path.is_symlink() else None)
        return seen


# What a host writes by itself or for every SSH session and Ansible module run, never a role's doing.
# The pct stand-in's record of its calls is its own log, read by the tests.
NOISE = ("root/.ansible", "var/log/journal", "var/lib/systemd/timers", "var/lib/systemd/random-seed",
         "var/log/lastlog", "var/log/wtmp", "var/log/btmp", "run/", "tmp/", "var/log/pct-calls.jsonl")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    if not (WHEELHOUSE / ".complete").exists():
        pytest.fail("the offline wheelhouse is missing: run `make wheelhouse` first")
    folder = tmp_path_factory.mktemp("provision")
    stage = folder / "stage"
    stage.mkdir()
    patches = make_stage(stage)
    th = TestHosts(STATE, bridge=BRIDGE, subnet=SUBNET)
    hub = None
    try:
        th.up(2, binds=[f"{WHEELHOUSE}:/wheelhouse", f"{stage}:{STAGE}", f"{FAKES}:/opt/specfleet-fakes"],
              apt_proxy=True, timeout=300)
        setup_hosts(th)
        flash_key = keep_flash_attn_wheel(th, stage)
        hub = start_hub(folder)
        inv = folder / "inventory.yml"
        inv.write_text(yaml.safe_dump(inventory(th, patches, hub.url), sort_keys=False))
        yield World(th, folder, inv, hub, flash_key)
    finally:
        if hub is not None:
            os.killpg(hub.proc.pid, signal.SIGTERM)
            hub.proc.wait(timeout=10)
        th.down()


# ------------------------------------------------------------------------------------------------------- tests

def changed_files(before: dict[str, tuple[Any, ...]], after: dict[str, tuple[Any, ...]]) -> list[str]:
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def test_check_mode_on_fresh_hosts_changes_nothing(world: World) -> None:
    """provision.yml --check on hosts where nothing is provisioned yet: it passes, reports what it would do, and
    leaves every file on both hosts as it was; no pct call writes, nothing is fetched from the Hub."""
    before = {h: world.upper(h) for h in (CT, PVE)}
    assert all(len(files) > 5 for files in before.values()), before       # the comparison sees the hosts' files
    run = world.play("playbooks/provision.yml", check=True).ok()
    changed = run.changed_by_role()
    for role in ("pve_gpu_passthrough", "nvidia_userspace", "cuda_toolkit", "sglang", "model_weights", "gpu_smoke"):
        assert changed[role] > 0, (role, changed)                         # it reports what a real run would do
    assert "apt would install git" in run.out and "a real run installs git, then clones" in run.out
    for host in (CT, PVE):
        assert changed_files(before[host], world.upper(host)) == [], host
    assert {tuple(c[:2]) for c in world.pct_calls()} <= {("pveversion",), ("pct", "status"), ("pct", "config")}
    assert world.hub.requests() == []


@pytest.fixture(scope="module")
def provisioned(world: World) -> tuple[Run, Run]:
    """provision.yml and the benchmark's service setup, twice; the stand-ins' records are cleared in between."""
    playbooks = ("playbooks/provision.yml", "tests/container_roles/bench_service.yml")
    first = world.play(*playbooks).ok()
    world.ssh(CT, "mv /var/log/nvidia-installer.log /root/nvidia-installer.first.log")
    world.ssh(PVE, "mv /var/log/pct-calls.jsonl /root/pct-calls.first.jsonl")
    world.hub.log.rename(world.hub.log.with_suffix(".first"))
    second = world.play(*playbooks).ok()
    return first, second


def test_provision_twice_every_role_changes_then_nothing(world: World, provisioned: tuple[Run, Run]) -> None:
    first, second = provisioned
    changed = first.changed_by_role()
    assert {role for role in ROLES if changed[role] == 0} == set(), changed
    assert second.changed_by_role() == Counter() and second.stats(CT)["changed"] == 0, second.out[-5000:]
    assert second.stats(CT)["failures"] == 0 and second.stats(CT)["ok"] > 100


def test_passthrough_on_the_proxmox_host(world: World, provisioned: tuple[Run, Run]) -> None:
    """Real systemd ran the node-creating unit; one `pct set` with the devN entries and one restart, then none."""
    assert world.ssh(PVE, "systemctl is-enabled nvidia-devices.service; systemctl is-active nvidia-devices.service"
                     ).split() == ["enabled", "active"]
    assert "Before=pve-guests.service" in world.ssh(PVE, "systemctl cat nvidia-devices.service")
    nodes = world.ssh(PVE, f"stat -c '%n %t:%T' {FAKE_NVIDIA}/dev/nvidia*").split("\n")
    assert sorted(n.replace(f"{FAKE_NVIDIA}/dev/", "") for n in nodes if n) == [
        "nvidia-uvm ee:0", "nvidia-uvm-tools ee:1", "nvidia0 c3:0", "nvidiactl c3:ff"]   # 238 and 195, in hex
    first = [json.loads(line)["argv"] for line in world.ssh(PVE, "cat /root/pct-calls.first.jsonl").splitlines()]
    dev = f"{FAKE_NVIDIA}/dev"
    assert [c for c in first if c[:2] == ["pct", "set"]] == [[
        "pct", "set", str(CTID), "--dev0", f"{dev}/nvidia0,mode=0666", "--dev1", f"{dev}/nvidiactl,mode=0666",
        "--dev2", f"{dev}/nvidia-uvm,mode=0666", "--dev3", f"{dev}/nvidia-uvm-tools,mode=0666"]]
    assert [c for c in first if c[:2] == ["pct", "reboot"]] == [["pct", "reboot", str(CTID), "--timeout", "120"]]
    assert {tuple(c[:2]) for c in world.pct_calls()} == {("pveversion",), ("pct", "status"), ("pct", "config")}
    assert f"dev3: {dev}/nvidia-uvm-tools,mode=0666" in world.ssh(PVE, f"cat /etc/pve/lxc/{CTID}.conf")


def test_driver_userspace_cuda_and_gpu_facts_in_the_container(world: World, provisioned: tuple[Run, Run]) -> None:
    """The host's driver version travelled from the Proxmox host to the container's roles; the runfile ran once with
    --no-kernel-module after apt installed kmod; nvcc of the pinned toolkit answers through the profile script."""
    first, second = provisioned
    version = driver_version()
    before = first.one("Work out what is installed and what to do")["result"]["ansible_facts"]["nvidia_userspace_state"]
    assert (before["wanted"], before["version"], before["action"]) == (version, None, "install")
    after = second.one("Work out what is installed and what to do")["result"]["ansible_facts"]["nvidia_userspace_state"]
    assert (after["version"], after["source"], after["action"]) == (version, "nvidia-smi", "none")
    installer = world.ssh(CT, "cat /root/nvidia-installer.first.log")
    assert f"command line: NVIDIA-Linux-x86_64-{version}.run --no-kernel-module --silent" in installer
    assert world.ssh(CT, "test -e /var/log/nvidia-installer.log || echo absent").strip() == "absent"  # not run again
    assert world.ssh(CT, "dpkg-query -W -f='${Status}' kmod cuda-keyring cuda-toolkit-12-8") == \
        "install ok installed" * 3
    assert world.ssh(CT, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").strip() == version
    nvcc = world.ssh(CT, "bash -lc 'echo $CUDA_HOME; nvcc --version'")
    assert nvcc.startswith("/usr/local/cuda-12.8\n") and "release 12.8, V12.8.93" in nvcc
    shown = first.one("Show them")["result"]["msg"]
    assert f"1 GPU(s): ['NVIDIA H200']; driver {version}" in shown
    assert world.ssh(CT, "systemctl is-active specfleet-health.service").strip() == "active"


def test_sglang_flash_attn_and_weights_in_the_container(world: World, provisioned: tuple[Run, Run]) -> None:
    """The patched checkout installed into its venv with torch from the wheelhouse; the kept flash-attn wheel of the
    key made from that torch and nvcc; the weights as on the Hub, fetched once with the token, never logged."""
    first, _ = provisioned
    stage = world.folder / "stage"
    record = json.loads(world.ssh(CT, "cat /etc/specfleet/engine-patches.json"))
    assert record["commit"] == git(stage / "sglang", "rev-parse", "v0.0.1^{commit}").strip()
    assert record["patches"] == [{"name": p.name, "sha256": sha256(p)} for p in sorted((stage / "patches").iterdir())]
    probe = ("import sglang.srt.spec as s, sglang.srt.ddtree as d, torch, huggingface_hub, flash_attn; "
             "print(s.ALGORITHMS, d.BUDGET, torch.__version__, flash_attn.__version__)")
    assert world.ssh(CT, f"/opt/specfleet/sglang/bin/python -c '{probe}'").split("\n")[-2] == \
        f"['EAGLE', 'DFLASH', 'DDTREE'] 64 {wheelhouse_torch()} 2.8.3"
    assert world.ssh(CT, "cat /opt/specfleet/sglang/.specfleet-flash-attn-key").strip() == world.flash_key
    assert re.search(r"MAX_JOBS=\d+ NVCC_THREADS=4 FLASH_ATTN_CUDA_ARCHS=90 \(cpus \d+ from ",
                     first.one("Show the build's parallelism")["result"]["msg"])
    assert not [t for t in first.tasks("Build flash-attn (pip wheel --no-build-isolation; long)")
                if t["status"] != "skipped"]
    for dest, source in (("/models/tiny-llama", MODELS / "target"), ("/models/tiny-llama-draft", MODELS / "draft")):
        listing = world.ssh(CT, f"cd {dest} && sha256sum *").split("\n")
        want = {p.name: sha256(p) for p in source.iterdir() if not dest.endswith("draft")
                or p.name != "generation_config.json"}
        assert {line.split()[1]: line.split()[0] for line in listing if line} == want, dest
        stamp = json.loads(world.ssh(CT, f"cat {dest}/.specfleet-complete.json"))
        assert stamp["revision"] == "main" and stamp["repo_id"].startswith("specfleet/")
    fetched = [json.loads(line) for line in world.hub.log.with_suffix(".first").read_text().splitlines()]
    downloads = [r["path"].rsplit("/", 1)[-1] for r in fetched if r["method"] == "GET" and "/resolve/" in r["path"]]
    assert sorted(downloads) == sorted([p.name for p in (MODELS / "target").iterdir()]
                                       + [p.name for p in (MODELS / "draft").iterdir()
                                          if p.name != "generation_config.json"])
    assert all(r["token"] for r in fetched if r["status"] == 200), fetched       # the token reached the downloader
    assert world.hub.requests() == []                                            # the second run asked nothing
    assert TOKEN not in first.out and TOKEN not in json.dumps(first.data)


def test_benchmark_service_user_and_unit(world: World, provisioned: tuple[Run, Run]) -> None:
    assert world.ssh(CT, "id -u specfleet >/dev/null && stat -c '%a %U' /etc/specfleet/units").strip() == "700 root"
    unit = world.ssh(CT, "systemctl cat specfleet-sglang@probe.service")
    assert "User=specfleet" in unit and "DevicePolicy=closed" in unit


def test_check_mode_on_provisioned_hosts_reports_nothing(world: World, provisioned: tuple[Run, Run]) -> None:
    """provision.yml --check after the provisioning: nothing to do, nothing touched (recover.yml --check runs after
    the simulated reboot below, where it has something to report)."""
    before = {h: world.upper(h) for h in (CT, PVE)}
    run = world.play("playbooks/provision.yml", check=True).ok()
    assert run.changed_by_role() == Counter() and run.stats(CT)["changed"] == 0, run.out[-5000:]
    for host in (CT, PVE):
        assert changed_files(before[host], world.upper(host)) == [], host
    assert {tuple(c[:2]) for c in world.pct_calls()} <= {("pveversion",), ("pct", "status"), ("pct", "config")}
    assert world.hub.requests() == []


def test_recover_after_a_reboot_of_the_proxmox_host(world: World, provisioned: tuple[Run, Run]) -> None:
    """After the reboot the nodes are gone, the unit has not run, nvidia-uvm came back as 509 and the container's
    service is down: recover.yml --check says it would start the unit and the service and touches nothing; then
    recover.yml starts the unit (nodes back with the new major), leaves the devN entries and the container alone,
    brings the service back; its second run changes nothing."""
    world.ssh(PVE, f"systemctl stop nvidia-devices.service && rm -f {FAKE_NVIDIA}/dev/nvidia* && "
                   f"sed -i 's/^238 nvidia-uvm$/509 nvidia-uvm/' {FAKE_NVIDIA}/proc/devices && "
                   "rm -f /var/log/pct-calls.jsonl")
    world.ssh(CT, "systemctl stop specfleet-health.service")
    before = {h: world.upper(h) for h in (CT, PVE)}
    checked = world.play("playbooks/recover.yml", check=True).ok()
    assert checked.changed_by_role() == Counter({"pve_gpu_passthrough": 1, "gpu_smoke": 1}), checked.out[-5000:]
    assert "a real run creates the nodes with nvidia-devices.service first" in checked.out
    for host in (CT, PVE):
        assert changed_files(before[host], world.upper(host)) == [], host
    first = world.play("playbooks/recover.yml").ok()
    assert first.changed_by_role() == Counter({"pve_gpu_passthrough": 1, "gpu_smoke": 1}), first.changed_by_role()
    assert first.one("Enable and start the unit")["status"] == "changed"
    uvm = world.ssh(PVE, f"stat -c '%t:%T' {FAKE_NVIDIA}/dev/nvidia-uvm {FAKE_NVIDIA}/dev/nvidia-uvm-tools").split()
    assert uvm == ["1fd:0", "1fd:1"]                                              # 509
    assert {tuple(c[:2]) for c in world.pct_calls()} == {("pveversion",), ("pct", "status"), ("pct", "config")}
    assert world.ssh(CT, "systemctl is-active specfleet-health.service").strip() == "active"
    second = world.play("playbooks/recover.yml").ok()
    assert second.changed_by_role() == Counter() and second.stats(CT)["changed"] == 0, second.out[-5000:]

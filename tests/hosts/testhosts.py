#!/usr/bin/env python3
"""Real Debian test hosts on this machine: systemd-nspawn machines with real systemd and real SSH.

Each host is a `systemd-nspawn -b` machine booted from its own overlayfs over one cached debootstrap rootfs, in its
own network namespace joined by a veth to a bridge on this machine. Stdlib only; needs root.

    python tests/hosts/testhosts.py up --count 2 --state DIR [--bind-ro SRC:DST ...] [--apt-proxy] [--device-policy]
    python tests/hosts/testhosts.py down --state DIR

API: TestHosts(state_dir).up(2, binds=[...]) -> list[Host]; .hosts; .ssh(name, command); .down().
See tests/hosts/README.md.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Set, Tuple

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CACHE = ROOT / ".cache" / "testhosts"
DEFAULT_BRIDGE = "sfbr0"
BRIDGE_ALIAS = "specfleet-testhosts:"  # + the state folder that created the bridge (its interface alias)
DEFAULT_SUBNET = "10.99.0.0/24"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"
INCLUDE = ("python3", "openssh-server", "systemd", "systemd-sysv", "dbus", "iproute2", "libnuma1", "sudo")
# Bump when prepare_rootfs() changes what it writes: a cached rootfs with another stamp is rebuilt.
ROOTFS_LAYOUT = 2
STAMP_PATH = "etc/testhosts-rootfs.json"  # inside the rootfs, so a rootfs and its stamp are renamed together
HOST_OFFSET = 10  # th1 gets .11, th2 .12, ...
APT_PROXY_PORT = 3142
SSH_OPTS = ("-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null")
# Only these states are final answers of `systemctl is-system-running`; starting/initializing are polled again.
GOOD_STATES = ("running", "degraded")
BAD_STATES = ("maintenance", "stopping", "offline")
# --device-policy: systemd inside enforces DevicePolicy=/DeviceAllow= as on a Debian 12 or Proxmox 8 host. Its
# device filter is a BPF program on the unit's cgroup v2; with this VM's hybrid hierarchy systemd 252 writes the
# cgroup v1 devices controller instead, which nspawn mounts read-only ("Failed to reset devices.allow/devices.deny"),
# and enforces nothing. So: the unified hierarchy inside, and bpf(), which nspawn's syscall filter leaves out.
DEVICE_POLICY_ENV = {"SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"}
DEVICE_POLICY_ARGS = ("--system-call-filter=bpf",)


class TestHostsError(RuntimeError):
    """Something the test-host tooling could not do; the message names the step and carries its output."""

    __test__ = False


class Host(NamedTuple):
    name: str
    ip: str


@dataclass(frozen=True)
class Bind:
    """A read-only bind mount into every machine (systemd-nspawn --bind-ro=SRC:DST)."""

    src: str
    dst: str

    @classmethod
    def parse(cls, spec: str) -> Bind:
        src, _, dst = spec.partition(":")
        dst = dst or src
        if not src or not os.path.isabs(src) or not os.path.isabs(dst):
            raise TestHostsError(f"--bind-ro {spec!r}: want SRC[:DST] with absolute paths")
        if not os.path.exists(src):
            raise TestHostsError(f"--bind-ro {spec!r}: {src} does not exist")
        return cls(os.path.realpath(src), os.path.normpath(dst))

    def option(self) -> str:
        return f"--bind-ro={self.src}:{self.dst}"

    def spec(self) -> str:
        return f"{self.src}:{self.dst}"


def log(message: str) -> None:
    print(f"testhosts: {message}", file=sys.stderr, flush=True)


class Deadline:
    def __init__(self, seconds: float, what: str) -> None:
        self.end = time.monotonic() + seconds
        self.seconds = seconds
        self.what = what

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def expired(self) -> bool:
        return time.monotonic() >= self.end

    def check(self, detail: str = "") -> None:
        if self.expired():
            extra = f"\n{detail}" if detail else ""
            raise TestHostsError(f"timed out after {self.seconds:g} s: {self.what}{extra}")


# ----------------------------------------------------------------------------------------------------- commands

def run(cmd: Sequence[str], timeout: float = 60, check: bool = True, input_text: Optional[str] = None,
        env: Optional[Dict[str, str]] = None, stdout_path: Optional[Path] = None) -> subprocess.CompletedProcess[str]:
    """Run a command in its own process group; on timeout the whole group is killed (debootstrap runs dpkg)."""
    out: Any = subprocess.PIPE
    handle = None
    if stdout_path is not None:
        handle = open(stdout_path, "a")  # noqa: SIM115 - closed below
        out = handle
    try:
        proc = subprocess.Popen(list(cmd), stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT if handle else subprocess.PIPE, text=True,
                                env=env, start_new_session=True)
    except OSError as exc:
        if handle:
            handle.close()
        raise TestHostsError(f"cannot run {' '.join(cmd)}: {exc}") from exc
    try:
        stdout, stderr = proc.communicate(input_text, timeout=timeout)
    except BaseException as exc:  # timeout, Ctrl-C: take the whole process group down with us
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        if isinstance(exc, subprocess.TimeoutExpired):
            raise TestHostsError(f"timed out after {timeout:g} s: {' '.join(cmd)}") from None
        raise
    finally:
        if handle:
            handle.close()
    result = subprocess.CompletedProcess(list(cmd), proc.returncode, stdout or "", stderr or "")
    if check and proc.returncode != 0:
        tail = tail_of(stdout_path) if stdout_path else (result.stderr.strip() or result.stdout.strip())
        raise TestHostsError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{tail}")
    return result


ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def tail_of(path: Optional[Path], lines: int = 40) -> str:
    """The last non-blank lines of a log, without terminal colour codes (nspawn's console output has them)."""
    if path is None or not path.exists():
        return f"({path} does not exist)"
    text = ANSI.sub("", path.read_text(errors="replace")).replace("\r", "")
    kept = [line for line in text.splitlines() if line.strip()]
    return "\n".join(kept[-lines:]) or f"({path} is empty)"


_APT_UPDATED = False


def ensure_commands(wanted: Dict[str, str]) -> None:
    """wanted: command -> Debian package. Installs the packages of missing commands (apt-get update once)."""
    global _APT_UPDATED
    missing = sorted({pkg for cmd, pkg in wanted.items() if shutil.which(cmd) is None})
    if not missing:
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if not _APT_UPDATED:
        log("apt-get update")
        run(["apt-get", "update", "-q"], timeout=300, env=env)
        _APT_UPDATED = True
    log(f"apt-get install {' '.join(missing)}")
    with no_service_starts():
        run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], timeout=600, env=env)
    still = sorted(cmd for cmd in wanted if shutil.which(cmd) is None)
    if still:
        raise TestHostsError(f"still missing after apt-get install: {', '.join(still)}")


@contextlib.contextmanager
def no_service_starts() -> Iterator[None]:
    """Keep package maintainer scripts from starting daemons on this machine (apt-cacher-ng on 0.0.0.0:3142)."""
    policy = Path("/usr/sbin/policy-rc.d")
    if policy.exists():
        yield
        return
    policy.write_text("#!/bin/sh\n# testhosts: no service starts during package installs\nexit 101\n")
    policy.chmod(0o755)
    try:
        yield
    finally:
        policy.unlink()


# ---------------------------------------------------------------------------------------------------- processes

def proc_start(pid: int) -> Optional[int]:
    """Start time (clock ticks since boot) of a live, non-zombie process; None when gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def proc_alive(pid: Optional[int], start: Optional[int]) -> bool:
    return bool(pid) and start is not None and proc_start(pid) == start  # type: ignore[arg-type]


def reap(pid: int) -> None:
    """Collect a child's exit status when we are its parent (API use); orphans stay zombies under this VM's PID 1."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def wait_gone(pid: int, start: int, deadline: Deadline) -> bool:
    while proc_alive(pid, start):
        reap(pid)
        if deadline.expired():
            return False
        time.sleep(0.05)
    reap(pid)
    return True


def kill_pid(pid: int, start: Optional[int], term_s: float = 10, what: str = "") -> bool:
    """SIGTERM, wait up to term_s, then SIGKILL; only if pid still is the process that started at `start`."""
    if start is None or not proc_alive(pid, start):
        reap(pid)
        return True
    log(f"stopping {what or 'process'} (pid {pid})")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if wait_gone(pid, start, Deadline(term_s, f"pid {pid} to exit")):
        return True
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return wait_gone(pid, start, Deadline(10, f"pid {pid} to die"))


def nspid_chain(pid: int) -> List[int]:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    except (FileNotFoundError, ProcessLookupError):
        pass
    return []


def netns_pids(netns: str) -> List[int]:
    if not Path("/run/netns", netns).exists():
        return []
    res = run(["ip", "netns", "pids", netns], timeout=20, check=False)
    return [int(x) for x in res.stdout.split() if x.isdigit()]


def tcp_peers() -> Dict[int, str]:
    """socket inode -> remote IPv4 address, for TCP sockets in this network namespace (v4-mapped v6 included)."""
    peers: Dict[int, str] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                remote_hex = cols[2].split(":")[0]
                # the kernel prints each 32-bit word of the address in host (little-endian) byte order
                raw = b"".join(bytes.fromhex(remote_hex[i:i + 8])[::-1] for i in range(0, len(remote_hex), 8))
                if len(raw) == 16:
                    if raw[:12] != b"\0" * 10 + b"\xff\xff":
                        continue
                    raw = raw[12:]
                peers[int(cols[9])] = socket.inet_ntoa(raw)
    return peers


def ssh_mux_pids(ips: Set[str]) -> List[Tuple[int, int]]:
    """(pid, start) of ssh ControlMaster `[mux]` processes with a TCP connection to one of `ips`."""
    if not ips:
        return []
    peers = tcp_peers()
    found: List[Tuple[int, int]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if "[mux]" not in cmdline or not cmdline.startswith("ssh"):
                continue
            inodes = set()
            for fd in (entry / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if any(peers.get(inode) in ips for inode in inodes):
            start = proc_start(int(entry.name))
            if start is not None:
                found.append((int(entry.name), start))
    return found


# ------------------------------------------------------------------------------------------------------- mounts

def mounts_under(path: Path) -> List[str]:
    """Mount points at or below `path`, deepest first."""
    prefix = str(path.resolve()).rstrip("/")
    points = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            point = line.split()[4].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                points.append(point)
    return sorted(set(points), key=lambda p: p.count("/"), reverse=True)


def overlays_using(lower: Path) -> List[str]:
    """Overlay mount points whose lowerdir is `lower`."""
    needle = f"lowerdir={lower.resolve()}"
    used = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            if " - overlay " in line and (needle + "," in line or line.rstrip().endswith(needle)):
                used.append(line.split()[4])
    return used


def unmount_all(path: Path, errors: List[str]) -> None:
    for point in mounts_under(path):
        deadline = Deadline(15, f"unmount {point}")
        while True:
            res = run(["umount", point], timeout=30, check=False)
            if res.returncode == 0 or point not in mounts_under(Path(point)):
                break
            if deadline.expired():
                log(f"umount {point} busy ({res.stderr.strip()}): detaching lazily")
                lazy = run(["umount", "-l", point], timeout=30, check=False)
                if lazy.returncode != 0:
                    errors.append(f"cannot unmount {point}: {lazy.stderr.strip()}")
                break
            time.sleep(0.2)


# ------------------------------------------------------------------------------------------------------ rootfs

def vm_mirror() -> str:
    """The Debian mirror this VM's apt uses for the main suite (one-line or deb822 sources)."""
    apt = Path("/etc/apt")
    files = [apt / "sources.list"] + sorted((apt / "sources.list.d").glob("*.list")) \
        + sorted((apt / "sources.list.d").glob("*.sources"))
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if path.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields: Dict[str, str] = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line:
                        continue
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.strip()
                if fields.get("enabled", "yes").lower() == "no" or "deb" not in fields.get("types", "").split():
                    continue
                if SUITE in fields.get("suites", "").split():
                    for uri in fields.get("uris", "").split():
                        if uri.startswith(("http://", "https://")):
                            return uri.rstrip("/")
        else:
            for line in text.splitlines():
                words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
                if len(words) >= 3 and words[0] == "deb" and words[2] == SUITE \
                        and words[1].startswith(("http://", "https://")):
                    return words[1].rstrip("/")
    return DEFAULT_MIRROR


def rootfs_stamp(mirror: str, include: Sequence[str]) -> Dict[str, Any]:
    return {"suite": SUITE, "variant": "minbase", "include": sorted(include), "mirror": mirror,
            "layout": ROOTFS_LAYOUT}


def read_stamp(rootfs: Path) -> Optional[Dict[str, Any]]:
    try:
        return json.loads((rootfs / STAMP_PATH).read_text())  # type: ignore[no-any-return]
    except (FileNotFoundError, ValueError):
        return None


@contextlib.contextmanager
def flock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_rootfs(cache_dir: Path, mirror: str, include: Sequence[str] = INCLUDE,
                  timeout: float = 1800) -> Path:
    """The cached rootfs for `include`; built with debootstrap into a temporary folder, renamed when complete."""
    target = cache_dir / f"rootfs-{SUITE}"
    wanted = rootfs_stamp(mirror, include)
    with flock(cache_dir / ".lock"):
        stamp = read_stamp(target)
        if stamp is not None and all(stamp.get(k) == v for k, v in wanted.items()):
            return target
        if stamp is not None or target.exists():
            diff = {k: (stamp or {}).get(k) for k in wanted if (stamp or {}).get(k) != wanted[k]}
            users = overlays_using(target)
            if users:
                raise TestHostsError(f"{target} must be rebuilt (it has {diff}, wanted {wanted}) but overlays "
                                     f"still use it: {users}; run `down` on their state folders first")
            log(f"cached rootfs {target} is stale or incomplete (it has {diff}): rebuilding")
        for stale in cache_dir.glob(f".rootfs-{SUITE}.*"):  # left by an interrupted build
            errors: List[str] = []
            unmount_all(stale, errors)
            if errors:
                raise TestHostsError(f"cannot clean {stale}: {'; '.join(errors)}")
            shutil.rmtree(stale)
        ensure_commands({"debootstrap": "debootstrap"})
        build = cache_dir / f".rootfs-{SUITE}.build-{os.getpid()}"
        build_log = cache_dir / "debootstrap.log"
        build_log.write_text("")
        log(f"debootstrap {SUITE} from {mirror} into {build} (log {build_log})")
        t0 = time.monotonic()
        try:
            run(["debootstrap", "--variant=minbase", f"--include={','.join(include)}", SUITE, str(build), mirror],
                timeout=timeout, stdout_path=build_log)
        except TestHostsError:
            errors = []
            unmount_all(build, errors)
            raise
        prepare_rootfs(build)
        (build / STAMP_PATH).write_text(json.dumps({**wanted, "built": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                                    "packages": installed_packages(build)}, indent=1) + "\n")
        if target.exists():
            users = overlays_using(target)
            if users:
                raise TestHostsError(f"{target} must be rebuilt but overlays still use it: {users}; run `down` first")
            old = cache_dir / f".rootfs-{SUITE}.old-{os.getpid()}"
            target.rename(old)
            build.rename(target)
            shutil.rmtree(old)
        else:
            build.rename(target)
        log(f"rootfs ready in {time.monotonic() - t0:.0f} s: {target}")
        return target


def installed_packages(rootfs: Path) -> Dict[str, str]:
    res = run(["dpkg-query", f"--admindir={rootfs}/var/lib/dpkg", "-W", "-f", "${Package}\t${Version}\n"],
              timeout=60, check=False)
    return dict(line.split("\t", 1) for line in res.stdout.splitlines() if "\t" in line)


SYSFS_NET_UNIT = """\
[Unit]
Description=testhosts: /sys/class/net of this machine's network namespace
DefaultDependencies=no
Before=sysinit.target network-pre.target
ConditionVirtualization=container

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -euc 'd=/run/testhosts-sysfs; mkdir -p $$d; mount -t sysfs -o ro,nosuid,nodev,noexec sysfs $$d; \\
mount --bind $$d/class/net /sys/class/net; mount --bind $$d/devices/virtual/net /sys/devices/virtual/net; \\
umount -l $$d; rmdir $$d'

[Install]
WantedBy=sysinit.target
"""


def prepare_rootfs(rootfs: Path) -> None:
    """What every machine shares: sshd enabled without host keys (each machine gets its own), no DNS, apt quirks."""
    for key in (rootfs / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    dropin = rootfs / "etc/ssh/sshd_config.d"
    dropin.mkdir(parents=True, exist_ok=True)
    (dropin / "testhosts.conf").write_text(
        "# testhosts: each machine gets its own ed25519 host key; key-only root login\n"
        "HostKey /etc/ssh/ssh_host_ed25519_key\nPasswordAuthentication no\nPermitRootLogin prohibit-password\n"
        "UseDNS no\n")
    wants = rootfs / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    if not (wants / "ssh.service").is_symlink():
        (wants / "ssh.service").symlink_to("/lib/systemd/system/ssh.service")
    # machine-id: written per machine; an empty one here would make systemd generate one per boot.
    (rootfs / "etc/machine-id").write_text("")
    with contextlib.suppress(FileNotFoundError):
        (rootfs / "var/lib/dbus/machine-id").unlink()
    (rootfs / "etc/hostname").write_text("localhost\n")
    resolv = rootfs / "etc/resolv.conf"
    if resolv.is_symlink() or resolv.exists():
        resolv.unlink()
    resolv.write_text("# testhosts: no DNS inside test machines; names come from /etc/hosts\n")
    # The VM's mirror may be a dated snapshot: its Release files are past Valid-Until.
    (rootfs / "etc/apt/apt.conf.d/99testhosts").write_text(
        'Acquire::Check-Valid-Until "false";\nAcquire::Check-Date "false";\nAcquire::Retries "1";\n'
        'Acquire::http::Timeout "20";\n')
    root_ssh = rootfs / "root/.ssh"
    root_ssh.mkdir(mode=0o700, exist_ok=True)
    # With --network-namespace-path, nspawn mounts /sys before it joins the namespace, so /sys/class/net shows
    # this VM's interfaces (Ansible facts then report the VM's MAC and MTU). Mount a sysfs from inside and bind its
    # net folders over.
    unit = rootfs / "etc/systemd/system/testhosts-sysfs-net.service"
    unit.write_text(SYSFS_NET_UNIT)
    sysinit = rootfs / "etc/systemd/system/sysinit.target.wants"
    sysinit.mkdir(parents=True, exist_ok=True)
    link = sysinit / unit.name
    if not link.is_symlink():
        link.symlink_to(f"/etc/systemd/system/{unit.name}")
    for deb in (rootfs / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()


# ------------------------------------------------------------------------------------------------- test hosts

class TestHosts:
    """N systemd-nspawn machines th1..thN, driven from a state folder; `up` is idempotent, `down` is safe to repeat.

    state_dir holds state.json, the SSH key pair (ssh/id_ed25519), inventory.yml, logs/ and the machines' overlays.
    bridge/subnet default to what state.json recorded, else sfbr0 and 10.99.0.0/24 (bridge .1, hosts .11, .12...).
    """

    __test__ = False  # not a pytest test class

    def __init__(self, state_dir: os.PathLike[str] | str, bridge: Optional[str] = None,
                 subnet: Optional[str] = None, cache_dir: Optional[os.PathLike[str] | str] = None,
                 mirror: Optional[str] = None, include: Sequence[str] = INCLUDE) -> None:
        self.state_dir = Path(state_dir).absolute()
        self.cache_dir = Path(cache_dir or os.environ.get("TESTHOSTS_CACHE") or DEFAULT_CACHE).absolute()
        self.include = tuple(include)
        self._mirror = mirror
        saved = self._load()
        self.bridge = bridge or saved.get("bridge") or DEFAULT_BRIDGE
        self.subnet = ipaddress.ip_network(subnet or saved.get("subnet") or DEFAULT_SUBNET)
        if self.subnet.version != 4 or self.subnet.prefixlen > 28:
            raise TestHostsError(f"subnet {self.subnet}: want an IPv4 network of /28 or larger")
        if not re.fullmatch(r"[a-zA-Z][a-zA-Z0-9]{0,8}", self.bridge):
            raise TestHostsError(f"bridge name {self.bridge!r}: want 1-9 letters/digits, starting with a letter")
        if saved and (saved.get("bridge"), saved.get("subnet")) != (self.bridge, str(self.subnet)) \
                and saved.get("hosts"):
            raise TestHostsError(f"{self.state_dir} is up with bridge {saved.get('bridge')} subnet "
                                 f"{saved.get('subnet')}; run `down` before changing them")
        self.gateway = str(self.subnet.network_address + 1)
        self._children: Dict[int, subprocess.Popen[bytes]] = {}

    # ---------------------------------------------------------------- paths and state
    @property
    def key_path(self) -> Path:
        return self.state_dir / "ssh" / "id_ed25519"

    @property
    def inventory_path(self) -> Path:
        return self.state_dir / "inventory.yml"

    @property
    def state_path(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def mirror(self) -> str:
        if self._mirror is None:
            self._mirror = vm_mirror()
        return self._mirror

    @property
    def hosts(self) -> List[Host]:
        """The hosts recorded as up, in order th1, th2, ..."""
        hosts = self._load().get("hosts", {})
        return [Host(name, hosts[name]["ip"]) for name in sorted(hosts, key=lambda n: int(n[2:]))]

    def ip_of(self, name: str) -> str:
        return str(self.subnet.network_address + HOST_OFFSET + int(name[2:]))

    def netns(self, name: str) -> str:
        return f"{self.bridge}-{name}"

    def machine_dir(self, name: str) -> Path:
        return self.state_dir / "machines" / name

    def log_path(self, name: str) -> Path:
        return self.state_dir / "logs" / f"{name}.log"

    def _load(self) -> Dict[str, Any]:
        try:
            return json.loads(self.state_path.read_text())  # type: ignore[no-any-return]
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            raise TestHostsError(f"{self.state_path} is not valid JSON: {exc}") from exc

    def _save(self, state: Dict[str, Any]) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
        tmp.rename(self.state_path)

    # ---------------------------------------------------------------- up
    def up(self, count: int, binds: Iterable[Bind | str] = (), apt_proxy: bool = False,
           timeout: float = 180, device_policy: bool = False) -> List[Host]:
        """Bring up th1..th<count> (stopping any beyond count); return when each answers SSH and systemd is up.

        A running host whose binds or device_policy differ is restarted. A host that is (re)started begins from a
        fresh overlay. apt_proxy starts apt-cacher-ng on the bridge address and points each machine's apt at it; once
        started it stays until down(). device_policy boots the machines so that systemd inside enforces the units'
        DevicePolicy= and DeviceAllow= (see DEVICE_POLICY_ENV). timeout bounds the boot wait (the rootfs build has
        its own, longer deadline).
        """
        if os.geteuid() != 0:
            raise TestHostsError("test hosts need root (mounts, network namespaces, systemd-nspawn)")
        if not 1 <= count <= min(200, self.subnet.num_addresses - HOST_OFFSET - 2):
            raise TestHostsError(f"count {count} does not fit subnet {self.subnet}")
        bind_list = sorted({b if isinstance(b, Bind) else Bind.parse(b) for b in binds}, key=lambda b: b.dst)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with flock(self.state_dir / ".lock"):
            ensure_commands({"systemd-nspawn": "systemd-container", "ip": "iproute2", "ssh": "openssh-client",
                             "ssh-keygen": "openssh-client", "mount": "mount"})
            rootfs = ensure_rootfs(self.cache_dir, self.mirror, self.include)
            self._ensure_key()
            state = self._load()
            state.update(version=1, bridge=self.bridge, subnet=str(self.subnet), rootfs=str(rootfs))
            state.setdefault("hosts", {})
            self._save(state)
            self._ensure_bridge(state)
            if apt_proxy or state.get("apt_proxy"):
                self._ensure_apt_proxy(state)
            wanted = [f"th{i}" for i in range(1, count + 1)]
            for name in sorted(set(state["hosts"]) - set(wanted)):
                log(f"{name}: beyond --count {count}, stopping it")
                errors: List[str] = []
                self._stop_host(state, name, errors)
                if errors:
                    raise TestHostsError(f"{name}: cannot stop it: {'; '.join(errors)}")
            for name in wanted:
                entry = state["hosts"].get(name)
                if entry and self._host_running(name, entry):
                    if entry.get("binds", []) == [b.spec() for b in bind_list] and entry.get("rootfs") == str(rootfs) \
                            and entry.get("device_policy", False) == device_policy:
                        continue
                    log(f"{name}: binds, rootfs or device policy changed, restarting it")
                if entry:
                    errors = []
                    self._stop_host(state, name, errors)
                    if errors:
                        raise TestHostsError(f"{name}: cannot clean up the previous machine: {'; '.join(errors)}")
                self._create_host(state, name, rootfs, bind_list, device_policy)
            for name in wanted:  # every machine knows every other by name
                self._write_etc_hosts(name, wanted)
            self._write_inventory(wanted)
            self._wait_ready(state, wanted, Deadline(timeout, f"test hosts {', '.join(wanted)} to boot"))
            self._save(state)
        return self.hosts

    def _ensure_key(self) -> None:
        if self.key_path.exists() and self.key_path.with_suffix(".pub").exists():
            return
        self.key_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        for path in (self.key_path, self.key_path.with_suffix(".pub")):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "testhosts", "-f", str(self.key_path)], timeout=30)

    def _orphaned_bridge(self) -> bool:
        """Whether the bridge is a leftover of test hosts whose state folder is gone (a `make test` killed before
        its `down`, its checkout removed), with no process left in any of its hosts' network namespaces: then it
        and those namespaces are removed, and True."""
        alias = Path("/sys/class/net", self.bridge, "ifalias")
        owner = alias.read_text().strip() if alias.exists() else ""
        if not owner.startswith(BRIDGE_ALIAS) or Path(owner[len(BRIDGE_ALIAS):], "state.json").exists():
            return False
        spaces = [n for n in (p.name for p in Path("/run/netns").glob(f"{self.bridge}-*"))]
        if any(netns_pids(n) for n in spaces):
            return False
        for n in spaces:
            run(["ip", "netns", "del", n], timeout=20, check=False)
            run(["ip", "link", "del", n], timeout=20, check=False)
        run(["ip", "link", "del", self.bridge], timeout=20, check=False)
        return not Path("/sys/class/net", self.bridge).exists()

    def _ensure_bridge(self, state: Dict[str, Any]) -> None:
        exists = Path("/sys/class/net", self.bridge).exists()
        if exists and not state.get("bridge_created") and self._orphaned_bridge():
            exists = False
        if exists and not state.get("bridge_created"):
            raise TestHostsError(f"network interface {self.bridge} exists and was not created by {self.state_dir}; "
                                 "pick another --bridge")
        if not exists:
            self._check_subnet_free()
            state["bridge_created"] = True
            self._save(state)
            run(["ip", "link", "add", self.bridge, "type", "bridge"], timeout=20)
            run(["ip", "link", "set", "dev", self.bridge, "alias", f"{BRIDGE_ALIAS}{self.state_dir}"], timeout=20)
            run(["ip", "addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge], timeout=20)
            run(["ip", "link", "set", self.bridge, "up"], timeout=20)
        addrs = json.loads(run(["ip", "-j", "-4", "addr", "show", "dev", self.bridge], timeout=20).stdout or "[]")
        have = {(a["local"], a["prefixlen"]) for i in addrs for a in i.get("addr_info", [])}
        if (self.gateway, self.subnet.prefixlen) not in have:
            run(["ip", "addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge], timeout=20)
        run(["ip", "link", "set", self.bridge, "up"], timeout=20)

    def _check_subnet_free(self) -> None:
        addrs = json.loads(run(["ip", "-j", "-4", "addr"], timeout=20).stdout or "[]")
        for iface in addrs:
            for addr in iface.get("addr_info", []):
                net = ipaddress.ip_network(f"{addr['local']}/{addr['prefixlen']}", strict=False)
                if net.overlaps(self.subnet):
                    raise TestHostsError(f"subnet {self.subnet} overlaps {net} on {iface['ifname']}; pick --subnet")
        for route in json.loads(run(["ip", "-j", "-4", "route"], timeout=20).stdout or "[]"):
            if route.get("dst", "default") != "default" \
                    and ipaddress.ip_network(route["dst"], strict=False).overlaps(self.subnet):
                raise TestHostsError(f"subnet {self.subnet} overlaps route {route['dst']}; pick --subnet")

    def _host_running(self, name: str, entry: Dict[str, Any]) -> bool:
        return (proc_alive(entry.get("pid"), entry.get("start"))
                and Path("/run/netns", self.netns(name)).exists()
                and os.path.ismount(self.machine_dir(name) / "merged"))

    def _create_host(self, state: Dict[str, Any], name: str, rootfs: Path, binds: Sequence[Bind],
                     device_policy: bool = False) -> None:
        ip, netns = self.ip_of(name), self.netns(name)
        if Path("/run/netns", netns).exists():
            raise TestHostsError(f"network namespace {netns} exists and is not recorded in {self.state_path}")
        mdir = self.machine_dir(name)
        state["hosts"][name] = {"ip": ip, "netns": netns, "veth": netns, "binds": [b.spec() for b in binds],
                                "rootfs": str(rootfs), "device_policy": device_policy}
        self._save(state)  # recorded before anything exists, so a failed up can always be cleaned by down
        if mdir.exists():
            shutil.rmtree(mdir)
        for sub in ("upper", "work", "merged"):
            (mdir / sub).mkdir(parents=True)
        run(["mount", "-t", "overlay", "overlay", "-o",
             f"lowerdir={rootfs},upperdir={mdir / 'upper'},workdir={mdir / 'work'}", str(mdir / "merged")],
            timeout=30)
        self._write_machine_files(name, mdir / "merged", apt_proxy=bool(state.get("apt_proxy")))
        # network: netns with lo + eth0 (peer of a veth on the bridge), static address and default route
        run(["ip", "netns", "add", netns], timeout=20)
        run(["ip", "link", "add", netns, "type", "veth", "peer", "name", "eth0", "netns", netns], timeout=20)
        run(["ip", "link", "set", netns, "master", self.bridge, "up"], timeout=20)
        run(["ip", "-n", netns, "link", "set", "lo", "up"], timeout=20)
        run(["ip", "-n", netns, "addr", "add", f"{ip}/{self.subnet.prefixlen}", "dev", "eth0"], timeout=20)
        run(["ip", "-n", netns, "link", "set", "eth0", "up"], timeout=20)
        run(["ip", "-n", netns, "route", "add", "default", "via", self.gateway], timeout=20)
        # machine name = netns name: unique across state folders with different bridges (nspawn keys
        # /run/systemd/nspawn/propagate/<machine> on it); the hostname inside is the short name.
        cmd = ["systemd-nspawn", "--keep-unit", "--register=no", f"--machine={netns}", f"--hostname={name}",
               "-D", str(mdir / "merged"), "-b", f"--network-namespace-path=/run/netns/{netns}",
               "--console=read-only", "--link-journal=no", "--resolv-conf=off", "--settings=no",
               *(DEVICE_POLICY_ARGS if device_policy else ()), *[b.option() for b in binds]]
        env_extra = DEVICE_POLICY_ENV if device_policy else {}
        logfile = self.log_path(name)
        logfile.parent.mkdir(parents=True, exist_ok=True)
        with open(logfile, "w") as out:
            out.write(f"# {' '.join([*(f'{k}={v}' for k, v in env_extra.items()), *cmd])}\n")
            out.flush()
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, close_fds=True, env={**os.environ, **env_extra})
        start = proc_start(proc.pid)
        self._children[proc.pid] = proc
        state["hosts"][name].update(pid=proc.pid, start=start)
        self._save(state)
        log(f"{name}: booting {ip} (nspawn pid {proc.pid}, log {logfile})")

    def _write_machine_files(self, name: str, root: Path, apt_proxy: bool) -> None:
        (root / "etc/hostname").write_text(f"{name}\n")
        (root / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
        ssh_dir = root / "root/.ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        ssh_dir.chmod(0o700)
        keys = ssh_dir / "authorized_keys"
        keys.write_text(self.key_path.with_suffix(".pub").read_text())
        keys.chmod(0o600)
        host_key = root / "etc/ssh/ssh_host_ed25519_key"
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{name}", "-f", str(host_key)], timeout=30)
        self._write_apt_proxy_conf(root, apt_proxy)

    def _write_apt_proxy_conf(self, root: Path, enabled: bool) -> None:
        conf = root / "etc/apt/apt.conf.d/01testhosts-proxy"
        if enabled:
            conf.write_text(f'Acquire::http::Proxy "http://{self.gateway}:{APT_PROXY_PORT}";\n')
        elif conf.exists():
            conf.unlink()

    def _write_etc_hosts(self, name: str, names: Sequence[str]) -> None:
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback",
                 f"{self.ip_of(name)}\t{name}"]
        lines += [f"{self.ip_of(other)}\t{other}" for other in names if other != name]
        lines.append(f"{self.gateway}\ttesthosts-gateway")
        (self.machine_dir(name) / "merged/etc/hosts").write_text("\n".join(lines) + "\n")

    def _write_inventory(self, names: Sequence[str]) -> None:
        common = " ".join(SSH_OPTS)
        lines = ["# written by tests/hosts/testhosts.py", "all:", "  children:", "    testhosts:", "      hosts:"]
        for name in names:
            lines += [f"        {name}:",
                      f"          ansible_host: {json.dumps(self.ip_of(name))}",
                      "          ansible_user: root",
                      f"          ansible_ssh_private_key_file: {json.dumps(str(self.key_path))}",
                      f"          ansible_ssh_common_args: {json.dumps(common)}",
                      "          ansible_python_interpreter: /usr/bin/python3"]
        self.inventory_path.write_text("\n".join(lines) + "\n")

    def ssh_command(self, name_or_ip: str, command: str = "") -> List[str]:
        ip = self.ip_of(name_or_ip) if re.fullmatch(r"th[0-9]+", name_or_ip) else name_or_ip
        cmd = ["ssh", "-i", str(self.key_path), *SSH_OPTS, "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
               "-o", "LogLevel=ERROR", "-o", "ControlMaster=no", "-o", "ControlPath=none", f"root@{ip}"]
        return cmd + ([command] if command else [])

    def ssh(self, name: str, command: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run `command` on host `name` (e.g. "th1") as root over SSH."""
        return run(self.ssh_command(name, command), timeout=timeout, check=check)

    def _wait_ready(self, state: Dict[str, Any], names: Sequence[str], deadline: Deadline) -> None:
        pending = {name: "no SSH yet" for name in names}
        while pending:
            for name in list(pending):
                entry = state["hosts"][name]
                if not proc_alive(entry.get("pid"), entry.get("start")):
                    reap(entry.get("pid") or 0)
                    raise TestHostsError(f"{name}: systemd-nspawn (pid {entry.get('pid')}) exited during boot; "
                                         f"{self.log_path(name)} ends:\n{tail_of(self.log_path(name))}")
                try:
                    with socket.create_connection((entry["ip"], 22), timeout=1):
                        pass
                except OSError as exc:
                    pending[name] = f"port 22: {exc}"
                    continue
                res = run(self.ssh_command(name, "systemctl is-system-running"),
                          timeout=max(5.0, min(30.0, deadline.left())), check=False)
                status = res.stdout.strip()
                pending[name] = f"is-system-running: {status or res.stderr.strip()}"
                if status in GOOD_STATES:
                    del pending[name]
                    entry["leader"] = self._leader(name)
                    if status == "degraded":
                        failed = self.ssh(name, "systemctl --failed --no-legend --plain", check=False).stdout
                        log(f"{name}: degraded; failed units: {failed.strip()}")
                    log(f"{name}: {status} ({entry['ip']})")
                elif status in BAD_STATES:
                    raise TestHostsError(f"{name}: systemd reports {status}; {self.log_path(name)} ends:\n"
                                         f"{tail_of(self.log_path(name))}")
            if pending:
                detail = "\n".join(f"{n}: {why}; {self.log_path(n)} ends:\n{tail_of(self.log_path(n), 15)}"
                                   for n, why in pending.items())
                deadline.check(detail)
                time.sleep(0.2)

    def _leader(self, name: str) -> Optional[int]:
        """The machine's PID 1 as seen from this VM (for `nsenter -a -t <leader>`)."""
        for pid in netns_pids(self.netns(name)):
            chain = nspid_chain(pid)
            if len(chain) > 1 and chain[-1] == 1:
                return pid
        return None

    # ---------------------------------------------------------------- apt proxy
    def _ensure_apt_proxy(self, state: Dict[str, Any]) -> None:
        proxy = state.get("apt_proxy") or {}
        if proc_alive(proxy.get("pid"), proxy.get("start")):
            return
        ensure_commands({"apt-cacher-ng": "apt-cacher-ng"})
        pdir = self.state_dir / "apt-proxy"
        conf = pdir / "conf"
        for sub in ("cache", "log"):
            (pdir / sub).mkdir(parents=True, exist_ok=True)
        if conf.exists():
            shutil.rmtree(conf)
        shutil.copytree("/etc/apt-cacher-ng", conf)
        (conf / "backends_debian").write_text(self.mirror + "/\n")
        cmd = ["apt-cacher-ng", "-c", str(conf), "ForeGround=1", f"BindAddress={self.gateway}",
               f"Port={APT_PROXY_PORT}", f"CacheDir={pdir / 'cache'}", f"LogDir={pdir / 'log'}",
               f"SocketPath={pdir / 'socket'}", f"PidFile={pdir / 'pid'}"]
        logfile = self.state_dir / "logs" / "apt-proxy.log"
        logfile.parent.mkdir(parents=True, exist_ok=True)
        with open(logfile, "w") as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, close_fds=True)
        self._children[proc.pid] = proc
        state["apt_proxy"] = {"pid": proc.pid, "start": proc_start(proc.pid),
                              "url": f"http://{self.gateway}:{APT_PROXY_PORT}"}
        self._save(state)
        deadline = Deadline(30, f"apt-cacher-ng to listen on {self.gateway}:{APT_PROXY_PORT}")
        while True:
            if proc.poll() is not None:
                raise TestHostsError(f"apt-cacher-ng exited ({proc.returncode}); {logfile} ends:\n{tail_of(logfile)}")
            with contextlib.suppress(OSError), socket.create_connection((self.gateway, APT_PROXY_PORT), timeout=1):
                break
            deadline.check(tail_of(logfile))
            time.sleep(0.1)
        log(f"apt proxy on {state['apt_proxy']['url']} (pid {proc.pid}) -> {self.mirror}")
        for name in state["hosts"]:  # machines already up get the proxy too
            merged = self.machine_dir(name) / "merged"
            if os.path.ismount(merged):
                self._write_apt_proxy_conf(merged, True)

    # ---------------------------------------------------------------- down
    def down(self, term_timeout: float = 20) -> None:
        """Stop everything this state folder started; safe to repeat and after a partial up. Raises on leftovers."""
        if not self.state_dir.exists():
            return
        errors: List[str] = []
        with flock(self.state_dir / ".lock"):
            state = self._load()
            hosts = state.get("hosts", {})
            for pid, start in ssh_mux_pids({h["ip"] for h in hosts.values()}):
                if not kill_pid(pid, start, 5, "ssh ControlMaster [mux]"):
                    errors.append(f"ssh mux pid {pid} did not exit")
            for name in sorted(hosts):
                self._stop_host(state, name, errors, term_timeout)
            proxy = state.get("apt_proxy")
            if proxy:
                if kill_pid(proxy.get("pid") or 0, proxy.get("start"), 10, "apt-cacher-ng"):
                    state.pop("apt_proxy")
                    self._save(state)
                else:
                    errors.append(f"apt-cacher-ng pid {proxy.get('pid')} did not exit")
            if state.get("bridge_created") and Path("/sys/class/net", state["bridge"]).exists():
                res = run(["ip", "link", "del", state["bridge"]], timeout=20, check=False)
                if res.returncode != 0:
                    errors.append(f"ip link del {state['bridge']}: {res.stderr.strip()}")
            if not errors:
                state.pop("bridge_created", None)
            unmount_all(self.state_dir, errors)
            leftover = mounts_under(self.state_dir)
            if leftover:
                errors.append(f"still mounted: {leftover}")
            elif (self.state_dir / "machines").exists():
                shutil.rmtree(self.state_dir / "machines")
            if not errors and self.state_path.exists():
                self.state_path.unlink()
            elif state:
                self._save(state)
        if errors:
            raise TestHostsError("down left things behind:\n" + "\n".join(errors))

    def _stop_host(self, state: Dict[str, Any], name: str, errors: List[str], term_timeout: float = 20) -> None:
        entry = state["hosts"].get(name, {})
        netns = entry.get("netns", self.netns(name))
        pid, start = entry.get("pid"), entry.get("start")
        if pid and proc_alive(pid, start):
            # SIGTERM makes nspawn power the machine off cleanly; if that hangs, SIGKILL what runs inside the netns
            # (the machine's PID 1 among them, which ends its PID namespace), then nspawn itself.
            log(f"{name}: stopping (nspawn pid {pid})")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            if not wait_gone(pid, start, Deadline(term_timeout, f"{name} to power off")):
                log(f"{name}: no clean poweroff in {term_timeout:.0f} s, killing")
                for inner in netns_pids(netns):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(inner, signal.SIGKILL)
                if not kill_pid(pid, start, 5, f"{name} systemd-nspawn"):
                    errors.append(f"{name}: systemd-nspawn pid {pid} did not exit")
        elif pid:
            reap(pid)
        proc = self._children.pop(pid or 0, None)
        if proc is not None:
            proc.poll()
        for inner in netns_pids(netns):  # anything else left in the machine's network namespace
            istart = proc_start(inner)
            if istart is not None and not kill_pid(inner, istart, 5, f"{name} leftover process"):
                errors.append(f"{name}: pid {inner} in netns {netns} did not exit")
        merged = self.machine_dir(name) / "merged"
        unmount_all(merged, errors)
        if Path("/run/netns", netns).exists():
            res = run(["ip", "netns", "del", netns], timeout=20, check=False)
            if res.returncode != 0:
                errors.append(f"ip netns del {netns}: {res.stderr.strip()}")
        veth = entry.get("veth", netns)
        if Path("/sys/class/net", veth).exists():  # normally gone with the namespace (asynchronously)
            res = run(["ip", "link", "del", veth], timeout=20, check=False)
            if res.returncode != 0 and Path("/sys/class/net", veth).exists():
                errors.append(f"ip link del {veth}: {res.stderr.strip()}")
        if not mounts_under(self.machine_dir(name)) and self.machine_dir(name).exists():
            shutil.rmtree(self.machine_dir(name))
        if not any(e.startswith(f"{name}:") for e in errors):
            state["hosts"].pop(name, None)
            self._save(state)

    # ---------------------------------------------------------------- status
    def status(self) -> List[Dict[str, Any]]:
        state = self._load()
        out = []
        for host in self.hosts:
            entry = state["hosts"][host.name]
            out.append({"name": host.name, "ip": host.ip, "running": self._host_running(host.name, entry),
                        "pid": entry.get("pid"), "leader": entry.get("leader"), "binds": entry.get("binds", []),
                        "device_policy": entry.get("device_policy", False), "log": str(self.log_path(host.name))})
        return out


# ------------------------------------------------------------------------------------------------------------- CLI

def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="bring up th1..thN (idempotent); writes STATE/inventory.yml")
    up.add_argument("--count", type=int, required=True)
    up.add_argument("--bind-ro", action="append", default=[], metavar="SRC[:DST]",
                    help="read-only bind into every machine (repeatable)")
    up.add_argument("--apt-proxy", action="store_true", help="apt-cacher-ng on the bridge address for apt inside")
    up.add_argument("--device-policy", action="store_true",
                    help="systemd inside enforces DevicePolicy=/DeviceAllow= (cgroup v2 inside, bpf() allowed)")
    up.add_argument("--bridge", help=f"bridge name (default {DEFAULT_BRIDGE}, or what STATE recorded)")
    up.add_argument("--subnet", help=f"IPv4 subnet (default {DEFAULT_SUBNET}, or what STATE recorded)")
    up.add_argument("--cache", help=f"rootfs cache folder (default $TESTHOSTS_CACHE or {DEFAULT_CACHE})")
    up.add_argument("--mirror", help="Debian mirror (default: the one this VM's apt uses)")
    up.add_argument("--timeout", type=float, default=180, help="seconds for the machines to boot (default 180)")
    down = sub.add_parser("down", help="stop and remove everything STATE started (safe to repeat)")
    rootfs = sub.add_parser("rootfs", help="build the cached rootfs now (`up` builds it when missing)")
    rootfs.add_argument("--cache", help=f"rootfs cache folder (default $TESTHOSTS_CACHE or {DEFAULT_CACHE})")
    rootfs.add_argument("--mirror", help="Debian mirror (default: the one this VM's apt uses)")
    status = sub.add_parser("status", help="list the hosts and whether they run")
    ssh = sub.add_parser("ssh", help="run a command on a host over SSH")
    ssh.add_argument("host")
    ssh.add_argument("command", nargs=argparse.REMAINDER)
    for p in (up, down, status, ssh):
        p.add_argument("--state", required=True, help="state folder (key, inventory, overlays, logs)")
    args = parser.parse_args(argv)
    try:
        if args.action == "up":
            th = TestHosts(args.state, bridge=args.bridge, subnet=args.subnet, cache_dir=args.cache,
                           mirror=args.mirror)
            t0 = time.monotonic()
            th.up(args.count, binds=args.bind_ro, apt_proxy=args.apt_proxy, timeout=args.timeout,
                  device_policy=args.device_policy)
            log(f"up: {len(th.hosts)} host(s) ready in {time.monotonic() - t0:.1f} s; inventory {th.inventory_path}")
            print(th.inventory_path.read_text(), end="")
        elif args.action == "rootfs":
            if os.geteuid() != 0:
                raise TestHostsError("the rootfs is built as root (debootstrap)")
            cache = Path(args.cache or os.environ.get("TESTHOSTS_CACHE") or DEFAULT_CACHE).absolute()
            cache.mkdir(parents=True, exist_ok=True)
            log(f"rootfs: {ensure_rootfs(cache, args.mirror or vm_mirror())}")
        elif args.action == "down":
            th = TestHosts(args.state)
            t0 = time.monotonic()
            th.down()
            log(f"down: done in {time.monotonic() - t0:.1f} s")
        elif args.action == "status":
            for row in TestHosts(args.state).status():
                print(json.dumps(row))
        else:
            th = TestHosts(args.state)
            return subprocess.call(th.ssh_command(args.host, " ".join(args.command)))
    except TestHostsError as exc:
        print(f"testhosts: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"testhosts: interrupted; `down --state {getattr(args, 'state', 'STATE')}` removes what was "
              "started", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Two real nspawn test hosts: SSH, systemd running, Ansible ping, a read-only bind; then nothing left after down."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.hosts.testhosts import TestHosts, mounts_under, netns_pids, ssh_mux_pids

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE = Path(sys.executable).parent / "ansible"
# Its own bridge and subnet, so it can run while a `testhosts.py up` session on the defaults (sfbr0) is up.
BRIDGE = "thpytest"
SUBNET = "10.99.77.0/24"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="test hosts need root (mounts, netns, systemd-nspawn)"),
    pytest.mark.skipif(not Path("/proc/sys/net").exists(), reason="no network namespaces here"),
]


@pytest.fixture(scope="module")
def bind_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("bind")
    (src / "marker.txt").write_text("bound read-only\n")
    return src


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory, bind_src: Path) -> Iterator[TestHosts]:
    th = TestHosts(tmp_path_factory.mktemp("testhosts"), bridge=BRIDGE, subnet=SUBNET)
    ips = {str(th.ip_of(name)) for name in ("th1", "th2")}
    try:
        th.up(2, binds=[f"{bind_src}:/opt/bound"])
        yield th
    finally:
        th.down()
        assert_nothing_left(th, ips)


def assert_nothing_left(th: TestHosts, ips: set[str]) -> None:
    assert not ssh_mux_pids(ips), "ssh ControlMaster processes to the hosts left"
    assert not mounts_under(th.state_dir), "mounts left under the state folder"
    assert not Path("/sys/class/net", BRIDGE).exists(), f"bridge {BRIDGE} left"
    for name in ("th1", "th2"):
        netns = th.netns(name)
        assert not Path("/run/netns", netns).exists(), f"netns {netns} left"
        assert not netns_pids(netns)
        assert not Path("/sys/class/net", netns).exists(), f"veth {netns} left"
    ps = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True, check=True).stdout
    live = [line for line in ps.splitlines() if not line.lstrip().startswith("Z")]
    assert not [line for line in live if "systemd-nspawn" in line and str(th.state_dir) in line]
    assert not th.hosts


def ansible(th: TestHosts, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "PATH": f"{ANSIBLE.parent}:{os.environ.get('PATH', '')}"}
    return subprocess.run([str(ANSIBLE), "-i", str(th.inventory_path), "testhosts", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_inventory_lists_both_hosts(hosts: TestHosts) -> None:
    assert [h.name for h in hosts.hosts] == ["th1", "th2"]
    text = hosts.inventory_path.read_text()
    for host in hosts.hosts:
        assert f'ansible_host: "{host.ip}"' in text
    assert "UserKnownHostsFile=/dev/null" in text


def test_ssh_and_systemd_running(hosts: TestHosts) -> None:
    for host in hosts.hosts:
        res = subprocess.run(["ssh", "-i", str(hosts.key_path), "-o", "StrictHostKeyChecking=no",
                              "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", f"root@{host.ip}",
                              "hostname; systemctl is-system-running"],
                             capture_output=True, text=True, timeout=60)
        lines = res.stdout.split()
        assert lines[0] == host.name, res
        assert lines[1] in ("running", "degraded"), res


def test_read_only_bind(hosts: TestHosts) -> None:
    assert hosts.ssh("th1", "cat /opt/bound/marker.txt").stdout == "bound read-only\n"
    res = hosts.ssh("th2", "touch /opt/bound/x", check=False)
    assert res.returncode != 0 and "Read-only file system" in res.stderr


def test_ansible_ping_and_systemd(hosts: TestHosts) -> None:
    res = ansible(hosts, "-m", "ansible.builtin.ping")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("pong") == 2
    res = ansible(hosts, "-m", "ansible.builtin.systemd", "-a", "name=ssh state=started")
    assert res.returncode == 0, res.stdout + res.stderr


def test_up_again_is_a_no_op(hosts: TestHosts, bind_src: Path) -> None:
    before = [(row["name"], row["pid"]) for row in hosts.status()]
    hosts.up(2, binds=[f"{bind_src}:/opt/bound"])
    assert [(row["name"], row["pid"]) for row in hosts.status()] == before


def test_a_bridge_left_by_a_killed_run_is_cleared_and_a_live_ones_is_not(tmp_path: Path) -> None:
    """A `make test` killed before its `down`, its checkout removed: its bridge (alias naming its state folder)
    and its hosts' network namespaces are leftovers, cleared by the next run. A bridge whose folder still exists,
    or whose namespaces hold a process, is another run's: refused as before."""
    from tests.hosts.testhosts import BRIDGE_ALIAS, TestHostsError
    gone = tmp_path / "gone-checkout" / ".work" / "testhosts"
    bridge, ns = "sfbrzz", "sfbrzz-th1"

    def leave(owner: Path) -> None:
        subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], check=True)
        subprocess.run(["ip", "link", "set", "dev", bridge, "alias", f"{BRIDGE_ALIAS}{owner}"], check=True)
        subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        leave(gone)
        (tmp_path / "state").mkdir()
        th = TestHosts(tmp_path / "state", bridge=bridge, subnet="10.98.77.0/24")
        state: dict = {}
        th._ensure_bridge(state)  # noqa: SLF001 (the step `up` takes first)
        assert state["bridge_created"] and not Path("/run/netns", ns).exists()
        alias = Path("/sys/class/net", bridge, "ifalias").read_text().strip()
        assert alias == f"{BRIDGE_ALIAS}{th.state_dir}"
        subprocess.run(["ip", "link", "del", bridge], check=True)
        gone.mkdir(parents=True)
        (gone / "state.json").write_text("{}")  # its checkout is still there: not a leftover
        leave(gone)
        (tmp_path / "state2").mkdir()
        with pytest.raises(TestHostsError, match="exists and was not created by"):
            TestHosts(tmp_path / "state2", bridge=bridge, subnet="10.98.78.0/24")._ensure_bridge({})  # noqa: SLF001
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], check=False, capture_output=True)

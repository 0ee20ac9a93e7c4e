"""Unit tests for controller/passthrough.py (the filters of plugins/filter/nvidia.py) on real captures from an H200
host (tests/fixtures/nvidia-h200)."""
from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest
import yaml

from controller import passthrough as nvidia

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-h200"

H200_NODES = ["nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]


def capture(name: str) -> str:
    return (FIXTURES / name).read_text()


# ---------------------------------------------------------------------------------------------------------------
# /proc/devices and nodes
# ---------------------------------------------------------------------------------------------------------------

def test_proc_devices_real_capture_char_devices_only() -> None:
    """Character section only: `7 loop` and `259 blkext` are block devices; the first major of a repeated name."""
    devices = nvidia.proc_devices(capture("proc-devices.txt"))
    assert devices["nvidia"] == 195 and devices["nvidiactl"] == 195
    assert devices["nvidia-uvm"] == 238
    assert devices["nvidia-caps"] == 241
    assert devices["mem"] == 1 and devices["infiniband_verbs"] == 231
    assert "loop" not in devices and "blkext" not in devices and "zram" not in devices
    assert devices["dimmctl"] == 253   # 253 is also zram in the block section: the char one wins


def test_nvidia_majors_real_capture() -> None:
    """nvidia is the fixed 195, nvidia-uvm is dynamic (238 on this host), nvidia-caps 241."""
    majors = nvidia.nvidia_majors(capture("proc-devices.txt"))
    assert majors["nvidia"] == 195
    assert majors["nvidia-uvm"] == 238
    assert majors["nvidia-caps"] == 241
    assert "mem" not in majors


def test_nvidia_majors_without_uvm_says_which_module() -> None:
    text = capture("proc-devices.txt").replace("238 nvidia-uvm\n", "")
    with pytest.raises(ValueError, match="no nvidia-uvm.*nvidia_uvm"):
        nvidia.nvidia_majors(text)
    with pytest.raises(ValueError, match="expected 195"):
        nvidia.nvidia_majors({"nvidia": 200, "nvidia-uvm": 238})


def test_dev_listing_real_capture() -> None:
    """`ls -la /dev/nvidia* /dev/nvidia-caps`: four nodes plus the caps folder (listed twice) once each."""
    nodes = nvidia.nvidia_dev_listing(capture("dev-nvidia.txt"))
    by_path = {n["path"]: (n["type"], n["major"], n["minor"]) for n in nodes}
    assert by_path == {
        "/dev/nvidia0": ("c", 195, 0),
        "/dev/nvidiactl": ("c", 195, 255),
        "/dev/nvidia-uvm": ("c", 238, 0),
        "/dev/nvidia-uvm-tools": ("c", 238, 1),
        "/dev/nvidia-caps/nvidia-cap1": ("c", 241, 1),
        "/dev/nvidia-caps/nvidia-cap2": ("c", 241, 2),
    }


def test_gpu_count_and_expected_nodes_match_real_listing() -> None:
    """One GPU (query-gpu.csv and nvidia-smi -q -x): the nodes it needs all exist with the captured majors."""
    count = nvidia.nvidia_gpu_count(capture("query-gpu.csv"))
    assert count == 1
    assert nvidia.nvidia_gpu_count(capture("nvidia-smi-q.xml")) == 1
    names = nvidia.nvidia_node_names(count)
    assert names == H200_NODES
    expected = nvidia.nvidia_expected_nodes(names, capture("proc-devices.txt"))
    assert [(e["path"], e["major"], e["minor"]) for e in expected] == [
        ("/dev/nvidia0", 195, 0), ("/dev/nvidiactl", 195, 255), ("/dev/nvidia-uvm", 238, 0),
        ("/dev/nvidia-uvm-tools", 238, 1)]
    assert nvidia.nvidia_node_problems(expected, capture("dev-nvidia.txt")) == []


def test_node_problems_expecting_more_gpus_or_a_moved_major() -> None:
    """Expecting 2 GPUs on the 1-GPU host names nvidia1; a uvm major moved in /proc/devices but not on the nodes
    names both uvm nodes."""
    listing = capture("dev-nvidia.txt")
    two = nvidia.nvidia_expected_nodes(nvidia.nvidia_node_names(2), capture("proc-devices.txt"))
    assert nvidia.nvidia_node_problems(two, listing) == ["/dev/nvidia1 is missing"]
    moved = capture("proc-devices.txt").replace("238 nvidia-uvm", "509 nvidia-uvm")
    problems = nvidia.nvidia_node_problems(nvidia.nvidia_expected_nodes(H200_NODES, moved), listing)
    assert problems == ["/dev/nvidia-uvm is 238:0, expected 509:0", "/dev/nvidia-uvm-tools is 238:1, expected 509:1"]


def test_gpu_count_from_nvidia_smi_list() -> None:
    text = "GPU 0: NVIDIA H200 (UUID: GPU-1)\nGPU 1: NVIDIA H200 (UUID: GPU-2)\n"
    assert nvidia.nvidia_gpu_count(text) == 2
    assert nvidia.nvidia_gpu_count("0\n1\n2\n") == 3


def test_node_names_options() -> None:
    assert nvidia.nvidia_node_names(2, uvm_tools=False, modeset=True, extra=["nvidia-caps/nvidia-cap1"]) == [
        "nvidia0", "nvidia1", "nvidiactl", "nvidia-modeset", "nvidia-uvm", "nvidia-caps/nvidia-cap1"]
    with pytest.raises(ValueError, match="at least 1"):
        nvidia.nvidia_node_names(0)


# ---------------------------------------------------------------------------------------------------------------
# Proxmox VE devN
# ---------------------------------------------------------------------------------------------------------------

def test_pve_dev_args_for_real_capture() -> None:
    """The devN arguments for the captured host, plain and with mode / uid / gid."""
    names = nvidia.nvidia_node_names(nvidia.nvidia_gpu_count(capture("query-gpu.csv")))
    assert " ".join(nvidia.pve_dev_args(names)) == (
        "--dev0 /dev/nvidia0 --dev1 /dev/nvidiactl --dev2 /dev/nvidia-uvm --dev3 /dev/nvidia-uvm-tools")
    assert nvidia.pve_dev_args(names, options={"mode": "0666"})[:4] == [
        "--dev0", "/dev/nvidia0,mode=0666", "--dev1", "/dev/nvidiactl,mode=0666"]
    assert nvidia.pve_dev_value("/dev/nvidia0", {"uid": 0, "gid": 44, "mode": "0660"}) == (
        "/dev/nvidia0,gid=44,mode=0660,uid=0")
    with pytest.raises(ValueError, match="octal access mode"):
        nvidia.pve_dev_value("/dev/nvidia0", {"mode": 438})
    with pytest.raises(ValueError, match="unknown devN option"):
        nvidia.pve_dev_value("/dev/nvidia0", {"perms": "0666"})


PCT_CONFIG = """\
#GPU container
arch: amd64
cores: 32
dev0: /dev/dri/renderD128,gid=44
dev1: path=/dev/nvidia0,mode=0666
dev2: /dev/nvidia7,mode=0666
hostname: ct200
memory: 262144
net0: name=eth0,bridge=vmbr0,ip=dhcp,type=veth
ostype: ubuntu
rootfs: local-lvm:vm-200-disk-0,size=200G
lxc.cgroup2.devices.allow: c 238:* rwm

[before-upgrade]
dev5: /dev/nvidia0
"""


def test_pve_config_parses_pct_output() -> None:
    conf = nvidia.pve_config(PCT_CONFIG)
    assert conf["options"]["hostname"] == "ct200"
    assert conf["lxc"] == [["lxc.cgroup2.devices.allow", "c 238:* rwm"]]
    assert conf["description"] == "GPU container"
    assert "dev5" not in conf["options"]   # snapshot section
    assert nvidia.pve_dev_entries(conf)[1] == {"path": "/dev/nvidia0", "mode": "0666"}


def test_pve_dev_changes_only_missing_or_different() -> None:
    """nvidia0 keeps dev1; the others take the lowest free indexes; nvidia7 (8-GPU leftover) is deleted; the
    renderD128 entry is not ours and stays."""
    args = nvidia.pve_dev_changes(PCT_CONFIG, H200_NODES, options={"mode": "0666"})
    assert args == ["--dev3", "/dev/nvidiactl,mode=0666", "--dev4", "/dev/nvidia-uvm,mode=0666",
                    "--dev5", "/dev/nvidia-uvm-tools,mode=0666", "--delete", "dev2"]
    assert nvidia.pve_dev_changes(PCT_CONFIG, H200_NODES, options={"mode": "0666"}, prune=False)[-1] != "dev2"


def test_pve_dev_changes_none_when_config_matches() -> None:
    config = "arch: amd64\n" + "".join(
        f"dev{i}: /dev/{n},mode=0666\n" for i, n in enumerate(H200_NODES))
    assert nvidia.pve_dev_changes(config, H200_NODES, options={"mode": "0666"}) == []
    assert nvidia.pve_dev_changes(config, H200_NODES, options={"mode": "0660"})[:2] == [
        "--dev0", "/dev/nvidia0,mode=0660"]


def test_pve_version_comparison() -> None:
    assert nvidia.pve_version("pve-manager/8.2.4/faa83925c9641325 (running kernel: 6.8.8-2-pve)") == "8.2.4"
    assert nvidia.pve_uses_devn("pve-manager/8.2.4/faa83925c9641325 (running kernel: 6.8.8-2-pve)")
    assert nvidia.pve_uses_devn("pve-manager/8.1.3/b46aac3b42da5d15 (running kernel: 6.5.11-4-pve)")
    assert not nvidia.pve_uses_devn("pve-manager/8.0.4/d258a813cfa6b390 (running kernel: 6.2.16-3-pve)")
    assert not nvidia.pve_uses_devn("pve-manager/7.4-17/513c62be (running kernel: 5.15.131-2-pve)")
    assert nvidia.pve_uses_devn("9.0.3") and nvidia.pve_uses_devn("8.10")
    with pytest.raises(ValueError, match="not pveversion output"):
        nvidia.pve_version("Linux 6.8")


# ---------------------------------------------------------------------------------------------------------------
# Raw LXC lines
# ---------------------------------------------------------------------------------------------------------------

RAW_V2 = [
    "lxc.cgroup2.devices.allow: c 195:* rwm",
    "lxc.cgroup2.devices.allow: c 238:* rwm",
    "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file",
    "lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file",
    "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file",
    "lxc.mount.entry: /dev/nvidia-uvm-tools dev/nvidia-uvm-tools none bind,optional,create=file",
]


def test_raw_lines_for_real_capture_cgroup2_and_v1() -> None:
    """The raw lines for the captured host: 195 and the uvm major 238 read from /proc/devices."""
    devices = capture("proc-devices.txt")
    majors = nvidia.lxc_allow_majors(H200_NODES, devices)
    assert majors == [195, 238]
    assert nvidia.lxc_raw_lines(H200_NODES, majors) == RAW_V2
    v1 = nvidia.lxc_raw_lines(H200_NODES, majors, cgroup_version=1, style="lxc")
    assert v1[:2] == ["lxc.cgroup.devices.allow = c 195:* rwm", "lxc.cgroup.devices.allow = c 238:* rwm"]
    assert v1[2] == "lxc.mount.entry = /dev/nvidia0 dev/nvidia0 none bind,optional,create=file"
    with pytest.raises(ValueError, match="cgroup_version"):
        nvidia.lxc_raw_lines(H200_NODES, majors, cgroup_version=3)


def test_raw_lines_caps_major_from_listing() -> None:
    """An extra node (a MIG capability) gets its major from the real `ls -l` listing: 241."""
    names = H200_NODES + ["nvidia-caps/nvidia-cap1"]
    majors = nvidia.lxc_allow_majors(names, capture("proc-devices.txt"), capture("dev-nvidia.txt"))
    assert majors == [195, 238, 241]
    assert nvidia.lxc_raw_lines(names, majors)[-1] == (
        "lxc.mount.entry: /dev/nvidia-caps/nvidia-cap1 dev/nvidia-caps/nvidia-cap1 none bind,optional,create=file")


def test_line_regexp_matches_either_separator() -> None:
    pattern = re.compile(nvidia.lxc_line_regexp("lxc.cgroup2.devices.allow: c 195:* rwm"))
    assert pattern.match("lxc.cgroup2.devices.allow = c 195:* rwm")
    assert pattern.match("lxc.cgroup2.devices.allow:   c 195:*  rwm ")
    assert not pattern.match("lxc.cgroup2.devices.allow: c 195:0 rwm")
    assert not pattern.match("lxc.cgroup.devices.allow: c 195:* rwm")


def test_stale_uvm_line_after_the_major_moved_and_user_lines_kept() -> None:
    """The role wrote the config for major 238 (its record); after a reboot nvidia-uvm is 509: the 238 line is
    stale and the 509 line missing; the 195 line and the mounts are kept. The user's own lines stay whatever they
    name: 226 (drm, whose module is not loaded: no major in /proc/devices), a tun device, a /dev/dri mount."""
    user = ["lxc.cgroup2.devices.allow: c 226:* rwm", "lxc.cgroup2.devices.allow: c 10:200 rwm",
            "lxc.cgroup2.devices.allow: c 29:* rwm",
            "lxc.mount.entry: /dev/dri dev/dri none bind,optional,create=dir"]
    config = "arch: amd64\n" + "\n".join(RAW_V2[:1] + user[:2] + RAW_V2[1:] + user[2:]) + "\n"
    devices = capture("proc-devices.txt")
    assert "226 " not in devices and " 29 " not in devices
    moved = devices.replace("238 nvidia-uvm", "509 nvidia-uvm")
    changes = nvidia.lxc_config_changes(config, H200_NODES, moved, written=RAW_V2)
    assert changes["majors"] == [195, 509]
    assert changes["stale"] == ["lxc.cgroup2.devices.allow: c 238:* rwm"]
    assert changes["missing"] == ["lxc.cgroup2.devices.allow: c 509:* rwm"]
    assert changes["written"] == ["lxc.cgroup2.devices.allow: c 195:* rwm", "lxc.cgroup2.devices.allow: c 509:* rwm",
                                  *RAW_V2[2:]]
    unchanged = nvidia.lxc_config_changes(config, H200_NODES, devices, written=RAW_V2)
    assert unchanged["stale"] == [] and unchanged["missing"] == [] and unchanged["written"] == RAW_V2


def test_without_a_record_nothing_is_stale() -> None:
    """Lines the role did not write (no record: the user's, or from before the record existed) are never
    removed, even the NVIDIA ones; what the role wants and finds already there is not claimed as its own."""
    config = "\n".join(RAW_V2 + ["lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,optional,create=file",
                                  "lxc.cgroup2.devices.allow: c 511:* rwm"]) + "\n"
    changes = nvidia.lxc_config_changes(config, H200_NODES, capture("proc-devices.txt"))
    assert changes["stale"] == [] and changes["missing"] == [] and changes["written"] == []


def test_stale_mounts_of_gpus_no_longer_wanted_and_other_cgroup_form() -> None:
    """Going from 2 GPUs to 1: nvidia1's mount, which the role wrote, is stale; so is its v1 allow line for 195
    once v2 is wanted; a written line the user reformatted is still found; the [snapshot] section is not read."""
    written = RAW_V2 + ["lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,optional,create=file",
                        "lxc.cgroup.devices.allow: c 195:* rwm",
                        "lxc.mount.entry: /dev/nvidia2 dev/nvidia2 none bind,optional,create=file"]
    config = "\n".join(RAW_V2 + [
        "lxc.mount.entry:  /dev/nvidia1 dev/nvidia1  none bind,optional,create=file",
        "lxc.cgroup.devices.allow = c 195:* rwm",
        "lxc.mount.entry: /dev/dri dev/dri none bind,optional,create=dir",
        "[snapshot]",
        "lxc.mount.entry: /dev/nvidia2 dev/nvidia2 none bind,optional,create=file"]) + "\n"
    stale = nvidia.lxc_stale_lines(config, RAW_V2, written)
    assert stale == ["lxc.mount.entry:  /dev/nvidia1 dev/nvidia1  none bind,optional,create=file",
                     "lxc.cgroup.devices.allow = c 195:* rwm"]
    assert nvidia.lxc_written_after(written, RAW_V2, []) == RAW_V2


# ---------------------------------------------------------------------------------------------------------------
# Driver version
# ---------------------------------------------------------------------------------------------------------------

def test_driver_version_from_proc_and_nvidia_smi() -> None:
    """580.159.04 from /proc/driver/nvidia/version (open module), the query CSV and the XML."""
    assert nvidia.nvidia_driver_version(capture("proc-driver-version.txt")) == "580.159.04"
    assert nvidia.nvidia_driver_version(capture("query-gpu.csv")) == "580.159.04"
    assert nvidia.nvidia_driver_version(capture("nvidia-smi-q.xml")) == "580.159.04"
    assert nvidia.nvidia_driver_version("580.159.04\n580.159.04\n") == "580.159.04"   # csv,noheader
    proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024\n"
    assert nvidia.nvidia_driver_version(proprietary) == "550.54.14"


def test_driver_version_rejects_what_it_cannot_read() -> None:
    with pytest.raises(ValueError, match="no driver_version column"):
        nvidia.nvidia_driver_version("index, name\n0, NVIDIA H200\n")
    with pytest.raises(ValueError, match="one driver version"):
        nvidia.nvidia_driver_version("")


def test_filter_module_exports_every_filter() -> None:
    from plugins.filter.nvidia import FilterModule

    filters = FilterModule().filters()
    assert set(filters) == set(nvidia.FILTERS)
    for name in ("proc_devices", "nvidia_majors", "pve_dev_changes", "lxc_config_changes", "lxc_stale_lines",
                 "lxc_missing_lines", "lxc_written_after", "nvidia_driver_version",
                 "pve_uses_devn"):
        assert callable(filters[name])


def test_config_update_touches_the_main_section_only() -> None:
    """Stale lines out and missing lines in, in the main section; a snapshot section holding the very same line
    and the blank line before it stay as they were; a config without a final newline gets one only where a line
    is added."""
    snapshot = "\n[snap1]\nlxc.cgroup2.devices.allow: c 238:* rwm\nsnaptime: 1\n"
    config = "arch: amd64\nlxc.cgroup2.devices.allow: c 238:* rwm\nlxc.cgroup2.devices.allow: c 226:* rwm\n" + snapshot
    out = nvidia.lxc_config_update(config, ["lxc.cgroup2.devices.allow: c 238:* rwm"],
                                   ["lxc.cgroup2.devices.allow: c 509:* rwm"])
    assert out == ("arch: amd64\nlxc.cgroup2.devices.allow: c 226:* rwm\nlxc.cgroup2.devices.allow: c 509:* rwm\n"
                   + snapshot)
    assert nvidia.lxc_config_update("arch: amd64", [], ["a: b"]) == "arch: amd64\na: b\n"
    assert nvidia.lxc_config_update(config, [], []) == config


def test_a_config_from_before_the_record_adopts_exactly_the_lines_the_role_writes() -> None:
    """No record yet (the role's earlier version wrote the lines): the wanted lines present exactly as the role
    writes them are taken as its own, so the uvm line goes once its major moves; a line the user wrote
    differently (other spacing) or for another device stays theirs."""
    config = "\n".join(["arch: amd64", RAW_V2[0], "lxc.cgroup2.devices.allow:  c 238:* rwm", *RAW_V2[2:],
                        "lxc.cgroup2.devices.allow: c 226:* rwm", "[snap]", RAW_V2[1]]) + "\n"
    adopted = nvidia.lxc_adopted_lines(config, RAW_V2)
    assert adopted == [RAW_V2[0], *RAW_V2[2:]]
    moved = nvidia.lxc_raw_lines(H200_NODES, [195, 509])
    assert nvidia.lxc_stale_lines(config, moved, adopted) == []   # the user's 238 line (two spaces) stays
    assert nvidia.lxc_stale_lines(config.replace("allow:  c 238", "allow: c 238"), moved,
                                  nvidia.lxc_adopted_lines(config.replace("allow:  c 238", "allow: c 238"), RAW_V2)
                                  ) == [RAW_V2[1]]


# ---------------------------------------------------------------------------------------------------------------
# The engine unit's DeviceAllow= lines
# ---------------------------------------------------------------------------------------------------------------

CT200 = yaml.safe_load((FIXTURES.parents[2] / "host_vars/ct200.yml").read_text())
NVIDIA_ALLOW = CT200["bench_service_device_allow"]


def find_results(entries: list[str], nodes: list[str]) -> list[dict]:
    """What the role's `find` (paths: the entry's folder, patterns: its last part) registers on a host with
    `nodes` (character devices) and a folder /dev/nvidia-caps."""
    files = [{"path": p, "ischr": True, "isblk": False} for p in nodes] + \
            [{"path": "/dev/nvidia-caps", "ischr": False, "isblk": False, "isdir": True}]
    results = []
    for entry in [e for e in entries if e.startswith("/")]:
        path = entry.split()[0]
        folder, pattern = path.rsplit("/", 1)
        results.append({"item": entry, "files": [f for f in files if f["path"].rsplit("/", 1)[0] == folder
                                                 and fnmatch.fnmatch(f["path"].rsplit("/", 1)[1], pattern)]})
    return results


def test_ct200_device_allow_expands_into_the_nodes_of_the_h200_capture() -> None:
    """ct200's list (systemd backend): every node of the real capture, one line each with the entry's access; a
    node outside the patterns (nvidia-nvswitch0, nvidia-modeset) gets none; a directory matched is no device."""
    assert CT200["bench_backend"] == "systemd"
    listed = [n["path"] for n in nvidia.nvidia_dev_listing(capture("dev-nvidia.txt"))]
    nodes = listed + ["/dev/nvidia1", "/dev/nvidia-nvswitch0", "/dev/nvidia-modeset", "/dev/infiniband/uverbs0"]
    out = nvidia.device_allow(NVIDIA_ALLOW, find_results(NVIDIA_ALLOW, nodes))
    assert out == {"lines": ["/dev/nvidia0 rw", "/dev/nvidia1 rw", "/dev/nvidiactl rw", "/dev/nvidia-uvm rw",
                             "/dev/nvidia-uvm-tools rw", "/dev/nvidia-caps/nvidia-cap1 rw",
                             "/dev/nvidia-caps/nvidia-cap2 rw"],
                   "unmatched": [], "problems": []}


def test_device_allow_keeps_groups_and_reports_what_matched_nothing() -> None:
    """No node on the host (a CPU machine): every path entry is reported, groups (globs included: systemd matches
    them against /proc/devices) stay as written, duplicates once; a bad access or a relative path is a problem."""
    entries = ["char-nvidia rw", "/dev/nvidia[0-9]* rw", "char-nvidia rw", "block-loop*", "/dev/nvidiactl"]
    out = nvidia.device_allow(entries, find_results(entries, []))
    assert out == {"lines": ["char-nvidia rw", "block-loop*"], "unmatched": ["/dev/nvidia[0-9]* rw", "/dev/nvidiactl"],
                   "problems": []}
    assert nvidia.device_allow([])["lines"] == []
    bad = nvidia.device_allow(["/dev/nvidia0 rx", "nvidia0 rw", "/dev/nvidiactl r w", "/etc/passwd r"])
    assert [p.split(":")[0] for p in bad["problems"]] == ["'/dev/nvidia0 rx'", "'nvidia0 rw'", "'/dev/nvidiactl r w'",
                                                          "'/etc/passwd r'"]
    assert bad["lines"] == []

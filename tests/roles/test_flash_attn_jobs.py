"""flash_attn role filters: MAX_JOBS from cgroup v1/v2 texts, cpusets, the arch list and the wheel key.

The probe texts are the formats the kernel writes (cgroup v2 `memory.max`/`cpu.max`/`cpuset.cpus.effective`,
v1 `memory.limit_in_bytes`/`cpu.cfs_*`/`cpuset.effective_cpus`); the last test runs the role's real probe
script on this machine and checks it against what Python itself sees.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess

import pytest
import yaml

from tests.conftest import ROOT

_spec = importlib.util.spec_from_file_location(
    "flash_attn_jobs", ROOT / "roles/flash_attn/filter_plugins/flash_attn_jobs.py")
assert _spec and _spec.loader
fj = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fj)

GIB = 1024 ** 3


@pytest.mark.parametrize("text,count", [
    ("0-7,16-23", 16), ("0-7,16-23\n", 16), ("3", 1), ("0,2,4-5", 4), ("0-1,1-2", 3), ("", None), (" \n", None),
])
def test_cpuset(text: str, count: int | None) -> None:
    assert fj.parse_cpuset(text) == count


@pytest.mark.parametrize("bad", ["0-", "a-b", "7-3", "0 - 3"])
def test_cpuset_rejects_garbage(bad: str) -> None:
    with pytest.raises(fj.AnsibleFilterError):
        fj.parse_cpuset(bad)


def test_memory_limits_and_unlimited() -> None:
    assert fj.parse_memory("max\n") is None                       # v2 unlimited
    assert fj.parse_memory("9223372036854771712") is None         # v1 unlimited (PAGE_COUNTER_MAX pages)
    assert fj.parse_memory("68719476736\n") == 64 * GIB
    with pytest.raises(fj.AnsibleFilterError):
        fj.parse_memory("64G")


def test_cpu_quotas() -> None:
    assert fj.parse_cpu_max("max 100000\n") is None
    assert fj.parse_cpu_max("800000 100000") == 8.0
    assert fj.parse_cpu_max("150000 100000") == 1.5
    assert fj.parse_cfs("-1", "100000") is None
    assert fj.parse_cfs("400000\n", "100000\n") == 4.0


V2_LXC = """\
/sys/fs/cgroup/user.slice/session-3.scope/memory.max\tmax
/sys/fs/cgroup/user.slice/session-3.scope/cpu.max\tmax 100000
/sys/fs/cgroup/user.slice/session-3.scope/cpuset.cpus.effective\t0-63
/sys/fs/cgroup/user.slice/memory.max\tmax
/sys/fs/cgroup/user.slice/cpu.max\tmax 100000
/sys/fs/cgroup/memory.max\t137438953472
/sys/fs/cgroup/cpu.max\t1600000 100000
/sys/fs/cgroup/cpuset.cpus.effective\t0-63
nproc\t64
MemTotal_kB\t2113261568
"""


def test_v2_container_limits_beat_what_the_host_shows() -> None:
    # An LXC container on a 64-core, 2 TiB host, limited to 16 CPUs and 128 GiB at its cgroup root.
    limits = fj.flash_attn_limits(V2_LXC)
    assert limits["cpus"] == 16 and limits["memory_bytes"] == 128 * GIB
    assert limits["sources"] == {"cpus": "/sys/fs/cgroup/cpu.max", "memory": "/sys/fs/cgroup/memory.max"}
    assert fj.flash_attn_max_jobs(limits, nvcc_threads=4) == 6          # 128 / (5 * 4) = 6.4
    assert fj.flash_attn_max_jobs(limits, nvcc_threads=2) == 12         # 128 / 10 = 12.8
    assert fj.flash_attn_max_jobs(limits, nvcc_threads=1) == 16         # CPU-bound: 25.6 > 16
    assert fj.flash_attn_max_jobs(limits, nvcc_threads=1, cap=8) == 8


def test_v2_cpuset_is_the_bound_when_no_quota() -> None:
    probe = "/sys/fs/cgroup/cpu.max\tmax 100000\n/sys/fs/cgroup/cpuset.cpus.effective\t0-7,16-23\nnproc\t32\n"
    limits = fj.flash_attn_limits(probe)
    assert limits["cpus"] == 16 and limits["sources"]["cpus"].endswith("cpuset.cpus.effective")
    assert limits["memory_bytes"] is None
    assert fj.flash_attn_max_jobs(limits) == 16                         # memory unknown: CPU bound only


V1_HYBRID = """\
/sys/fs/cgroup/memory/lxc/200/memory.limit_in_bytes\t34359738368
/sys/fs/cgroup/memory/memory.limit_in_bytes\t9223372036854771712
/sys/fs/cgroup/cpu/lxc/200/cpu.cfs_quota_us\t-1
/sys/fs/cgroup/cpu/lxc/200/cpu.cfs_period_us\t100000
/sys/fs/cgroup/cpu/cpu.cfs_quota_us\t250000
/sys/fs/cgroup/cpu/cpu.cfs_period_us\t100000
/sys/fs/cgroup/cpuset/cpuset.effective_cpus\t0-31
nproc\t32
MemTotal_kB\t263856412
"""


def test_v1_limits_quota_floor_and_unlimited_parent() -> None:
    limits = fj.flash_attn_limits(V1_HYBRID)
    assert limits["cpus"] == 2                                           # 2.5 CPUs of quota, floored
    assert limits["sources"]["cpus"] == "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"
    assert limits["memory_bytes"] == 32 * GIB
    assert fj.flash_attn_max_jobs(limits) == 1                           # 32 / 20 = 1.6


def test_no_limits_anywhere_uses_nproc_meminfo_then_facts() -> None:
    unlimited = ("/sys/fs/cgroup/memory.max\tmax\n/sys/fs/cgroup/cpu.max\tmax 100000\n"
                 "nproc\t8\nMemTotal_kB\t67108864\n")
    limits = fj.flash_attn_limits(unlimited, fallback_cpus=128, fallback_memory_bytes=1 << 40)
    assert (limits["cpus"], limits["memory_bytes"]) == (8, 64 * GIB)     # the probe wins over facts
    assert fj.flash_attn_max_jobs(limits) == 3
    facts_only = fj.flash_attn_limits("", fallback_cpus=12, fallback_memory_bytes=str(96 * GIB))
    assert facts_only == {"cpus": 12, "memory_bytes": 96 * GIB, "sources": {"cpus": "facts", "memory": "facts"}}
    assert fj.flash_attn_limits("", fallback_cpus=None)["cpus"] is None
    assert fj.flash_attn_max_jobs({"cpus": None, "memory_bytes": None}) == 1


def test_small_memory_still_gives_one_job() -> None:
    assert fj.flash_attn_max_jobs({"cpus": 64, "memory_bytes": 4 * GIB}) == 1
    with pytest.raises(fj.AnsibleFilterError):
        fj.flash_attn_max_jobs({"cpus": 4}, nvcc_threads=0)


@pytest.mark.parametrize("archs,out", [
    (["12.0"], "120"), (["9.0", "12.0", "9.0"], "90;120"), (["sm_120", "compute_90", "80"], "80;90;120"),
    ([9.0, 12.0], "90;120"), ("12.0,9.0", "90;120"), (["10.0", "8.6"], "86;100"),
])
def test_cuda_archs(archs: object, out: str) -> None:
    assert fj.flash_attn_cuda_archs(archs) == out


@pytest.mark.parametrize("bad", [[], ["hopper"], ["9"], ["sm_90a"]])
def test_cuda_archs_rejects(bad: object) -> None:
    with pytest.raises(fj.AnsibleFilterError):
        fj.flash_attn_cuda_archs(bad)


def test_wheel_key_changes_with_every_input_and_is_a_safe_name() -> None:
    base = ("2.8.3", "2.9.1+cu128", "12.8", ["12.0"], "3.12")
    key = fj.flash_attn_wheel_key(*base)
    assert key == "fa2.8.3-torch2.9.1+cu128-cuda12.8-sm120-py3.12"
    assert fj.flash_attn_wheel_key("2.8.3", "2.9.1+cu128", "12.8", ["120", "12.0"], "3.12") == key
    for i, other in enumerate(["2.8.2", "2.9.0+cu128", "12.9", ["9.0", "12.0"], "3.11"]):
        changed = list(base)
        changed[i] = other
        assert fj.flash_attn_wheel_key(*changed) != key
    assert "/" not in fj.flash_attn_wheel_key("2.8.3", "2.9/x", "12.8", ["12.0"], "3.12")
    with pytest.raises(fj.AnsibleFilterError):
        fj.flash_attn_wheel_key("2.8.3", "", "12.8", ["12.0"], "3.12")


def test_the_roles_probe_on_this_machine_matches_what_python_sees() -> None:
    """The probe script from roles/flash_attn/vars/main.yml, run for real here (cgroup v1, v2 or hybrid)."""
    probe = yaml.safe_load((ROOT / "roles/flash_attn/vars/main.yml").read_text())["_flash_attn_limits_probe"]
    out = subprocess.run(["/bin/sh", "-c", probe], capture_output=True, text=True, check=True).stdout
    limits = fj.flash_attn_limits(out)
    print(out, limits)
    # The probe includes nproc (scheduler affinity), so it can never report more CPUs than that.
    assert 1 <= limits["cpus"] <= len(os.sched_getaffinity(0))
    with open("/proc/meminfo") as f:
        mem_total = int(next(line for line in f if line.startswith("MemTotal:")).split()[1]) * 1024
    assert 0 < limits["memory_bytes"] <= mem_total
    assert any(line.startswith("/sys/fs/cgroup/") for line in out.splitlines())

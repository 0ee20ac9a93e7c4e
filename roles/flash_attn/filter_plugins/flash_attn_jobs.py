"""Role-local filters of the flash_attn role: build parallelism from the container's real limits,
the arch list for FLASH_ATTN_CUDA_ARCHS, and the key of the kept wheel.

Inside an LXC container `nproc`, /proc/cpuinfo and /proc/meminfo can show the whole host; the cgroup
files are the limits the kernel enforces. The role's probe prints one `<path>\\t<content>` line per
cgroup file it could read (cgroup v2 from this process's cgroup up to the root, v1 controllers the
same way) plus `nproc` and `MemTotal_kB` lines; `flash_attn_limits` takes the smallest limit of each
kind, and `flash_attn_max_jobs` turns it into MAX_JOBS. Pure functions, unit-tested in
tests/roles/test_flash_attn_jobs.py.
"""
from __future__ import annotations

import math
import os
import re
from typing import Any, Dict, Iterable, List, Optional, Tuple

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # the unit tests import this file without Ansible on the path
    AnsibleFilterError = ValueError  # type: ignore[misc,assignment]

GIB = 1024 ** 3
# cgroup v1 reports "no limit" as PAGE_COUNTER_MAX pages (9223372036854771712 on 4 KiB pages).
UNLIMITED = 1 << 62


def parse_cpuset(text: str) -> Optional[int]:
    """Number of CPUs in a cpuset list such as "0-7,16-23"; None for an empty list (inherit)."""
    cpus = set()
    for part in str(text).strip().split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if m is None:
            raise AnsibleFilterError(f"not a cpuset list: {text!r}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise AnsibleFilterError(f"not a cpuset list: {text!r}")
        cpus.update(range(lo, hi + 1))
    return len(cpus) or None


def parse_memory(text: str) -> Optional[int]:
    """Bytes from memory.max (v2) or memory.limit_in_bytes (v1); None when unlimited ("max" or huge)."""
    value = str(text).strip()
    if value in ("", "max", "-1"):
        return None
    try:
        limit = int(value)
    except ValueError as exc:
        raise AnsibleFilterError(f"not a memory limit: {text!r}") from exc
    return None if limit >= UNLIMITED else limit


def parse_cpu_max(text: str) -> Optional[float]:
    """CPUs allowed by cpu.max (v2): "400000 100000" is 4.0; "max 100000" is None (no quota)."""
    fields = str(text).split()
    if not fields or fields[0] == "max":
        return None
    period = int(fields[1]) if len(fields) > 1 else 100000
    return _quota(int(fields[0]), period)


def parse_cfs(quota: str, period: str) -> Optional[float]:
    """CPUs allowed by cpu.cfs_quota_us / cpu.cfs_period_us (v1); a quota of -1 is no quota."""
    return _quota(int(str(quota).strip()), int(str(period).strip()))


def _quota(quota: int, period: int) -> Optional[float]:
    if quota < 0 or period <= 0:
        return None
    return quota / period


def _lines(probe: Any) -> Iterable[Tuple[str, str]]:
    text = "\n".join(probe) if isinstance(probe, (list, tuple)) else str(probe or "")
    for line in text.splitlines():
        if "\t" in line:
            key, _, value = line.partition("\t")
            yield key.strip(), value.strip()


def flash_attn_limits(probe: Any, fallback_cpus: Any = None, fallback_memory_bytes: Any = None) -> Dict[str, Any]:
    """The smallest CPU and memory limit seen in the probe's output.

    CPUs: min of every cpuset (effective) count, every quota (cpu.max, cfs_quota/period, floored, at
    least 1) and `nproc` (the scheduler affinity); memory: min of every memory.max /
    memory.limit_in_bytes that is a real limit and MemTotal. The fallbacks (e.g. Ansible facts) are
    used only when the probe gave nothing of that kind. `sources` names the file each value came from.
    """
    cpus: List[Tuple[int, str]] = []
    memory: List[Tuple[int, str]] = []
    cfs: Dict[str, Dict[str, str]] = {}
    for key, value in _lines(probe):
        name = os.path.basename(key)
        if key == "nproc":
            if value.isdigit() and int(value) > 0:
                cpus.append((int(value), "nproc"))
        elif key == "MemTotal_kB":
            if value.isdigit() and int(value) > 0:
                memory.append((int(value) * 1024, "/proc/meminfo MemTotal"))
        elif name in ("memory.max", "memory.limit_in_bytes"):
            limit = parse_memory(value)
            if limit is not None:
                memory.append((limit, key))
        elif name == "cpu.max":
            quota = parse_cpu_max(value)
            if quota is not None:
                cpus.append((max(1, math.floor(quota)), key))
        elif name in ("cpu.cfs_quota_us", "cpu.cfs_period_us"):
            cfs.setdefault(os.path.dirname(key), {})[name] = value
        elif name in ("cpuset.cpus.effective", "cpuset.effective_cpus"):
            count = parse_cpuset(value)
            if count is not None:
                cpus.append((count, key))
    for folder, pair in sorted(cfs.items()):
        if "cpu.cfs_quota_us" in pair and "cpu.cfs_period_us" in pair:
            quota = parse_cfs(pair["cpu.cfs_quota_us"], pair["cpu.cfs_period_us"])
            if quota is not None:
                cpus.append((max(1, math.floor(quota)), folder + "/cpu.cfs_quota_us"))
    if not cpus and _positive(fallback_cpus):
        cpus.append((int(fallback_cpus), "facts"))
    if not memory and _positive(fallback_memory_bytes):
        memory.append((int(fallback_memory_bytes), "facts"))
    cpu = min(cpus) if cpus else None
    mem = min(memory) if memory else None
    return {
        "cpus": cpu[0] if cpu else None,
        "memory_bytes": mem[0] if mem else None,
        "sources": {"cpus": cpu[1] if cpu else None, "memory": mem[1] if mem else None},
    }


def _positive(value: Any) -> bool:
    try:
        return int(value) > 0
    except (TypeError, ValueError):
        return False


def flash_attn_max_jobs(limits: Dict[str, Any], nvcc_threads: int = 4, gib_per_nvcc_thread: float = 5,
                        cap: int = 0) -> int:
    """MAX_JOBS = min(cpus, memory_GiB / (gib_per_nvcc_thread * nvcc_threads)), at least 1.

    Each ninja job runs nvcc with NVCC_THREADS threads, and a job's peak memory grows with them.
    Unknown memory leaves the CPU bound alone; unknown CPUs leave the memory bound; neither gives 1.
    `cap` > 0 is an upper bound set by the user.
    """
    threads = int(nvcc_threads)
    if threads < 1 or float(gib_per_nvcc_thread) <= 0:
        raise AnsibleFilterError("nvcc_threads and gib_per_nvcc_thread must be positive")
    bounds = []
    if limits.get("cpus"):
        bounds.append(int(limits["cpus"]))
    if limits.get("memory_bytes"):
        bounds.append(math.floor(int(limits["memory_bytes"]) / GIB / (float(gib_per_nvcc_thread) * threads)))
    if int(cap or 0) > 0:
        bounds.append(int(cap))
    return max(1, min(bounds)) if bounds else 1


def flash_attn_cuda_archs(archs: Any) -> str:
    """FLASH_ATTN_CUDA_ARCHS from compute capabilities: ["12.0", "9.0"] -> "90;120".

    Accepts "12.0", "120", "sm_120", "compute_90" and numbers; sorted, without duplicates.
    """
    if isinstance(archs, str):
        archs = [a for a in re.split(r"[;,\s]+", archs) if a]
    out = set()
    for arch in archs or []:
        text = str(arch).strip().lower()
        text = re.sub(r"^(sm_|compute_|sm)", "", text)
        m = re.fullmatch(r"(\d+)\.(\d)", text)
        if m:
            out.add(int(m.group(1)) * 10 + int(m.group(2)))
        elif re.fullmatch(r"\d{2,3}", text):
            out.add(int(text))
        else:
            raise AnsibleFilterError(f"not a compute capability: {arch!r} (use e.g. '12.0' or '120')")
    if not out:
        raise AnsibleFilterError("the GPU arch list is empty")
    return ";".join(str(a) for a in sorted(out))


def flash_attn_wheel_key(flash_attn_version: str, torch_version: str, cuda_version: str, archs: Any,
                         python_version: str) -> str:
    """Folder name of a kept wheel: every input that changes the binary, filesystem-safe."""
    values = {"flash-attn": flash_attn_version, "torch": torch_version, "CUDA": cuda_version,
              "Python": python_version}
    for name, value in values.items():
        if not str(value or "").strip():
            raise AnsibleFilterError(f"the {name} version of the wheel key is empty")
    parts = [f"fa{flash_attn_version}", f"torch{torch_version}", f"cuda{cuda_version}",
             "sm" + flash_attn_cuda_archs(archs).replace(";", "-"), f"py{python_version}"]
    return re.sub(r"[^A-Za-z0-9._+-]", "_", "-".join(parts))


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {
            "flash_attn_limits": flash_attn_limits,
            "flash_attn_max_jobs": flash_attn_max_jobs,
            "flash_attn_cuda_archs": flash_attn_cuda_archs,
            "flash_attn_wheel_key": flash_attn_wheel_key,
        }

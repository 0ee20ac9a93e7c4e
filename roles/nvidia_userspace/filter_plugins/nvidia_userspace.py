"""Role-local filters of the nvidia_userspace role: which driver userspace a container holds, and which
kernel-side or CUDA metapackages must never be in one. Pure functions, unit-tested in
tests/roles/test_nvidia_userspace_filters.py.
"""
from __future__ import annotations

import os
import re
from typing import Any, Dict, Iterable, List

from agent import gpu

MISMATCH = "Driver/library version mismatch"
_LIB = re.compile(r"^libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)$")


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def nvidia_userspace_installed(smi: Any, library_paths: Iterable[str]) -> Dict[str, Any]:
    """The userspace version in the container.

    `smi` is the registered result of `nvidia-smi --query-gpu=driver_version --format=csv,noheader`
    (rc, stdout, stderr; any failure, e.g. not installed), `library_paths` the paths found for
    libnvidia-ml.so.*, or the find module's file entries (a symlink's lnk_source/lnk_target count too, so
    a lone libnvidia-ml.so.1 pointing at libnvidia-ml.so.<version> is read). When nvidia-smi answers, its
    driver_version is the userspace that matches the kernel module. When it fails (missing,
    "Driver/library version mismatch", no device), the version is the one libnvidia-ml.so.<version>;
    none or several give version None (reinstall).
    """
    smi = smi if isinstance(smi, dict) else {}
    names = []
    for entry in library_paths or []:
        if isinstance(entry, dict):
            names += [entry.get(k) for k in ("path", "lnk_source", "lnk_target") if entry.get(k)]
        else:
            names.append(entry)
    libraries = sorted({m.group(1) for m in (_LIB.match(os.path.basename(str(p))) for p in names) if m},
                       key=lambda v: [int(x) for x in v.split(".")])
    out = _text(smi.get("stdout")) + "\n" + _text(smi.get("stderr")) + "\n" + _text(smi.get("msg"))
    result: Dict[str, Any] = {"version": None, "source": None, "mismatch": MISMATCH in out,
                              "libraries": libraries, "smi_error": None}
    if smi.get("rc") == 0:
        try:
            result.update(version=gpu.driver_version(_text(smi.get("stdout"))), source="nvidia-smi")
            return result
        except ValueError:
            pass
    result["smi_error"] = " ".join(out.split())[:300] or None
    if len(libraries) == 1:
        result.update(version=libraries[0], source="libnvidia-ml")
    return result


def nvidia_userspace_dpkg_installed(dpkg: Any) -> List[str]:
    """Names of the installed packages (status "ii", "hi", ...) in
    `dpkg-query -W -f='${db:Status-Abbrev} ${Package}\\n'` output; the architecture suffix is dropped."""
    names = []
    for line in _text(dpkg).splitlines():
        fields = line.split()
        if len(fields) >= 2 and len(fields[0]) >= 2 and fields[0][1] == "i":
            names.append(fields[1].split(":")[0])
    return sorted(set(names))


def nvidia_userspace_forbidden(packages: Any, patterns: Iterable[str]) -> List[str]:
    """Names among `packages` matching any pattern (full match).

    `packages` is a list of names, or `dpkg-query -W -f='${db:Status-Abbrev} ${Package}\\n'` output, of which
    only installed packages (status "ii", "hi", ...) count.
    """
    if isinstance(packages, str):
        names = nvidia_userspace_dpkg_installed(packages)
    else:
        names = [str(p).split("=")[0].strip() for p in packages or []]
    regexes = [re.compile(p) for p in patterns]
    return sorted({n for n in names if any(r.fullmatch(n) for r in regexes)})


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {
            "nvidia_userspace_installed": nvidia_userspace_installed,
            "nvidia_userspace_forbidden": nvidia_userspace_forbidden,
            "nvidia_userspace_dpkg_installed": nvidia_userspace_dpkg_installed,
        }

"""nvidia_userspace role filters: which userspace a container holds, and which packages never belong there.

The driver version comes from the real H200 capture (tests/fixtures/nvidia-h200/query-gpu.csv); the
mismatch text is nvidia-smi's documented "Failed to initialize NVML: Driver/library version mismatch".
"""
from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

_spec = importlib.util.spec_from_file_location(
    "nvidia_userspace_filters", ROOT / "roles/nvidia_userspace/filter_plugins/nvidia_userspace.py")
assert _spec and _spec.loader
nu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nu)

FIXTURES = ROOT / "tests/fixtures/nvidia-h200"
FORBIDDEN = yaml.safe_load((ROOT / "roles/nvidia_userspace/vars/main.yml").read_text())["_nvidia_userspace_forbidden"]
LIBDIR = "/usr/lib/x86_64-linux-gnu"


def captured_driver() -> str:
    path = FIXTURES / "query-gpu.csv"
    rows = list(csv.DictReader(path.read_text().splitlines(), skipinitialspace=True))
    return rows[0]["driver_version"]


def test_nvidia_smi_answer_is_the_installed_version() -> None:
    version = captured_driver()
    assert version == "580.159.04"
    smi = {"rc": 0, "stdout": "\n".join([version] * 8), "stderr": ""}
    got = nu.nvidia_userspace_installed(smi, [f"{LIBDIR}/libnvidia-ml.so.1", f"{LIBDIR}/libnvidia-ml.so.{version}"])
    assert got["version"] == version and got["source"] == "nvidia-smi" and not got["mismatch"]
    assert got["libraries"] == [version] and got["smi_error"] is None


def test_version_mismatch_falls_back_to_the_library_file() -> None:
    smi = {"rc": 18, "stdout": "Failed to initialize NVML: Driver/library version mismatch", "stderr": ""}
    libs = [f"{LIBDIR}/libnvidia-ml.so", f"{LIBDIR}/libnvidia-ml.so.1", f"{LIBDIR}/libnvidia-ml.so.570.133.20"]
    got = nu.nvidia_userspace_installed(smi, libs)
    assert got["mismatch"] and got["version"] == "570.133.20" and got["source"] == "libnvidia-ml"
    assert "version mismatch" in got["smi_error"]
    # The role's decision: the host says 580.159.04, the container holds 570.133.20 -> install.
    assert got["version"] != captured_driver()


def test_nothing_installed() -> None:
    missing = {"failed": True, "rc": 2, "msg": "[Errno 2] No such file or directory: b'nvidia-smi'"}
    got = nu.nvidia_userspace_installed(missing, [])
    assert got["version"] is None and got["source"] is None and not got["mismatch"]
    assert "No such file" in got["smi_error"]


def test_two_library_versions_are_no_single_version() -> None:
    smi = {"rc": 9, "stdout": "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."}
    libs = [f"{LIBDIR}/libnvidia-ml.so.580.159.04", "/usr/lib64/libnvidia-ml.so.580.95.05"]
    got = nu.nvidia_userspace_installed(smi, libs)
    assert got["libraries"] == ["580.95.05", "580.159.04"]          # numeric order, not text order
    assert got["version"] is None


def test_nvidia_smi_garbage_is_not_a_version() -> None:
    got = nu.nvidia_userspace_installed({"rc": 0, "stdout": "[N/A]\n"}, [f"{LIBDIR}/libnvidia-ml.so.580.159.04"])
    assert got["version"] == "580.159.04" and got["source"] == "libnvidia-ml"


@pytest.mark.parametrize("name", [
    "cuda", "cuda-drivers", "cuda-drivers-580", "cuda-12-8", "cuda-runtime-12-8", "nvidia-driver-580",
    "nvidia-driver-580-open", "nvidia-driver", "nvidia-dkms-580", "nvidia-kernel-dkms", "nvidia-open",
    "nvidia-open-580", "linux-modules-nvidia-580-generic", "dkms", "nvidia-kernel-open-dkms",
])
def test_forbidden(name: str) -> None:
    assert nu.nvidia_userspace_forbidden([name], FORBIDDEN) == [name]


@pytest.mark.parametrize("name", [
    "libnvidia-compute-580", "nvidia-utils-580", "cuda-toolkit-12-8", "cuda-keyring", "nvidia-driver-libs",
    "libcuda1", "kmod", "cuda-toolkit",
])
def test_allowed(name: str) -> None:
    assert nu.nvidia_userspace_forbidden([name], FORBIDDEN) == []


def test_forbidden_reads_pinned_names_and_dpkg_output() -> None:
    pinned = ["cuda-drivers=580.159.04-1", "nvidia-utils-580"]
    assert nu.nvidia_userspace_forbidden(pinned, FORBIDDEN) == ["cuda-drivers"]
    dpkg = "ii  kmod\nii  cuda-drivers-580\nrc  nvidia-dkms-570\nun  dkms\nhi  nvidia-kernel-common-580:amd64\n"
    assert nu.nvidia_userspace_forbidden(dpkg, FORBIDDEN) == ["cuda-drivers-580", "nvidia-kernel-common-580"]


def test_this_machines_dpkg_has_none(tmp_path: Path) -> None:
    """The role's own dpkg-query call on this machine (Debian, no NVIDIA packages)."""
    import shutil
    import subprocess

    if shutil.which("dpkg-query") is None:
        pytest.skip("not a Debian-family machine")
    out = subprocess.run(["dpkg-query", "-W", "-f=${db:Status-Abbrev} ${Package}\n"], capture_output=True,
                         text=True).stdout
    assert out.count("\n") > 50 and nu.nvidia_userspace_forbidden(out, FORBIDDEN) == []


def test_find_entries_and_symlink_targets_count() -> None:
    """The role passes the find module's entries: a lone libnvidia-ml.so.1 symlink names its target."""
    entries = [{"path": f"{LIBDIR}/libnvidia-ml.so.1", "islnk": True,
                "lnk_source": f"{LIBDIR}/libnvidia-ml.so.580.159.04", "lnk_target": "libnvidia-ml.so.580.159.04"}]
    got = nu.nvidia_userspace_installed({"rc": 127, "stdout": ""}, entries)
    assert got["version"] == "580.159.04" and got["source"] == "libnvidia-ml"
    # A plain libnvidia-ml.so.1 (not a link; seen on a real H200 machine) tells nothing.
    assert nu.nvidia_userspace_installed({"rc": 1}, [{"path": "/usr/lib/libnvidia-ml.so.1"}])["version"] is None


def test_dpkg_installed_names() -> None:
    dpkg = "ii  kmod\nrc  nvidia-dkms-570\nii  libc6:amd64\nun  dkms\nhi  python3-apt\n"
    assert nu.nvidia_userspace_dpkg_installed(dpkg) == ["kmod", "libc6", "python3-apt"]

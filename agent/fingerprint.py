"""The host fingerprint (host.json): what a number depends on besides the config."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from . import bounded, gpu, probe
from .engines import DISTRIBUTIONS, ENGINES


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def os_release() -> str:
    m = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', _read("/etc/os-release"), re.M)
    return m.group(1) if m else platform.platform()


def cpu() -> dict[str, Any]:
    m = re.search(r"^model name\s*:\s*(.*)$", _read("/proc/cpuinfo"), re.M)
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"model": m.group(1).strip() if m else platform.processor(), "count": os.cpu_count(), "usable": usable}


def memory_total_mib() -> int | None:
    m = re.search(r"^MemTotal:\s*(\d+) kB", _read("/proc/meminfo"), re.M)
    return int(m.group(1)) // 1024 if m else None


def gpus() -> dict[str, Any]:
    text = gpu.query()
    if text is None:
        return {"count": 0, "devices": []}
    rows = gpu.parse_query_csv(text)
    info: dict[str, Any] = {"count": len(rows), "devices": rows,
                            "driver_version": rows[0].get("driver_version") if rows else None}
    exe = shutil.which("nvidia-smi")
    if exe:
        res = subprocess.run([exe, "-q", "-x"], capture_output=True, text=True, timeout=60)
        if res.returncode == 0:
            info["cuda_version"] = gpu.parse_smi_xml(res.stdout).get("cuda_version")
        topo = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=60)
        if topo.returncode == 0:
            info["topology"] = re.sub(r"\x1b\[[0-9;]*m", "", topo.stdout)
    return info


def program_engine(name: str, program: str) -> dict[str, Any]:
    """A program engine's version and commit from its `--version`, and the record its build left beside it
    (`specfleet-build.json` in the build folder, as the llamacpp role writes it: source, digest, flags, build time)."""
    found = probe.program_identity(program)
    out: dict[str, Any] = {"name": name, "distribution": None, "version": found.get("version"),
                           "commit": found.get("commit"), "program": program}
    if found.get("key") is None:
        out["error"] = f"{program}: cannot be run"
    try:
        record = Path(program).resolve().parent.parent / "specfleet-build.json"
        out["build"] = json.loads(bounded.read_text(record, bounded.RECORD))
    except (OSError, ValueError):
        pass
    return out


def engine(name: str, python: str) -> dict[str, Any]:
    """Engine distribution, version and VCS commit, read from the engine's own Python (or, for a program of its own,
    from the program: `program_engine`)."""
    if ENGINES[name].binary:
        return program_engine(name, python)
    probe = ENGINES[name].version_probe
    try:
        res = subprocess.run([python, "-c", probe, *DISTRIBUTIONS[name]], capture_output=True, text=True,
                             timeout=120)
        dist, version, commit = (res.stdout.split() + ["", "", ""])[:3]
        py = subprocess.run([python, "-c", "import platform; print(platform.python_version())"],
                            capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"name": name, "error": str(exc)}
    return {"name": name, "distribution": dist or None, "version": version or None,
            "commit": None if commit in ("", "-") else commit, "python": py or None}


ENGINE_BUILD_RECORD = Path("/etc/specfleet/engine-patches.json")


def engine_build() -> dict[str, Any] | None:
    """What provisioning recorded of the engine build (source, ref, commit, applied patches)."""
    try:
        return json.loads(ENGINE_BUILD_RECORD.read_text())
    except (OSError, ValueError):
        return None


def model_digest(path: str) -> str | None:
    """sha256 over config.json and the names and sizes of the weight files: cheap, and changes
    whenever the weights are swapped."""
    p = Path(path)
    if p.suffix == ".gguf" and p.is_file():  # llama.cpp's one file: its header (the metadata) and its size
        try:
            with open(p, "rb") as f:
                head = f.read(1 << 20)
        except OSError:
            return None
        return hashlib.sha256(head + f"{p.name}:{p.stat().st_size}".encode()).hexdigest()[:16]
    if not p.is_dir():
        return None
    h = hashlib.sha256()
    cfg = p / "config.json"
    if cfg.exists():
        try:  # a user's folder: a FIFO or a device there is named in the digest's input, never read
            h.update(bounded.read_bytes(cfg, bounded.RECORD))
        except OSError as exc:
            h.update(str(exc).encode())
    for f in sorted(p.glob("*.safetensors")) + sorted(p.glob("*.bin")):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
    return h.hexdigest()[:16]


def collect(plan: dict[str, Any]) -> dict[str, Any]:
    suite = plan["suite"]
    models = {}
    for key in ("model", "draft_model"):
        m = suite.get(key)
        if m:
            found = probe.model(m["path"])  # config.json and weight bytes: a later plan's memory fit
            models[key] = {**m, "digest": model_digest(m["path"]), "config": found["config"],
                           "weights_bytes": found["weights_bytes"]}
    return {
        "host": plan["host"],
        "hostname": platform.node(),
        "os": os_release(),
        "kernel": platform.release(),
        "arch": platform.machine(),
        "cpu": cpu(),
        "memory_total_mib": memory_total_mib(),
        "gpus": gpus(),
        "engine": {"build": engine_build(), **engine(suite["engine"], ENGINES[suite["engine"]].program(suite)),
                   "patches": suite.get("engine_patches", [])},
        "agent_python": platform.python_version(),
        **models,
    }

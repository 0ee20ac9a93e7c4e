"""NVIDIA GPU facts from nvidia-smi, and the wait for GPU memory to come back after a stop.

Parsers accept nvidia-smi's real formats (CSV with or without header and units, `-q -x` XML);
they are tested on captures from a real H200 host. On hosts without nvidia-smi every function
here reports "no GPUs" and the release wait is skipped.
"""
from __future__ import annotations

import csv
import io
import re
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from typing import Any, Callable

QUERY_FIELDS = "index,name,uuid,driver_version,memory.total,memory.used,memory.free,compute_cap"
RELEASE_TOLERANCE_MIB = 1024
# version-like fields stay strings ("575.51" is a driver, not a number)
STRING_FIELDS = {"driver_version", "vbios_version", "name", "uuid", "pci.bus_id", "serial", "inforom.img"}


def _clean(key: str) -> str:
    return re.sub(r"\s*\[.*?\]\s*$", "", key.strip())


def _value(v: str) -> Any:
    v = v.strip()
    m = re.fullmatch(r"(-?\d+(?:\.\d+)?)\s*(MiB|MHz|W|%)?", v)
    if m:
        return float(m.group(1)) if "." in m.group(1) else int(m.group(1))
    return v


def parse_query_csv(text: str, fields: str | None = None) -> list[dict[str, Any]]:
    """Rows of `nvidia-smi --query-*` CSV output; header read from the text or given as `fields`."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines)), skipinitialspace=True))
    if fields is None:
        header, rows = [_clean(h) for h in rows[0]], rows[1:]
    else:
        header = fields.split(",")
    return [{h: (v.strip() if h in STRING_FIELDS else _value(v)) for h, v in zip(header, row)}
            for row in rows if len(row) == len(header)]


def parse_smi_xml(text: str) -> dict[str, Any]:
    """Driver, CUDA version and per-GPU name/memory from `nvidia-smi -q -x`."""
    root = ET.fromstring(text)
    gpus = []
    for g in root.findall("gpu"):
        fb = g.find("fb_memory_usage")
        gpus.append({
            "name": g.findtext("product_name"),
            "memory_total_mib": _value(fb.findtext("total", "0")) if fb is not None else None,
            "memory_used_mib": _value(fb.findtext("used", "0")) if fb is not None else None,
        })
    return {"driver_version": root.findtext("driver_version"), "cuda_version": root.findtext("cuda_version"),
            "count": int(root.findtext("attached_gpus", "0")), "gpus": gpus}


def driver_from_proc(text: str) -> str | None:
    """Driver version from /proc/driver/nvidia/version."""
    m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return m.group(1) if m else None


def used_by_index(rows: list[dict[str, Any]]) -> dict[int, int]:
    """GPU index -> MiB used; GPUs whose reading is not a number (e.g. `[N/A]`) are left out."""
    return {int(r["index"]): int(r["memory.used"]) for r in rows
            if isinstance(r.get("index"), int) and isinstance(r.get("memory.used"), (int, float))}


def released(idle: dict[int, int], now: dict[int, int], tolerance_mib: int = RELEASE_TOLERANCE_MIB) -> bool:
    """True when every GPU's used memory is back within `tolerance_mib` of its idle level. A GPU
    missing from the reading is not evidence of release."""
    return all(i in now and now[i] <= used + tolerance_mib for i, used in idle.items())


def query(fields: str = QUERY_FIELDS) -> str | None:
    """Raw CSV from the local nvidia-smi, or None where there is none."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        res = subprocess.run([exe, f"--query-gpu={fields}", "--format=csv"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout if res.returncode == 0 else None


def wait_released(idle: dict[int, int], deadline_s: float, read: Callable[[], str | None] = query,
                  interval: float = 0.2) -> tuple[bool, dict[int, int]]:
    """Poll until GPU memory is back at its idle level; (released?, last reading). An unreadable
    nvidia-smi counts as not released until the deadline."""
    end = time.monotonic() + deadline_s
    while True:
        text = read()
        now = used_by_index(parse_query_csv(text)) if text else {}
        if not idle or released(idle, now):
            return True, now
        if time.monotonic() >= end:
            return False, now
        time.sleep(interval)

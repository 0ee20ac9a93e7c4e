"""NVIDIA GPU facts from nvidia-smi, the wait for GPU memory to come back after a stop, and the
fields and decoding of the GPU-state samples taken during a config (`agent.gpusample`).

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
_HEADER_CELL = re.compile(r"[a-z][a-z0-9_.]*(\s*\[.*\])?")
_VERSION_RE = re.compile(r"\d+(?:\.\d+)+")
STRING_FIELDS = {"driver_version", "vbios_version", "name", "uuid", "pci.bus_id", "serial", "inforom.img"}


# -- GPU-state samples (agent.gpusample) --------------------------------------------------------------
# What one sample asks nvidia-smi for, in its own field names. The clock-event ("throttle") reasons follow:
# newer drivers list them as clocks_event_reasons.* and still accept clocks_throttle_reasons.* (580.159.04,
# tests/fixtures/nvidia-h200/help-query-gpu.txt); older ones know only the second. The sampler asks with
# the first prefix and falls back to the second.
SAMPLE_FIELDS = ("timestamp", "index", "uuid", "clocks.sm", "clocks.mem", "power.draw", "temperature.gpu",
                 "utilization.gpu", "utilization.memory", "memory.used")
REASON_PREFIXES = ("clocks_event_reasons", "clocks_throttle_reasons")
# The reasons that slow the clocks against the workload's will, each with the kind the report names.
THROTTLE_KINDS = {"sw_power_cap": "power cap", "hw_slowdown": "HW slowdown", "hw_power_brake_slowdown": "HW slowdown",
                  "hw_thermal_slowdown": "thermal", "sw_thermal_slowdown": "thermal"}
# The bits of `<prefix>.active` (NVML's nvmlClocksEventReason* constants); gpu_idle, application clocks,
# sync boost and display clocks are not throttling.
REASON_BITS = {"gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
               "sync_boost": 0x10, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
               "hw_power_brake_slowdown": 0x80, "display_clock_setting": 0x100}
_SAMPLE_NUMBERS = SAMPLE_FIELDS[3:]


def sample_fields(prefix: str = REASON_PREFIXES[0]) -> str:
    """The `--query-gpu=` list of one sample, with the reasons under `prefix`."""
    return ",".join(SAMPLE_FIELDS + tuple(f"{prefix}.{r}" for r in ("active", *THROTTLE_KINDS)))


def decode_reasons(mask: int) -> list[str]:
    """The reason names set in a `clocks_event_reasons.active` bitmask, in bit order."""
    return [name for name, bit in REASON_BITS.items() if mask & bit]


def parse_sample(line: str, fields: str) -> list[dict[str, Any]]:
    """One line of `nvidia-smi --query-gpu=<sample_fields()> --format=csv,noheader,nounits` as a sample:
    nvidia-smi's names for the readings (a reading it cannot give, such as `[N/A]`, becomes None),
    `reasons_mask` (the `.active` bitmask as an integer), `reasons` (every reason it sets, decoded) and
    one boolean per throttle reason (the driver's own Active/Not Active, else decoded from the mask).
    [] when the line is not such a row (an error message, a blank line)."""
    rows = parse_query_csv(line, fields)
    if not rows or not isinstance(rows[0].get("index"), int):
        return []
    row = rows[0]
    prefix = next((p for p in REASON_PREFIXES if f"{p}.active" in row), REASON_PREFIXES[0])
    mask = _mask(row.get(f"{prefix}.active"))
    out: dict[str, Any] = {"smi_time": row.get("timestamp"), "index": row["index"], "uuid": row.get("uuid")}
    for name in _SAMPLE_NUMBERS:
        v = row.get(name)
        out[name] = v if isinstance(v, (int, float)) else None
    out["reasons_mask"] = mask
    out["reasons"] = decode_reasons(mask) if mask is not None else None
    for reason in THROTTLE_KINDS:
        said = str(row.get(f"{prefix}.{reason}", "")).strip().lower()
        if said in ("active", "not active"):
            out[reason] = said == "active"
        else:
            out[reason] = bool(mask & REASON_BITS[reason]) if mask is not None else None
    return [out]


def _mask(v: Any) -> int | None:
    if isinstance(v, int):
        return v
    try:
        return int(str(v).strip(), 16)
    except ValueError:
        return None


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
    rows = _rows(text)
    if not rows:
        return []
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
            "count": int(root.findtext("attached_gpus") or 0), "gpus": gpus}


def _rows(text: str) -> list[list[str]]:
    """The cells of nvidia-smi CSV output, line by line (blank lines dropped)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return [[c.strip() for c in r] for r in csv.reader(io.StringIO("\n".join(lines)), skipinitialspace=True)]


def _table(text: str) -> tuple[list[str], list[list[str]]]:
    """nvidia-smi CSV as (header without units, rows); the header is [] for `--format=csv,noheader`."""
    rows = _rows(text)
    if rows and any(_HEADER_CELL.fullmatch(c) for c in rows[0]):
        return [_clean(c) for c in rows[0]], rows[1:]
    return [], rows


def driver_from_proc(text: str) -> str | None:
    """Driver version from /proc/driver/nvidia/version (None when it names none)."""
    m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    if m:
        return m.group(1)
    if "NVRM version:" in text:
        m = _VERSION_RE.search(text.split("NVRM version:", 1)[1].splitlines()[0])
        return m.group(0) if m else None
    return None


def driver_version(text: str) -> str:
    """The driver version from `/proc/driver/nvidia/version`, `nvidia-smi --query-gpu=...,driver_version
    --format=csv[,noheader]` (one column or a header naming `driver_version`) or `nvidia-smi -q -x`;
    ValueError when the text holds none or several."""
    if "NVRM version:" in text:
        found = driver_from_proc(text)
        if found:
            return found
        raise ValueError("no version in the NVRM version line")
    if text.lstrip().startswith("<?xml") or "<nvidia_smi_log" in text:
        version = (parse_smi_xml(text).get("driver_version") or "").strip()
        if not version:
            raise ValueError("nvidia-smi XML has no driver_version")
        return version
    header, rows = _table(text)
    if header:
        if "driver_version" not in header:
            raise ValueError(f"nvidia-smi CSV has no driver_version column: {header}")
        versions = {row[header.index("driver_version")] for row in rows if len(row) == len(header)}
    else:
        versions = {row[0] for row in rows if len(row) == 1}
    versions = {v for v in versions if _VERSION_RE.fullmatch(v)}
    if len(versions) != 1:
        raise ValueError(f"expected one driver version, found {sorted(versions) or 'none'}")
    return versions.pop()


def gpu_count(text: str) -> int:
    """GPUs in `nvidia-smi --query-gpu=... --format=csv[,noheader]`, `nvidia-smi -L` or `nvidia-smi -q -x`."""
    if text.lstrip().startswith("<?xml") or "<nvidia_smi_log" in text:
        info = parse_smi_xml(text)
        return info["count"] or len(info["gpus"])
    listed = re.findall(r"^GPU \d+:", text, re.M)
    if listed:
        return len(listed)
    return len(_table(text)[1])


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


def compute_apps() -> str | None:
    """`pid, process_name, used_memory` (MiB) per GPU compute process, from the local nvidia-smi (no header, no
    units); None where there is none or it cannot say."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        res = subprocess.run([exe, "--query-compute-apps=pid,process_name,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
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

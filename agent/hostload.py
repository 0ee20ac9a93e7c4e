"""What else the host did while a config was timed: the 1-minute load average and CPU seconds, split between
the engine's processes (its process group or unit) and everything else (the agent's own client included), from
/proc. A noisy cell can then be traced to a neighbour instead of being blamed on the method."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def busy_cpu_s(stat: str) -> float:
    """CPU seconds spent not idle since boot, from /proc/stat's `cpu` line (idle and iowait excluded)."""
    fields = stat.splitlines()[0].split()[1:]
    values = [int(v) for v in fields]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values[:8]) - idle) / TICK


def process_cpu_s(stat: str) -> float:
    """utime + stime of one /proc/<pid>/stat line, in seconds (the command may hold spaces and parentheses)."""
    rest = stat[stat.rindex(")") + 2:].split()
    return (int(rest[11]) + int(rest[12])) / TICK


def engine_cpu_s(owns: Callable[[int], bool], proc: Path = Path("/proc")) -> float:
    total = 0.0
    for entry in proc.glob("[0-9]*"):
        try:
            pid = int(entry.name)
            if owns(pid):
                total += process_cpu_s((entry / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue
    return total


def loadavg_1m(proc: Path = Path("/proc")) -> Optional[float]:
    try:
        return float((proc / "loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def sample(owns: Callable[[int], bool], proc: Path = Path("/proc")) -> Optional[Tuple[float, float, Optional[float]]]:
    """(busy CPU s, engine CPU s, load average) now; None where /proc cannot be read."""
    try:
        busy = busy_cpu_s((proc / "stat").read_text())
    except (OSError, ValueError, IndexError):
        return None
    return busy, engine_cpu_s(owns, proc), loadavg_1m(proc)


def summary(before: Optional[Tuple[float, float, Optional[float]]],
            after: Optional[Tuple[float, float, Optional[float]]], seconds: float) -> Optional[Dict[str, Any]]:
    """The status.json `host_load` field: CPU seconds of the engine and of everything else over the timed
    window of `seconds` (first send to last finish), the CPUs those add up to, and the load average at its
    start and end."""
    if before is None or after is None:
        return None
    busy, engine = after[0] - before[0], after[1] - before[1]
    other = max(0.0, busy - engine)
    return {"timed_s": round(seconds, 3), "engine_cpu_s": round(engine, 2), "other_cpu_s": round(other, 2),
            "other_cpus": round(other / seconds, 2) if seconds > 0 else None, "cpus": os.cpu_count(),
            "loadavg_1m_start": before[2], "loadavg_1m_end": after[2]}

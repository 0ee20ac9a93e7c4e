"""Load on the host that is not this run's: before a config starts and at both ends of its timed window, the
processes that would skew its numbers unseen — another engine (a vLLM or SGLang server, or another serving stack,
by its command line), another specfleet run's server (its mark in the environment), or a GPU compute process
(nvidia-smi's compute apps) — none of them this config's server or a server of this run. status.json keeps them
under `foreign`, and the report flags the config's rows `foreign_load`, as it flags `noisy` ones.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from . import gpu
from .sweep import MARK

ENGINE_LIKE = re.compile(r"vllm\.entrypoints|\bvllm serve\b|sglang\.launch_server|sglang\.srt\.|"
                         r"text-generation-launcher|llama-server|\bollama (?:serve|runner)\b|tritonserver|"
                         r"lmdeploy serve|trtllm-serve")


def _cmdline(entry: Path) -> str:
    return (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()


def _mark(entry: Path) -> Optional[str]:
    try:
        env = (entry / "environ").read_bytes().split(b"\0")
    except OSError:
        return None
    prefix = f"{MARK}=".encode()
    return next((v[len(prefix):].decode(errors="replace") for v in env if v.startswith(prefix)), None)


def scan(owns: Callable[[int], bool], run_id: str, proc: Path = Path("/proc"),
         compute_apps: Optional[str] = None) -> List[Dict[str, Any]]:
    """The foreign processes now: [{pid, why (engine | specfleet | gpu), cmd}] (a GPU one with its `used_mib`).
    `owns`: whether a pid is this config's server's; a process marked by a server of `run_id` is this run's own
    (a packed neighbour, recorded as such). `compute_apps`: nvidia-smi's answer, read here when None."""
    me, ours = os.getpid(), f"{run_id}/"
    found: Dict[int, Dict[str, Any]] = {}
    for entry in proc.glob("[0-9]*"):
        pid = int(entry.name)
        if pid == me or owns(pid):
            continue
        try:
            cmd = _cmdline(entry)
        except OSError:
            continue
        mark = _mark(entry)
        if mark is not None and mark.startswith(ours):
            continue  # a server of this run: its own config's, or a packed neighbour's
        if mark is not None:
            found[pid] = {"pid": pid, "why": "specfleet", "cmd": cmd[:200], "run": mark.split("/", 1)[0]}
        elif cmd and ENGINE_LIKE.search(cmd):
            found[pid] = {"pid": pid, "why": "engine", "cmd": cmd[:200]}
    answer = gpu.compute_apps() if compute_apps is None else compute_apps
    for line in (answer or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        pid = int(parts[0])
        if pid == me or owns(pid) or pid in found:
            continue
        mark = _mark(proc / str(pid))
        if mark is not None and mark.startswith(ours):
            continue
        found[pid] = {"pid": pid, "why": "gpu", "cmd": parts[1][:200],
                      "used_mib": int(parts[2]) if parts[2].isdigit() else None}
    return [found[p] for p in sorted(found)]


def merge(seen: List[Dict[str, Any]], now: List[Dict[str, Any]], when: str) -> List[Dict[str, Any]]:
    """`seen` with `now`'s processes added, each once, with the moments (`before`, `timed`) it was there."""
    by_pid = {p["pid"]: p for p in seen}
    for p in now:
        entry = by_pid.setdefault(p["pid"], {**p, "when": []})
        if when not in entry["when"]:
            entry["when"].append(when)
    return [by_pid[p] for p in sorted(by_pid)]

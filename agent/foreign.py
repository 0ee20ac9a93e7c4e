"""Load on the host that is not this run's: before a config starts and at both ends of its timed window, the
processes that would skew its numbers unseen — another engine (a vLLM or SGLang server, or another serving stack,
by its command line), any other process of a serving runtime (Python, uvicorn, gunicorn, Node, ...) listening on
a TCP port that answers as an OpenAI-style server (`GET /v1/models` with a model list: a serving stack whatever
its command line; no other daemon is sent anything), another specfleet run's server
(its mark in the environment), or a GPU compute process (nvidia-smi's compute apps) — none of them this config's
server or a server of this run. status.json keeps them under `foreign`, and the report flags the config's rows
`foreign_load`, as it flags `noisy` ones.
"""
from __future__ import annotations

import http.client
import ipaddress
import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import gpu
from .leftovers import MARK

# Listeners asked whether they serve models: processes of the runtimes such servers are written in. Other daemons
# (sshd, databases, ...) are never sent a request: some log an HTTP request on their port as an attack.
PROBED = re.compile(r"^(?:python[0-9.]*|uvicorn|gunicorn|hypercorn|granian|node|bun|deno)$")
ENGINE_LIKE = re.compile(r"vllm\.entrypoints|\bvllm serve\b|sglang\.launch_server|sglang\.srt\.|"
                         r"text-generation-launcher|llama-server|\bollama (?:serve|runner)\b|tritonserver|"
                         r"lmdeploy serve|trtllm-serve")


def _mark(entry: Path) -> Optional[str]:
    try:
        env = (entry / "environ").read_bytes().split(b"\0")
    except OSError:
        return None
    prefix = f"{MARK}=".encode()
    return next((v[len(prefix):].decode(errors="replace") for v in env if v.startswith(prefix)), None)


def scan(owns: Callable[[int], bool], run_id: str, proc: Path = Path("/proc"),
         compute_apps: Optional[str] = None) -> List[Dict[str, Any]]:
    """The foreign processes now: [{pid, why (engine | specfleet | openai | gpu), cmd}] (a GPU one with its
    `used_mib`, an OpenAI-style listener with its `port`).
    `owns`: whether a pid is this config's server's; a process marked by a server of `run_id` is this run's own
    (a packed neighbour, recorded as such). `compute_apps`: nvidia-smi's answer, read here when None."""
    me, ours = os.getpid(), f"{run_id}/"
    found: Dict[int, Dict[str, Any]] = {}
    listening = listeners(proc)
    for entry in proc.glob("[0-9]*"):
        pid = int(entry.name)
        if pid == me or owns(pid):
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        cmd = b" ".join(argv).decode(errors="replace").strip()
        mark = _mark(entry)
        if mark is not None and mark.startswith(ours):
            continue  # a server of this run: its own config's, or a packed neighbour's
        if mark is not None:
            found[pid] = {"pid": pid, "why": "specfleet", "cmd": cmd[:200], "run": mark.split("/", 1)[0]}
        elif cmd and ENGINE_LIKE.search(cmd):
            found[pid] = {"pid": pid, "why": "engine", "cmd": cmd[:200]}
        elif listening and PROBED.match(os.path.basename(argv[0].decode(errors="replace"))):
            ports = sorted({listening[i] for i in _socket_inodes(entry) if i in listening})
            served = next((addr for addr in ports if openai_style(*addr)), None)
            if served:
                found[pid] = {"pid": pid, "why": "openai", "cmd": cmd[:200], "port": served[1]}
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


def listeners(proc: Path = Path("/proc")) -> Dict[int, Tuple[str, int]]:
    """The host's listening TCP sockets by inode: (address to reach it at, port), from /proc/net/tcp and tcp6."""
    out: Dict[int, Tuple[str, int]] = {}
    for name, anywhere in (("tcp", "127.0.0.1"), ("tcp6", "::1")):
        try:
            lines = (proc / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) < 10 or f[3] != "0A":  # 0A: LISTEN
                continue
            hexaddr, hexport = f[1].split(":")
            out[int(f[9])] = (_address(hexaddr) or anywhere, int(hexport, 16))
    return out


def _address(hexaddr: str) -> Optional[str]:
    """A /proc/net address as text; None for the wildcard (reached on loopback instead)."""
    raw = bytes.fromhex(hexaddr)
    if not raw.strip(b"\0"):
        return None
    if len(raw) == 4:
        return ".".join(str(b) for b in reversed(raw))
    words = [raw[i:i + 4][::-1] for i in range(0, 16, 4)]  # each 32-bit word in host (little-endian) order
    return str(ipaddress.IPv6Address(b"".join(words)))


def _socket_inodes(entry: Path) -> List[int]:
    """The socket inodes a process holds open (none when its fds cannot be read)."""
    out = []
    try:
        for fd in (entry / "fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                out.append(int(target[8:-1]))
    except OSError:
        pass
    return out


def openai_style(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether `GET /v1/models` on host:port answers as an OpenAI-style server does: 200 and a JSON list of
    models (`{"object": "list", "data": [...]}`). Anything else (no HTTP, an error, a slow answer) is not."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/v1/models")
        resp = conn.getresponse()
        if resp.status != 200:
            return False
        body = json.loads(resp.read(1 << 20))
        return isinstance(body, dict) and isinstance(body.get("data"), list)
    except (OSError, ValueError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def merge(seen: List[Dict[str, Any]], now: List[Dict[str, Any]], when: str) -> List[Dict[str, Any]]:
    """`seen` with `now`'s processes added, each once, with the moments (`before`, `timed`) it was there."""
    by_pid = {p["pid"]: p for p in seen}
    for p in now:
        entry = by_pid.setdefault(p["pid"], {**p, "when": []})
        if when not in entry["when"]:
            entry["when"].append(when)
    return [by_pid[p] for p in sorted(by_pid)]

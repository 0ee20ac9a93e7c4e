"""One config on this host, as four steps each testable alone:
`preflight` (flags known, tp fits, GPU memory released) → `serve` (its own server, a context manager)
→ `measure` (the timed requests, in `measure.py`) → `record` (config.json, requests.jsonl, status.json).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Set

from . import fit, foreign, gpu, gpusample, probe, startup
from .classify import Reason, classify, drafter_problems, tail
from .engines import PORT, Engine
from .leftovers import MARK
from .measure import Endpoint, Measured, PromptError, gone, measure
from .pack import Busy, Slot
from .records import Event, Outcome
from .server import HeldBack, ProcessServer, Server, StartupFailed, connect_host, free_port
from .store import (
    HostStore,
    now_iso,
    redact_argv,
    redact_env,
    scrub,
    secret_values,
    write_atomic,
    write_json,
    write_jsonl,
)
from .systemd import SystemdServer

ENV_PASSTHROUGH = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "LD_LIBRARY_PATH", "CUDA_HOME")



@dataclass
class Host:
    """What every config on this host shares: the suite's settings, the engine, the store, the GPUs' idle
    memory and the engine's known flags (probed once)."""

    suite: Dict[str, Any]
    engine: Engine
    store: HostStore
    engine_info: Dict[str, Any] = field(default_factory=dict)
    idle_gpu: Dict[int, int] = field(default_factory=dict)
    gpu_count: int = 0
    gpu_memory_mib: int = 0  # one GPU's memory, for the fit check (0: no GPU known, no check)
    flags: Optional[Set[str]] = None
    choices: Dict[str, List[str]] = field(default_factory=dict)
    features: Dict[str, Any] = field(default_factory=dict)  # what the build's source says it can do (agent.probe)
    defaults: Dict[str, str] = field(default_factory=dict)  # the defaults its help states (agent.probe)
    twins: Dict[str, str] = field(default_factory=dict)  # config id -> the config whose server it is on this build
    skip_unsupported: bool = False  # record configs with unknown flags skipped instead of failed
    ports: Set[int] = field(default_factory=set)  # ports of servers running now (packed configs run at once)
    busy: Optional[Busy] = None  # in a packed phase: which configs are up and measuring
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take_port(self) -> int:
        """The configured port, else a free one no other running config of this suite holds."""
        if self.suite.get("port"):
            return int(self.suite["port"])
        with self.lock:
            while True:
                port = free_port(self.bind_host)
                if port not in self.ports:
                    self.ports.add(port)
                    return port

    def give_port(self, port: int) -> None:
        with self.lock:
            self.ports.discard(port)

    @property
    def bind_host(self) -> str:
        return str(self.suite.get("bind_host", "127.0.0.1"))

    @property
    def headers(self) -> Dict[str, str]:
        key = self.suite.get("api_key") or ""
        return {"Authorization": f"Bearer {key}"} if key else {}

    def secrets(self, cfg: Mapping[str, Any]) -> List[str]:
        key = self.suite.get("api_key") or ""
        return secret_values(cfg["env"], cfg["command"]) + ([key] if key else [])


@dataclass
class Result:
    """How a config ended; `fields` are the status.json fields beyond the outcome (ready_s, port, ...)."""

    status: Outcome
    reason: Optional[Reason] = None
    detail: Optional[str] = None
    rows: List[Dict[str, Any]] = field(default_factory=list)
    log_tail: str = ""
    argv: Optional[List[str]] = None
    fields: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def failed(cls, reason: Reason, detail: str, **fields: Any) -> Result:
        return cls(Outcome.FAILED, reason, detail, fields=fields)


def config_digest(cfg: Mapping[str, Any]) -> str:
    """Identifies what a config measures; a kept result must have been made by the same config
    (secrets aside: a new token does not invalidate a result; nor new latency limits)."""
    keep = {k: v for k, v in cfg.items() if k not in ("estimate_s", "estimate_ready_s", "estimate_source", "timeouts")}
    if isinstance(cfg.get("cells"), list):  # a cell's latency limits are the report's: they measure nothing
        keep["cells"] = [{k: v for k, v in c.items() if k != "slo"} if isinstance(c, dict) else c
                         for c in cfg["cells"]]
    keep.update(env=redact_env(cfg.get("env", {})), command=redact_argv(cfg.get("command", [])),
                server_args=redact_argv(cfg.get("server_args", [])))
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


def engine_flags(engine: Engine, python: str, env: Mapping[str, str]) -> Set[str]:
    """Every `--flag` the installed engine's `--help` mentions."""
    return probe.read_help(python, engine.module, env, arg=engine.help_arg)[0]


def unknown_flags(argv: List[str], known: Set[str], choices: Optional[Mapping[str, List[str]]] = None,
                  flexible: bool = False) -> List[str]:
    """Flags the engine does not know, and values outside a flag's listed choices (`flexible`: names read as
    vLLM reads them)."""
    return probe.unsupported(argv, known, choices or {}, flexible)


def server_env(cfg: Mapping[str, Any]) -> Dict[str, str]:
    """The server's environment: the agent's basics (PATH, HOME, ...) and the config's own."""
    base = {k: os.environ[k] for k in ENV_PASSTHROUGH if k in os.environ}
    return {**base, **cfg["env"]}


# -- preflight ----------------------------------------------------------------------------------------
def preflight(host: Host, cfg: Mapping[str, Any], slot: Optional[Slot] = None) -> Optional[Result]:
    """Why the config cannot start on this host (or in its slot), before anything is launched; None when it
    can. A slot's release check looks at the slot's own GPUs only."""
    if host.flags is None:
        try:
            host.flags, host.choices = probe.read_help(host.engine.program(host.suite), host.engine.module,
                                                       server_env(cfg), arg=host.engine.help_arg)
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
            return Result.failed(Reason.ENGINE_UNAVAILABLE, str(exc))
    missing = unknown_flags(cfg["command"], host.flags, host.choices, host.engine.flexible_names)
    if missing:
        version = host.engine_info.get("version") or "unknown version"
        detail = f"{', '.join(missing)} not known to {host.engine.name} {version}"
        if host.skip_unsupported:
            return Result(Outcome.SKIPPED, Reason.UNSUPPORTED_FLAG, f"{detail} (skip_unsupported)",
                          fields={"unsupported_flags": missing})
        return Result.failed(Reason.UNSUPPORTED_FLAG, detail, unsupported_flags=missing)
    first = host.twins.get(cfg["config_id"])
    if first:
        return Result(Outcome.SKIPPED, Reason.SAME_SERVER,
                      f"the same server as {first} on this build (it runs DFlash without overlap scheduling always: "
                      f"SGLang up to 0.5.13); {first}'s figures are this config's", fields={"same_server_as": first})
    drafter = probe.model(cfg["draft_model"]["path"]) if cfg.get("draft_model") else None
    target = probe.model(cfg["model"]["path"])
    mismatched = drafter_problems(cfg, drafter, target)  # the plan's drafter check, for a run without it
    if mismatched:
        reason = Reason.MISSING_MODEL if any(r == Reason.MISSING_MODEL for r, _ in mismatched) else \
            Reason.INCOMPATIBLE_CONFIG
        return Result.failed(reason, "; ".join(line for _, line in mismatched))
    limits = probe.build_limits(cfg, host.features, drafter, target)
    if limits:
        kinds = {what for what, _ in limits}
        reason = Reason.INCOMPATIBLE_CONFIG if "drafter" in kinds else Reason.DOES_NOT_FIT if "model" in kinds \
            else Reason.PROMPT_BUILD_FAILED
        return Result.failed(reason, "; ".join(why for _, why in limits))
    if host.gpu_count and cfg["tp"] > host.gpu_count:
        return Result.failed(Reason.DOES_NOT_FIT, f"tp {cfg['tp']} needs {cfg['tp']} GPUs; this host has "
                                                  f"{host.gpu_count}")
    if host.gpu_memory_mib:
        verdict = fit.of_config(cfg, host.engine.name, cfg["command"], host.gpu_memory_mib, host.defaults)
        if verdict is not None and not verdict.fits:
            return Result.failed(Reason.DOES_NOT_FIT, f"memory: {verdict.detail}", memory_fit=verdict.detail)
    idle = ({i: host.idle_gpu[i] for i in slot.gpus if i in host.idle_gpu} if slot is not None and slot.gpus
            else host.idle_gpu)
    ok, now = gpu.wait_released(idle, cfg["timeouts"]["release_s"])
    if not ok:
        return Result.failed(Reason.GPU_BUSY, f"GPU memory still in use before start (MiB used {now}, idle "
                                              f"{idle})")
    return None


# -- serve --------------------------------------------------------------------------------------------
def server_for(host: Host, cfg: Mapping[str, Any], argv: List[str], log: Path, port: int,
               slot: Optional[Slot] = None) -> Server:
    """The config's server on the suite's backend, marked so that anything it leaves behind is found, and
    confined to its slot: its GPUs by CUDA_VISIBLE_DEVICES (and the unit's device allow list), its CPUs by
    taskset (the unit's CPUAffinity= and AllowedCPUs=)."""
    mark = {MARK: f"{host.store.dir.parent.name}/{cfg['config_id']}/{uuid.uuid4().hex[:12]}"}
    log_max = int(host.suite["server_log_max_mib"]) << 20  # the plan carries every default
    common = dict(host=connect_host(host.bind_host), headers=host.headers, log_max_bytes=log_max,
                  stop_deadline_s=cfg["timeouts"]["stop_s"])
    confined = slot.env() if slot is not None else {}
    if host.suite.get("backend") == "systemd":
        return SystemdServer(host.engine.name, cfg["config_id"], argv, {**cfg["env"], **confined, **mark}, log,
                             port, slot=slot, **common)
    if slot is not None and slot.cpus:
        argv = [shutil.which("taskset") or "taskset", "--cpu-list", slot.cpus, *argv]
    return ProcessServer(argv, {**server_env(cfg), **confined, **mark}, log, port, **common)


def serve(host: Host, cfg: Mapping[str, Any], folder: Path, slot: Optional[Slot] = None) -> Result:
    """Start the config's server, wait for it, measure, stop it; the outcome with the server's log."""
    port = host.take_port()
    try:
        return _serve(host, cfg, folder, port, slot)
    finally:
        host.give_port(port)


def _serve(host: Host, cfg: Mapping[str, Any], folder: Path, port: int, slot: Optional[Slot]) -> Result:
    argv = [str(port) if a == PORT else a for a in cfg["command"]]
    server = server_for(host, cfg, argv, folder / "server.log", port, slot)
    identity = {"host": host.store.host, "config_id": cfg["config_id"], "method": cfg["method"],
                "method_params": cfg["method_params"], "tp": cfg["tp"], "engine": cfg["engine"],
                "model": cfg["model"]["name"], "phase": cfg["phase"]}
    out = Measured([])
    ready_s = None
    busy, held, gate_wait_s = host.busy, False, None
    early = foreign.merge([], foreign.scan(lambda pid: False, host.store.dir.parent.name), "before")
    launched, t_launch = time.time(), time.monotonic()  # ready_s and the startup marks both count from here
    try:
        with server:
            gate_failed = (lambda: busy.gate_failed(cfg["config_id"])) if busy is not None else (lambda: False)
            server.wait_ready(host.engine.health_path, cfg["timeouts"]["health_s"], gate_failed)
            ready_s = round(time.monotonic() - t_launch, 3)  # the launch itself included (a unit's start)
            host.store.event(Event.CONFIG_READY, config_id=cfg["config_id"], ready_s=ready_s, port=port,
                             server_pid=server.pid)
            if busy is not None:  # packed: no request before the phase's baseline answered its warmup
                t_gate = time.monotonic()
                if busy.held_back(cfg["config_id"]):
                    raise HeldBack()
                gate_wait_s = round(time.monotonic() - t_gate, 3)
            # what the kernel holds it to, not what was asked
            seen = cpus_allowed(server.pid) if slot is not None and slot.cpus and server.pid else None
            # GPU clocks, power, temperature and throttle reasons at 1 Hz (nothing on a host without nvidia-smi)
            indices = list(slot.gpus) if slot is not None and slot.gpus else None
            with gpusample.Sampler(folder / "gpu.jsonl", indices=indices) as gpus:
                wait_s = float(cfg["timeouts"]["health_s"])  # packed: the pack check and those beside it
                try:
                    out = measure(cfg, identity, server, Endpoint(host.engine, port, server.host, host.headers),
                                  timed=(lambda: busy.timed(cfg["config_id"], wait_s)) if busy is not None else None,
                                  events=host.store.event, progress_s=float(host.suite["progress_s"]))
                except PromptError:
                    raise
                except (OSError, RuntimeError, ValueError) as exc:  # judged while the server is still up
                    detail = f"{type(exc).__name__}: {exc}"
                    out.reason = Reason.CRASHED if gone(server, [{"ok": False, "error": detail}]) else \
                        Reason.PROMPT_BUILD_FAILED
                    out.detail = detail
            if seen is not None:
                out.fields["cpus_seen"] = seen
            if gate_wait_s is not None:
                out.fields["gate_wait_s"] = gate_wait_s
            state = gpus.summary(*out.window) if out.window else None
            if state is not None:
                out.fields["gpu_state"] = state
            if out.window:  # on the wall clock, so that configs packed beside it can be set against it
                to_epoch = time.time() - time.monotonic()
                out.fields["timed_window"] = [round(t + to_epoch, 3) for t in out.window]
    except HeldBack:
        held = True
        out.reason, out.detail = Reason.BASELINE_FAILED, (
            f"stopped {'once up' if ready_s is not None else 'while starting'}, before any request: the "
            f"autoregressive baseline of phase {cfg['phase']} did not start or answer")
    except StartupFailed as exc:
        out.reason, out.detail = exc.reason, exc.detail
        if exc.reason == Reason.CRASHED:
            out.reason = classify(tail(server.log_text(), 120), Reason.CRASHED)
    except PromptError as exc:
        out.reason, out.detail = Reason.BAD_PROMPT, str(exc)
    except (OSError, RuntimeError, ValueError) as exc:  # around the measurement: the server is stopped by now
        out.reason = Reason.CRASHED
        out.detail = f"{type(exc).__name__}: {exc}"
    notes = [out.detail] if out.detail else []
    if server.stop_error:
        notes.append(f"stop: {server.stop_error}")
    if server.survivors:
        what = "; ".join(f"pid {p['pid']} {str(p['cmdline'])[:80]}" for p in server.survivors[:5])
        notes.append(f"{len(server.survivors)} process(es) outlived the server (left its process group or "
                     f"unit) and were killed: {what}")
    log_text = _scrubbed_log(server.log_path, host.secrets(cfg))
    seen = early
    for p in out.fields.pop("foreign", None) or []:
        seen = foreign.merge(seen, [p], "timed")
    if seen:
        out.fields["foreign"] = seen
    marks = startup.phases(log_text, host.engine.name, launched)
    if marks:
        out.fields["startup"] = marks
    outcome = Outcome.SKIPPED if held else Outcome.FAILED if out.reason else Outcome.OK
    return Result(outcome, out.reason, "; ".join(notes) or None, out.rows,
                  tail(log_text, 40), argv,
                  dict(ready_s=ready_s, port=port, timed_s=round(out.timed_s, 3), stop_s=round(server.stop_s, 3),
                       survivors=server.survivors, **out.fields))


def cpus_allowed(pid: int) -> Optional[str]:
    """The CPUs a process may run on, as /proc lists them ("0-3,8"); None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _scrubbed_log(path: Path, secrets: List[str]) -> str:
    """The server's whole log after its stop, rewritten without secrets if it held any (engines log their
    arguments)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    if secrets and any(v in text for v in secrets):
        text = scrub(text, secrets)
        write_atomic(path, text.encode())
    return text


# -- record -------------------------------------------------------------------------------------------
def fresh_folder(store: HostStore, config_id: str) -> Path:
    """A fresh folder for the config; an earlier attempt is kept under `.previous/`."""
    d = store.config_dir(config_id)
    if d.exists():
        keep = store.dir / ".previous" / f"{config_id}.{time.strftime('%Y%m%dT%H%M%S')}.{uuid.uuid4().hex[:6]}"
        keep.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(d), str(keep))
    d.mkdir(parents=True)
    return d


def record(host: Host, cfg: Mapping[str, Any], result: Result, folder: Path, started_at: str,
           secrets: List[str] = ()) -> Dict[str, Any]:
    """config.json, requests.jsonl and status.json of one config (status last: a config without it is
    incomplete); the status written."""
    log = folder / "server.log"
    if not log.exists():
        log.write_text(f"[specfleet] server not started: {scrub(result.detail or '', secrets)}\n")
    config = {k: v for k, v in cfg.items() if k not in ("command", "env", "prompts")}
    config.update(command=redact_argv(result.argv or cfg["command"]), environment=redact_env(cfg["env"]),
                  server_args=redact_argv(cfg.get("server_args", [])),
                  host=host.store.host, engine_version=host.engine_info.get("version"))
    write_json(folder / "config.json", config)
    write_jsonl(folder / "requests.jsonl", result.rows)
    finished = now_iso()
    status = {"config_id": cfg["config_id"], "status": result.status.value,
              "reason": result.reason.value if result.reason else None, "config_digest": config_digest(cfg),
              "detail": scrub(result.detail, secrets) if result.detail else None,
              "log_tail": scrub(result.log_tail, secrets), "finished_at": finished, "started_at": started_at,
              "ready_s": None, "requests": len(result.rows),
              "requests_ok": sum(1 for r in result.rows if r.get("ok")), **result.fields}
    write_json(folder / "status.json", status)
    return status


def run_config(host: Host, cfg: Mapping[str, Any], slot: Optional[Slot] = None) -> Dict[str, Any]:
    """preflight → serve (and measure) → record; the status written. `slot`: where a packed config runs."""
    started_at, t0 = now_iso(), time.monotonic()
    result = preflight(host, cfg, slot)
    checked_s = round(time.monotonic() - t0, 3)
    folder = fresh_folder(host.store, cfg["config_id"])
    if result is None:
        result = serve(host, cfg, folder, slot)
        result.fields["wall_s"] = round(time.monotonic() - t0, 3)
    result.fields["preflight_s"] = checked_s
    if slot is not None and not slot.whole_host:
        seen = result.fields.pop("cpus_seen", None)
        result.fields["slot"] = {**slot.record(), **({"cpus_seen": seen} if slot.cpus else {})}
    return record(host, cfg, result, folder, started_at, host.secrets(cfg))


def skip(host: Host, cfg: Mapping[str, Any], reason: Reason, detail: str) -> Dict[str, Any]:
    """Record a config that is not run (its phase's baseline failed)."""
    folder = fresh_folder(host.store, cfg["config_id"])
    return record(host, cfg, Result(Outcome.SKIPPED, reason, detail), folder, now_iso(), host.secrets(cfg))

"""The suite loop on one host: each config gets its own server, its requests, and its records.

A failing config is recorded with a classified reason and the suite goes on; a config already
`ok` is not run again unless forced; a phase whose baseline fails has its other configs skipped.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from . import client, fingerprint, gpu, workloads
from .classify import Reason, classify, tail
from .engines import ENGINES, PORT, Engine
from .server import Backend, ProcessServer, StartupFailed, connect_host, free_port, http_status
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
from .sweep import MARK
from .systemd import SystemdServer, leftover_units

ENV_PASSTHROUGH = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "LD_LIBRARY_PATH", "CUDA_HOME")
FLAG = re.compile(r"(?<![\w-])--[A-Za-z0-9][A-Za-z0-9_-]*")


def engine_flags(engine: Engine, python: str, env: dict[str, str]) -> set[str]:
    """Every `--flag` the installed engine's `--help` mentions."""
    res = subprocess.run(engine.help_command(python), capture_output=True, text=True, env=env, timeout=600)
    flags = set(FLAG.findall(res.stdout + res.stderr))
    if res.returncode != 0 or "--help" not in flags and len(flags) < 5:
        raise RuntimeError(f"`{' '.join(engine.help_command(python))}` failed ({res.returncode}): "
                           f"{tail(res.stderr or res.stdout, 10)}")
    return flags


def config_digest(cfg: dict[str, Any]) -> str:
    """Identifies what a config measures; a kept result must have been made by the same config
    (secrets aside: a new token does not invalidate a result)."""
    keep = {k: v for k, v in cfg.items() if k not in ("estimate_s", "timeouts")}
    keep.update(env=redact_env(cfg.get("env", {})), command=redact_argv(cfg.get("command", [])))
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


def unknown_flags(argv: list[str], known: set[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in argv if a.startswith("--") and a.split("=", 1)[0] not in known]


class PromptError(ValueError):
    """A workload prompt cannot be built as asked."""


class Suite:
    """Runs the configs of one plan on this host."""

    def __init__(self, plan: dict[str, Any], root: Path, force: bool = False, invocation: str = "") -> None:
        self.plan = plan
        self.host = plan["host"]
        self.suite = plan["suite"]
        self.engine = ENGINES[self.suite["engine"]]
        self.store = HostStore(root, self.host, invocation)
        self.force = force
        self.secrets: list[str] = []
        self.flags: set[str] | None = None
        self.engine_info: dict[str, Any] = {}
        self.idle_gpu: dict[int, int] = {}
        self.timed_s = 0.0
        self.bind_host = self.suite.get("bind_host", "127.0.0.1")
        self.connect = connect_host(self.bind_host)
        self.api_key = self.suite.get("api_key") or ""
        self.headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> int:
        configs = self.plan["configs"]
        t0 = time.monotonic()
        info = fingerprint.collect(self.plan)
        self.engine_info = info["engine"]
        write_json(self.store.dir / "host.json", info)
        text = gpu.query()
        self.idle_gpu = gpu.used_by_index(gpu.parse_query_csv(text)) if text else {}
        self.gpu_count = info["gpus"]["count"]
        if self.suite.get("backend") == "systemd":
            for unit in leftover_units(self.engine.name):  # e.g. from an agent that was killed
                subprocess.run(["systemctl", "stop", unit], capture_output=True, timeout=600)
                subprocess.run(["systemctl", "reset-failed", unit], capture_output=True, timeout=60)
                self.store.event("leftover_unit_stopped", unit=unit)
        failed_baselines: set[str] = set()
        done_est = done_actual = 0.0
        total_est = sum(c["estimate_s"] for c in configs)
        self.store.event("suite_start", n=len(configs), run_id=self.plan["run_id"], estimate_s=total_est)
        for k, cfg in enumerate(configs, 1):
            cid = cfg["config_id"]
            elapsed = time.monotonic() - t0
            scale = done_actual / done_est if done_est else 1.0
            eta = (total_est - done_est) * scale
            prev = self.store.status(cid)
            if prev and prev.get("status") == "ok" and prev.get("config_digest") == config_digest(cfg) \
                    and not self.force:
                self.store.event("config_kept", k=k, n=len(configs), config_id=cid, elapsed_s=elapsed, eta_s=eta)
                done_est += cfg["estimate_s"]
                done_actual += cfg["estimate_s"] * scale
                continue
            self.store.event("config_start", k=k, n=len(configs), config_id=cid, elapsed_s=elapsed, eta_s=eta)
            started = time.monotonic()
            if cfg["method"] != "autoregressive" and cfg["phase"] in failed_baselines:
                status = self._record(cfg, "skipped", Reason.BASELINE_FAILED,
                                      f"the autoregressive baseline of phase {cfg['phase']} did not finish ok",
                                      started_at=now_iso())
            else:
                status = self.run_config(cfg)
            if cfg["method"] == "autoregressive" and status["status"] != "ok":
                failed_baselines.add(cfg["phase"])
            done_est += cfg["estimate_s"]
            done_actual += time.monotonic() - started
            self.store.event("config_end", k=k, n=len(configs), config_id=cid, status=status["status"],
                             reason=status.get("reason"), ready_s=status.get("ready_s"),
                             requests_ok=status.get("requests_ok"), requests=status.get("requests"),
                             duration_s=round(time.monotonic() - started, 2))
        self.store.event("suite_end", elapsed_s=time.monotonic() - t0)
        return 0

    # -- one config -------------------------------------------------------------------------
    def _env(self, cfg: dict[str, Any]) -> dict[str, str]:
        base = {k: os.environ[k] for k in ENV_PASSTHROUGH if k in os.environ}
        return {**base, **cfg["env"]}

    def _prepare_dir(self, cid: str) -> Path:
        """A fresh folder for the config; an earlier attempt is kept under `.previous/`."""
        d = self.store.config_dir(cid)
        if d.exists():
            keep = self.store.dir / ".previous" / f"{cid}.{time.strftime('%Y%m%dT%H%M%S')}.{uuid.uuid4().hex[:6]}"
            keep.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(d), str(keep))
        d.mkdir(parents=True)
        return d

    def _record(self, cfg: dict[str, Any], status: str, reason: str | None, detail: str | None,
                rows: list[dict[str, Any]] | None = None, log_tail: str = "", argv: list[str] | None = None,
                prepared: bool = False, **extra: Any) -> dict[str, Any]:
        cid = cfg["config_id"]
        d = self.store.config_dir(cid) if prepared else self._prepare_dir(cid)
        log = d / "server.log"
        if not log.exists():
            log.write_text(f"[specfleet] server not started: {detail}\n")
        config = {k: v for k, v in cfg.items() if k not in ("command", "env", "prompts")}
        config.update(command=redact_argv(argv or cfg["command"]), environment=redact_env(cfg["env"]),
                      host=self.host, engine_version=self.engine_info.get("version"))
        write_json(d / "config.json", config)
        rows = rows or []
        write_jsonl(d / "requests.jsonl", rows)
        st = {"config_id": cid, "status": status, "reason": reason, "config_digest": config_digest(cfg),
              "detail": scrub(detail, self.secrets) if detail else None,
              "log_tail": scrub(log_tail, self.secrets), "finished_at": now_iso(),
              "requests": len(rows), "requests_ok": sum(1 for r in rows if r.get("ok")), **extra}
        st.setdefault("started_at", st["finished_at"])
        st.setdefault("ready_s", None)
        write_json(d / "status.json", st)
        return st

    def run_config(self, cfg: dict[str, Any]) -> dict[str, Any]:
        self.secrets = secret_values(cfg["env"], cfg["command"]) + ([self.api_key] if self.api_key else [])
        started_at = now_iso()
        t0 = time.monotonic()
        self.timed_s = 0.0
        env = self._env(cfg)
        if self.flags is None:
            try:
                self.flags = engine_flags(self.engine, self.suite["engine_python"], env)
            except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
                return self._record(cfg, "failed", Reason.ENGINE_UNAVAILABLE, str(exc), started_at=started_at)
        missing = unknown_flags(cfg["command"], self.flags)
        if missing:
            version = self.engine_info.get("version") or "unknown version"
            return self._record(cfg, "failed", Reason.UNSUPPORTED_FLAG,
                                f"{', '.join(missing)} not known to {self.engine.name} {version}",
                                started_at=started_at, unsupported_flags=missing)
        if self.gpu_count and cfg["tp"] > self.gpu_count:
            return self._record(cfg, "failed", Reason.DOES_NOT_FIT,
                                f"tp {cfg['tp']} needs {cfg['tp']} GPUs; this host has {self.gpu_count}",
                                started_at=started_at)
        ok, now = gpu.wait_released(self.idle_gpu, cfg["timeouts"]["release_s"])
        if not ok:
            return self._record(cfg, "failed", Reason.GPU_BUSY,
                                f"GPU memory still in use before start (MiB used {now}, idle {self.idle_gpu})",
                                started_at=started_at)
        d = self._prepare_dir(cfg["config_id"])
        port = self.suite.get("port") or free_port(self.bind_host)
        argv = [str(port) if a == PORT else a for a in cfg["command"]]
        server = self._server(cfg, argv, env, d / "server.log", port)
        rows: list[dict[str, Any]] = []
        status, reason, detail, ready_s = "ok", None, None, None
        try:
            server.start()
            ready_s = round(server.wait_ready(self.engine.health_path, cfg["timeouts"]["health_s"]), 3)
            self.store.event("config_ready", config_id=cfg["config_id"], ready_s=ready_s, port=port,
                             server_pid=server.pid)
            rows, status, reason, detail = self._measure(cfg, server)
        except StartupFailed as exc:
            status, reason, detail = "failed", exc.reason, exc.detail
            if reason == Reason.CRASHED:
                reason = classify(tail(server.log_text(), 120), Reason.CRASHED)
        except PromptError as exc:
            status, reason, detail = "failed", Reason.BAD_PROMPT, str(exc)
        except (OSError, RuntimeError, ValueError) as exc:
            alive = server.alive()
            status, reason = "failed", (Reason.PROMPT_BUILD_FAILED if alive else Reason.CRASHED)
            detail = f"{type(exc).__name__}: {exc}"
        finally:
            t_stop = time.monotonic()
            try:
                server.stop(cfg["timeouts"]["stop_s"])
            except RuntimeError as exc:
                detail = f"{detail + '; ' if detail else ''}stop: {exc}"
            stop_s = time.monotonic() - t_stop
        survivors = server.survivors
        if survivors:
            what = "; ".join(f"pid {p['pid']} {p['cmdline'][:80]}" for p in survivors[:5])
            detail = (f"{detail + '; ' if detail else ''}{len(survivors)} process(es) outlived the server "
                      f"(left its process group or unit) and were killed: {what}")
        log_text = _read(server.log_path)  # after stop: the whole output (process) or the journal (systemd)
        if self.secrets and any(v in log_text for v in self.secrets):
            log_text = scrub(log_text, self.secrets)  # engines log their arguments: keep secrets out
            write_atomic(server.log_path, log_text.encode())
        return self._record(cfg, status, reason, detail, rows=rows, log_tail=tail(log_text, 40), argv=argv,
                            prepared=True, started_at=started_at, ready_s=ready_s, port=port,
                            timed_s=round(self.timed_s, 3), stop_s=round(stop_s, 3), survivors=survivors,
                            wall_s=round(time.monotonic() - t0, 3))

    def _server(self, cfg: dict[str, Any], argv: list[str], env: dict[str, str], log: Path, port: int) -> Backend:
        mark = {MARK: f"{self.store.dir.parent.name}/{cfg['config_id']}/{uuid.uuid4().hex[:12]}"}
        log_max = int(self.suite["server_log_max_mib"]) << 20  # the plan carries every default
        if self.suite.get("backend") == "systemd":
            return SystemdServer(self.engine.name, cfg["config_id"], argv, {**cfg["env"], **mark}, log, port,
                                 host=self.connect, headers=self.headers, log_max_bytes=log_max)
        return ProcessServer(argv, {**env, **mark}, log, port, host=self.connect, headers=self.headers,
                             log_max_bytes=log_max)

    # -- requests ---------------------------------------------------------------------------
    def _prompts(self, cfg: dict[str, Any], port: int) -> dict[tuple[str, int], str | list[int]]:
        """Plain prompts as text; long-context prompts as token ids built with the server's tokenizer."""
        out: dict[tuple[str, int], str | list[int]] = {}
        name = cfg["model"]["name"]
        filler: list[int] = []
        for cell in cfg["cells"]:
            key = (cell["workload"], cell["context_tokens"])
            if key in out:
                continue
            text = cfg["prompts"][cell["workload"]]
            if cell["context_tokens"] == 0:
                out[key] = text
                continue
            q = client.post_json(port, "/tokenize", {"model": name, "prompt": text}, 60, self.connect,
                                 self.headers)["tokens"]
            need = cell["context_tokens"] - len(q)
            if need < 0:
                raise PromptError(f"context_tokens {cell['context_tokens']} is shorter than the "
                                  f"{cell['workload']!r} prompt itself ({len(q)} tokens)")
            while len(filler) < need:
                reps = 1 + need // 64
                filler = client.post_json(port, "/tokenize", {"model": name, "prompt": workloads.FILLER * reps,
                                                              "add_special_tokens": False}, 120, self.connect,
                                          self.headers)["tokens"]
            out[key] = filler[:max(need, 0)] + q
        return out

    def _burst(self, cfg: dict[str, Any], port: int, prompt: str | list[int], max_tokens: int, n: int,
               tag: str) -> list[dict[str, Any]]:
        """`n` identical requests sent together; each its own measurement."""
        gate = threading.Barrier(n)
        deadline = cfg["timeouts"]["request_s"]

        def one(slot: int) -> dict[str, Any]:
            body = self.engine.request(cfg["model"]["name"], prompt, max_tokens, cfg["sampling"],
                                       salt=f"{tag}-{slot}-{uuid.uuid4().hex[:8]}")
            gate.wait()
            return {"slot": slot, "started_at": now_iso(),
                    **client.stream(self.engine, port, body, deadline, self.connect, self.headers)}

        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=n) as pool:
            rows = list(pool.map(one, range(n)))
        if tag != "warmup":
            self.timed_s += time.monotonic() - t0
        return rows

    def _measure(self, cfg: dict[str, Any], server: Backend) -> tuple[list[dict[str, Any]], str, str | None,
                                                                             str | None]:
        port = server.port
        prompts = self._prompts(cfg, port)
        first = cfg["cells"][0]
        warm = self._burst(cfg, port, prompts[(first["workload"], first["context_tokens"])],
                           cfg["warmup_max_tokens"], 1, "warmup")[0]
        if not warm["ok"]:
            reason = Reason.CRASHED if not server.alive() else Reason.WARMUP_FAILED
            return [], "failed", reason, f"warmup request failed: {warm['error']}"
        identity = {"host": self.host, "config_id": cfg["config_id"], "method": cfg["method"],
                    "method_params": cfg["method_params"], "tp": cfg["tp"], "engine": cfg["engine"],
                    "model": cfg["model"]["name"], "phase": cfg["phase"]}
        rows: list[dict[str, Any]] = []
        for rep in range(max(c["repetitions"] for c in cfg["cells"])):
            for i, cell in enumerate(cfg["cells"]):
                if rep >= cell["repetitions"]:
                    continue
                prompt = prompts[(cell["workload"], cell["context_tokens"])]
                for r in self._burst(cfg, port, prompt, cell["max_tokens"], cell["concurrency"], f"c{i}r{rep}"):
                    rows.append({**identity, "workload": cell["workload"], "max_tokens": cell["max_tokens"],
                                 "context_tokens": cell["context_tokens"], "concurrency": cell["concurrency"],
                                 "rep": rep, **r})
                if not server.alive():
                    log = tail(server.log_text(), 120)
                    return rows, "failed", classify(log, Reason.CRASHED), \
                        f"server {server.exit_detail()} during timed requests ({len(rows)} requests recorded)"
                late = [r for r in rows[-cell["concurrency"]:]
                        if not r["ok"] and ("timed out" in str(r["error"]) or "deadline" in str(r["error"]))]
                if late and http_status(port, self.engine.health_path, self.connect, 10.0, self.headers) != 200:
                    return rows, "failed", Reason.REQUEST_TIMEOUT, \
                        f"request deadline of {cfg['timeouts']['request_s']:g} s passed and the server no longer " \
                        f"answers {self.engine.health_path} (hung); {len(rows)} requests recorded"
        if not any(r["ok"] for r in rows):
            errors = sorted({str(r["error"]) for r in rows})[:3]
            return rows, "failed", Reason.REQUESTS_FAILED, f"no request succeeded: {'; '.join(errors)}"
        return rows, "ok", None, None


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""

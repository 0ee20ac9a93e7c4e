"""The suite loop on one host: each config in turn, with progress events and an ETA.

A config already `ok` with the same digest is kept unless forced; a phase whose baseline fails has
its other configs skipped; a failing config is recorded (see `config.py`) and the suite goes on.
"""
from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Set

from . import fingerprint, gpu, probe
from .classify import Reason
from .config import Host, config_digest, run_config, server_env, skip
from .engines import ENGINES
from .records import Event, Outcome
from .store import HostStore, write_json
from .systemd import stop_leftover_units


@dataclass
class Eta:
    """The suite's time left: the plan's estimate of what is left, scaled by how the done configs compared
    with their estimates."""

    total_est: float
    done_est: float = 0.0
    done_actual: float = 0.0

    @property
    def scale(self) -> float:
        return self.done_actual / self.done_est if self.done_est else 1.0

    def left(self) -> float:
        return (self.total_est - self.done_est) * self.scale

    def done(self, estimate_s: float, actual_s: float) -> None:
        self.done_est += estimate_s
        self.done_actual += actual_s


def kept(store: HostStore, cfg: Dict[str, Any]) -> bool:
    """Whether an earlier `ok` result of this very config is on disk."""
    prev = store.status(cfg["config_id"])
    return bool(prev and prev.get("status") == Outcome.OK.value and prev.get("config_digest") == config_digest(cfg))


class Suite:
    """Runs the configs of one plan on this host."""

    def __init__(self, plan: Dict[str, Any], root: Path, force: bool = False, invocation: str = "",
                 skip_unsupported: bool = False) -> None:
        self.plan = plan
        self.force = force
        suite = plan["suite"]
        self.host = Host(suite=suite, engine=ENGINES[suite["engine"]],
                         store=HostStore(root, plan["host"], invocation), skip_unsupported=skip_unsupported)
        known = plan.get("engine_help") or {}  # the plan's probe read this engine's --help: not run again
        if (known.get("flags") and known.get("python") == suite["engine_python"]
                and known.get("module") == self.host.engine.module):
            self.host.flags, self.host.choices = set(known.get("flags") or ()), dict(known.get("choices") or {})

    def prepare(self) -> None:
        """Host facts, the GPUs' idle memory, and no engine unit left from an agent that was killed."""
        host, store = self.host, self.host.store
        info = fingerprint.collect(self.plan)
        host.engine_info = info["engine"]
        host.gpu_count = info["gpus"]["count"]
        if host.flags is None:  # read once here, so that host.json records what this engine accepts
            env = server_env({"env": {k: str(v) for k, v in (host.suite.get("env") or {}).items()}})
            try:
                host.flags, host.choices = probe.read_help(host.suite["engine_python"], host.engine.module, env)
            except (OSError, RuntimeError, subprocess.TimeoutExpired):
                pass  # each config's preflight asks again and records engine_unavailable with the cause
        if host.flags is not None:  # a later plan reads it when the host cannot be asked
            info["engine"]["help"] = {"flags": sorted(host.flags), "choices": host.choices}
        write_json(store.dir / "host.json", info)
        rows = gpu.parse_query_csv(gpu.query() or "")
        host.idle_gpu = gpu.used_by_index(rows)
        totals = [r["memory.total"] for r in rows if isinstance(r.get("memory.total"), int)]
        host.gpu_memory_mib = int(host.suite.get("gpu_memory_mib") or (min(totals) if totals else 0))
        if host.suite.get("backend") == "systemd":
            for unit in stop_leftover_units(host.engine.name):
                store.event(Event.LEFTOVER_UNIT_STOPPED, unit=unit)

    def run(self) -> int:
        configs = self.plan["configs"]
        store = self.host.store
        t0 = time.monotonic()
        self.prepare()
        failed_baselines: Set[str] = set()
        eta = Eta(sum(c["estimate_s"] for c in configs))
        store.event(Event.SUITE_START, n=len(configs), run_id=self.plan["run_id"], estimate_s=eta.total_est)
        for k, cfg in enumerate(configs, 1):
            where = dict(k=k, n=len(configs), config_id=cfg["config_id"], elapsed_s=time.monotonic() - t0,
                         eta_s=eta.left())
            if not self.force and kept(store, cfg):
                store.event(Event.CONFIG_KEPT, **where)
                eta.done(cfg["estimate_s"], cfg["estimate_s"] * eta.scale)
                continue
            store.event(Event.CONFIG_START, **where)
            started = time.monotonic()
            baseline = cfg["method"] == "autoregressive"
            if not baseline and cfg["phase"] in failed_baselines:
                status = skip(self.host, cfg, Reason.BASELINE_FAILED,
                              f"the autoregressive baseline of phase {cfg['phase']} did not finish ok")
            else:
                status = run_config(self.host, cfg)
            if baseline and status["status"] != Outcome.OK.value:
                failed_baselines.add(cfg["phase"])
            eta.done(cfg["estimate_s"], time.monotonic() - started)
            store.event(Event.CONFIG_END, k=k, n=len(configs), config_id=cfg["config_id"], status=status["status"],
                        reason=status.get("reason"), ready_s=status.get("ready_s"),
                        requests_ok=status.get("requests_ok"), requests=status.get("requests"),
                        duration_s=round(time.monotonic() - started, 2))
        store.event(Event.SUITE_END, elapsed_s=time.monotonic() - t0)
        return 0

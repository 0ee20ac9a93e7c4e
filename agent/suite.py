"""The suite loop on one host: phase by phase, each config in turn or packed into slots, with progress events
and an ETA.

A config already `ok` with the same digest is kept unless forced; a phase whose baseline fails has
its other configs skipped; a failing config is recorded (see `config.py`) and the suite goes on.
A packed phase (`pack.py`) starts its baseline first on the first slot and the rest on the other slots beside
it, to send requests once the baseline's server answered its warmup (with the pack check: to start once the
baseline ended), one thread per slot taking the next config as its slot frees; each config's status then names
its neighbours.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Set

from . import fingerprint, gpu, pack, probe
from .classify import Reason
from .config_run import Host, config_digest, run_config, server_env, skip
from .engines import DISTRIBUTIONS, ENGINES
from .machine import Machine, holder_words
from .pack import Slot
from .records import Event, Outcome
from .store import HostStore, read_json, write_json
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
                 skip_unsupported: bool = False, cache: Optional[Path] = None) -> None:
        self.plan = plan
        self.force = force
        self.cache = cache  # where the engine's help is kept between runs (agent.probe)
        suite = plan["suite"]
        self.host = Host(suite=suite, engine=ENGINES[suite["engine"]],
                         store=HostStore(root, plan["host"], invocation), skip_unsupported=skip_unsupported)
        known = plan.get("engine_help") or {}  # the plan's probe read this engine's --help: not run again
        if (known.get("flags") and known.get("python") == self.host.engine.program(suite)
                and known.get("module") == self.host.engine.module):
            self.host.flags, self.host.choices = set(known.get("flags") or ()), dict(known.get("choices") or {})
            self.host.features = dict(known.get("features") or {})
            self.host.defaults = dict(known.get("defaults") or {})
        self.help_key: Optional[str] = known.get("key") if self.host.flags is not None else None
        self.machine = Machine(suite.get("machine_lock"))  # shared with other suites on this machine: turns
        self.in_turn = False  # a packed phase holds the machine for all its configs

    def prepare(self) -> None:
        """Host facts, the GPUs' idle memory, and no engine unit left from an agent that was killed."""
        host, store = self.host, self.host.store
        info = fingerprint.collect(self.plan)
        host.engine_info = info["engine"]
        host.gpu_count = info["gpus"]["count"]
        if host.flags is None:  # read once here, so that host.json records what this engine accepts
            self.read_help()
        if host.flags is not None:  # a later plan reads it when the host cannot be asked
            info["engine"]["help"] = {"flags": sorted(host.flags), "choices": host.choices,
                                      "defaults": host.defaults}
            info["engine"]["features"] = host.features
            self.keep_help()
        write_json(store.dir / "host.json", info)
        if host.features.get("dflash_overlap") is False:  # dflash and dflash-nooverlap: one server, run once
            host.twins = probe.same_servers(self.plan["configs"])
        rows = gpu.parse_query_csv(gpu.query() or "")
        host.idle_gpu = gpu.used_by_index(rows)
        totals = [r["memory.total"] for r in rows if isinstance(r.get("memory.total"), int)]
        host.gpu_memory_mib = int(host.suite.get("gpu_memory_mib") or (min(totals) if totals else 0))
        if host.suite.get("backend") == "systemd":
            for unit in stop_leftover_units(host.engine.name):
                store.event(Event.LEFTOVER_UNIT_STOPPED, unit=unit)

    def read_help(self) -> None:
        """The engine's flags from the host's cache, else from its `--help` (`probe.engine`, as the plan reads
        them); a failure is left to each config's preflight, which asks again and records engine_unavailable."""
        host = self.host
        env = server_env({"env": {k: str(v) for k, v in (host.suite.get("env") or {}).items()}})
        read = probe.engine(host.engine.program(host.suite), host.engine.module, DISTRIBUTIONS[host.engine.name], env,
                            cache=str(self.cache) if self.cache else None, arg=host.engine.help_arg)
        self.help_key = read.get("key")
        if read.get("flags"):
            host.flags, host.choices = set(read["flags"]), dict(read.get("choices") or {})
            host.features = dict(read.get("features") or {})
            host.defaults = dict(read.get("defaults") or {})

    def keep_help(self) -> None:
        """The engine's flags into the host's cache, for the next plan and run (once per engine build)."""
        if self.cache is None or not self.help_key or probe.cached(str(self.cache), self.help_key):
            return
        try:
            self.cache.mkdir(parents=True, exist_ok=True)
            write_json(probe.cache_path(str(self.cache), self.help_key),
                       {"python": self.host.engine.program(self.host.suite), "module": self.host.engine.module,
                        "version": self.host.engine_info.get("version"), "flags": sorted(self.host.flags or ()),
                        "choices": self.host.choices, "features": self.host.features,
                        "defaults": self.host.defaults})
        except OSError:
            pass  # a cache that cannot be written costs the next run one --help, nothing else

    def slots(self, phase: str, tp: int) -> List[Slot]:
        return pack.slots(self.plan["suite"], phase, tp, self.host.gpu_count or int(self.plan["suite"].get(
            "gpu_count") or 0))

    def run(self) -> int:
        configs = self.plan["configs"]
        store = self.host.store
        self.t0 = time.monotonic()
        self.prepare()
        self.failed_baselines: Set[str] = set()
        self.index = {c["config_id"]: k for k, c in enumerate(configs, 1)}
        pools = {phase: self.slots(phase, group[0]["tp"]) for phase, group in pack.phase_order(configs)}
        placed = pack.timeline(configs, pools)
        self.eta = Eta(max((p.end_s for p in placed), default=0.0))
        self.lock = threading.Lock()
        store.event(Event.SUITE_START, n=len(configs), run_id=self.plan["run_id"], estimate_s=self.eta.total_est)
        for phase, group in pack.phase_order(configs):
            pool = pools[phase]
            if len(pool) == 1:
                for cfg in group:
                    self.run_config(cfg, pool[0] if not pool[0].whole_host else None, 1)
            else:
                with self.turn(phase):
                    self.packed(group, pool)
        store.event(Event.SUITE_END, elapsed_s=time.monotonic() - self.t0)
        return 0

    def run_config(self, cfg: Dict[str, Any], slot: Optional[Slot], share: int,
            spans: Optional[Dict[str, Dict[str, Any]]] = None) -> Dict[str, Any]:
        """One config in `slot` (None: the whole host), with its events; `share` is how many slots its phase
        runs at once (for the ETA); `spans` collects when its server was up, for the neighbours."""
        store, n = self.host.store, len(self.plan["configs"])
        where = dict(k=self.index[cfg["config_id"]], n=n, config_id=cfg["config_id"],
                     elapsed_s=time.monotonic() - self.t0, eta_s=self.eta.left())
        if slot is not None:
            where["slot"] = slot.index
        busy = self.host.busy
        gate = busy is not None and cfg["config_id"] == busy.gate
        if not self.force and kept(store, cfg):
            store.event(Event.CONFIG_KEPT, **where)
            if gate:
                busy.prove()
            with self.lock:
                self.eta.done(cfg["estimate_s"] / share, cfg["estimate_s"] / share * self.eta.scale)
            return store.status(cfg["config_id"]) or {}
        if self.in_turn or (cfg["method"] != "autoregressive" and cfg["phase"] in self.failed_baselines):
            return self.measure(cfg, slot, share, spans, where, gate)
        with self.turn(cfg["config_id"]):
            where.update(elapsed_s=time.monotonic() - self.t0, eta_s=self.eta.left())  # after any wait
            return self.measure(cfg, slot, share, spans, where, gate)

    @contextmanager
    def turn(self, what: str) -> Iterator[None]:
        """The machine for `what` (a config, or a packed phase), waiting while another suite sharing the machine
        holds it (said once as an event)."""
        who = {"host": self.plan["host"], "run_id": self.plan["run_id"], "config_id": what}

        def waiting(holder: Dict[str, Any]) -> None:
            self.host.store.event(Event.MACHINE_WAIT, config_id=what, holder=holder_words(holder))

        with self.machine.turn(who, waiting):
            self.in_turn = True
            try:
                yield
            finally:
                self.in_turn = False

    def measure(self, cfg: Dict[str, Any], slot: Optional[Slot], share: int,
                spans: Optional[Dict[str, Dict[str, Any]]], where: Dict[str, Any], gate: bool) -> Dict[str, Any]:
        """`run_config`'s part that runs the config (or skips it after a failed baseline)."""
        store, n, busy = self.host.store, len(self.plan["configs"]), self.host.busy
        store.event(Event.CONFIG_START, **where)
        if gate:
            busy.launched.set()
        started, up_from = time.monotonic(), time.time()
        baseline = cfg["method"] == "autoregressive" and not cfg.get("pack_check_of")
        if not baseline and cfg["phase"] in self.failed_baselines:  # the pack check too
            status = skip(self.host, cfg, Reason.BASELINE_FAILED,
                          f"the autoregressive baseline of phase {cfg['phase']} did not finish ok")
        else:
            status = run_config(self.host, cfg, slot)
            if spans is not None and slot is not None:
                with self.lock:
                    spans[cfg["config_id"]] = {"slot": slot.index, "up": [up_from, time.time()],
                                               "timed": status.get("timed_window")}
        if baseline and status["status"] != Outcome.OK.value:
            self.failed_baselines.add(cfg["phase"])
        with self.lock:
            self.eta.done(cfg["estimate_s"] / share, (time.monotonic() - started) / share)
        store.event(Event.CONFIG_END, k=where["k"], n=n, config_id=cfg["config_id"], status=status["status"],
                    reason=status.get("reason"), ready_s=status.get("ready_s"),
                    requests_ok=status.get("requests_ok"), requests=status.get("requests"),
                    duration_s=round(time.monotonic() - started, 2), **({"slot": slot.index} if slot else {}))
        return status

    def packed(self, group: List[Dict[str, Any]], pool: List[Slot]) -> None:
        """One phase over its slots, a thread per slot taking the next config as its slot frees. The baseline
        starts first on the first slot; the other slots start theirs once it has started and hold their requests
        until its gate (`pack.Busy`): its warmup answered. With the pack check they start only after its end.
        A baseline that did not start, answer or (with the check) finish ok stops the servers still waiting
        and starts nothing after it. Then each config's status gets its neighbours."""
        spans: Dict[str, Dict[str, Any]] = {}
        base, rest = pack.split(group)
        alone = pack.alone(group)
        if base is not None and alone:
            self.run_config(base, pool[0], 1, spans)
        gated = base is not None and not alone
        busy = self.host.busy = pack.Busy(gate=base["config_id"] if gated else None)
        queue = deque(([base] if gated else []) + rest)
        errors: List[BaseException] = []

        def worker(slot: Slot) -> None:
            if slot is not pool[0]:
                busy.launched.wait()
            while not errors:
                with self.lock:  # taken and up in one step: the pack check (first in the queue) is up before any
                    if not queue:  # config after it can look for it
                        return
                    cfg = queue.popleft()
                    busy.enter(cfg["config_id"], check=bool(cfg.get("pack_check_of")))
                try:
                    self.run_config(cfg, slot, len(pool), spans)
                except BaseException as exc:  # raised again once every slot has stopped
                    errors.append(exc)
                    busy.launched.set()
                    busy.opened.set()
                finally:
                    busy.leave(cfg["config_id"])

        threads = [threading.Thread(target=worker, args=(slot,), name=f"slot-{slot.index}") for slot in pool]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.host.busy = None
        self.note_neighbours(spans)
        if errors:
            raise errors[0]

    def note_neighbours(self, spans: Mapping[str, Mapping[str, Any]]) -> None:
        """Write into each packed config's status.json which configs ran beside it (an empty list: none)."""
        for cid, near in pack.neighbours(spans).items():
            path = self.host.store.config_dir(cid) / "status.json"
            status = read_json(path)
            if isinstance(status, dict):
                status["neighbours"] = near
                write_json(path, status)

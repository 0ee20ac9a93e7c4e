"""Packing: the configs of a phase at once, each on its own slot (a disjoint set of GPUs, of CPUs, or both).

`slots()` gives a phase its slots: none to share (one slot, the whole host) unless `pack` is on; then the
phase's or the suite's `slots` as written, else one slot per `tp` GPUs of the host. `timeline()` lays the
configs onto the slots as the agent runs them, for the plan's per-slot timelines and the suite's ETA.
`neighbours()` says, after a phase, which configs ran beside each one and for how long.

The baseline starts first, on the first slot, and gates the others:
- without the pack check, the other slots start their servers beside it (the engine's startup is the long part,
  and it sends no request), but nothing else is measured, nor sent a request, until the baseline's server is up
  and has answered its warmup. A baseline that cannot start or cannot answer stops the servers already starting
  before their first request (recorded `skipped`, reason baseline_failed) and starts nothing else; the baseline
  then measures beside the others, packed like every other config;
- with the pack check (`pack_check`), the baseline runs alone to its end, so that its figures are the alone
  ones the check compares against; the others start only if it finished ok.
"""
from __future__ import annotations

import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

CPU_LIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*\Z")


@dataclass(frozen=True)
class Slot:
    """Where one config runs: `gpus` (indices as nvidia-smi numbers them) and `cpus` (a CPU list such as
    "0-3,8", as taskset and systemd's AllowedCPUs= take it); empty for the whole host."""

    index: int
    gpus: Tuple[int, ...] = ()
    cpus: str = ""

    @property
    def whole_host(self) -> bool:
        return not self.gpus and not self.cpus

    def record(self) -> Dict[str, Any]:
        """The `slot` field of status.json."""
        return {"index": self.index, "gpus": list(self.gpus), "cpus": self.cpus or None}

    def env(self) -> Dict[str, str]:
        """The server's environment for its GPUs: CUDA numbered like nvidia-smi (PCI bus order), these only."""
        if not self.gpus:
            return {}
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in self.gpus)}

    def describe(self) -> str:
        parts = []
        if self.gpus:
            parts.append(("GPU " if len(self.gpus) == 1 else "GPUs ") + ",".join(str(g) for g in self.gpus))
        if self.cpus:
            parts.append(f"CPUs {self.cpus}")
        return f"slot {self.index} ({'; '.join(parts) or 'the whole host'})"


def cpu_list(text: str) -> List[int]:
    """The CPUs of a list such as "0-3,8"; ValueError when it is not one."""
    if not CPU_LIST.match(text):
        raise ValueError(f"{text!r} is not a CPU list such as 0-3,8")
    out: List[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if hi and int(hi) < int(lo):
            raise ValueError(f"{part!r}: the range runs backwards")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def phase_of(suite: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    return next((p for p in suite.get("phases") or () if p.get("name") == name), {})


def slots(suite: Mapping[str, Any], phase: str, tp: int, gpu_count: int) -> List[Slot]:
    """The slots of one phase on a host with `gpu_count` GPUs (0: none known)."""
    if not suite.get("pack"):
        return [Slot(0)]
    given = phase_of(suite, phase).get("slots") or suite.get("slots") or []
    if given:
        return [Slot(i, tuple(s.get("gpus") or ()), str(s.get("cpus") or "")) for i, s in enumerate(given)]
    if gpu_count >= 2 * tp:
        return [Slot(i, tuple(range(i * tp, (i + 1) * tp))) for i in range(gpu_count // tp)]
    return [Slot(0)]


def problems(suite: Mapping[str, Any], gpu_count: int, prefix: str = "bench_") -> List[str]:
    """What is wrong with the slots of every phase (the matrix checks their shape; this, what they mean)."""
    out: List[str] = []
    if suite.get("pack_check") and not suite.get("pack"):
        out.append(f"{prefix}pack_check: true needs {prefix}pack: true (it measures the baseline again while the "
                   f"other slots are busy)")
    packed = [p["name"] for p in suite.get("phases") or () if len(slots(suite, p["name"], int(p.get("tp", 1)),
                                                                       gpu_count)) > 1]
    if packed and suite.get("port"):
        out.append(f"{prefix}port: {suite['port']} is one fixed port, but phase {packed[0]} runs configs at once "
                   f"(bench_pack); allowed: 0 (a free port per config)")
    for n, p in enumerate(suite.get("phases") or ()):
        where = f"{prefix}phases[{n}].slots" if p.get("slots") else f"{prefix}slots"
        given = p.get("slots") or suite.get("slots") or []
        tp = int(p.get("tp", 1))
        gpus_seen: Dict[int, int] = {}
        cpus_seen: Dict[int, int] = {}
        for i, s in enumerate(given):
            gpus = list(s.get("gpus") or ())
            if gpus and len(gpus) != tp:
                out.append(f"{where}[{i}].gpus: {len(gpus)} GPU(s) {gpus}, but phase {p['name']} runs tp {tp}: "
                           f"a slot holds exactly tp GPUs")
            for g in gpus:
                if gpu_count and g >= gpu_count:
                    out.append(f"{where}[{i}].gpus: GPU {g} does not exist (the host has {gpu_count}: 0-"
                               f"{gpu_count - 1})")
                if g in gpus_seen:
                    out.append(f"{where}[{i}].gpus: GPU {g} is also in slot {gpus_seen[g]}; slots are disjoint")
                gpus_seen.setdefault(g, i)
            if gpus and not gpu_count:
                out.append(f"{where}[{i}].gpus: the host has no GPUs ({prefix}gpu_count 0); name cpus instead")
            if s.get("cpus") not in (None, ""):
                try:
                    cpus = cpu_list(str(s["cpus"]))
                except ValueError as exc:
                    out.append(f"{where}[{i}].cpus: {exc}")
                    continue
                for c in cpus:
                    if c in cpus_seen:
                        out.append(f"{where}[{i}].cpus: CPU {c} is also in slot {cpus_seen[c]}; slots are disjoint")
                        break
                    cpus_seen.setdefault(c, i)
            if not gpus and s.get("cpus") in (None, ""):
                out.append(f"{where}[{i}]: names neither gpus nor cpus")
        if given and len({bool(s.get('gpus')) for s in given}) > 1:
            out.append(f"{where}: some slots name GPUs and some do not; every slot of a GPU phase needs its GPUs")
    return out


PACK_SUFFIX = "-packed"


def check_copy(base: Mapping[str, Any]) -> Dict[str, Any]:
    """The pack check of a phase's baseline: the same config measured again while the other slots are busy."""
    return {**base, "config_id": base["config_id"] + PACK_SUFFIX, "pack_check_of": base["config_id"]}


@dataclass(frozen=True)
class Placed:
    """One config on the timeline: its slot and estimated start and end, seconds from the suite's start."""

    config_id: str
    phase: str
    slot: Slot
    start_s: float
    end_s: float


def phase_order(configs: Sequence[Mapping[str, Any]]) -> List[Tuple[str, List[Mapping[str, Any]]]]:
    """The configs grouped by phase, in the order phases first appear."""
    out: List[Tuple[str, List[Mapping[str, Any]]]] = []
    for cfg in configs:
        if not out or out[-1][0] != cfg["phase"]:
            out.append((cfg["phase"], []))
        out[-1][1].append(cfg)
    return out


def split(group: Sequence[Mapping[str, Any]]) -> Tuple[Optional[Mapping[str, Any]], List[Mapping[str, Any]]]:
    """A phase's baseline (started first) and the configs packed after it: the pack check first (it starts
    with the first neighbours), then the longest first (the phase ends sooner than in matrix order)."""
    base = next((c for c in group if c["method"] == "autoregressive" and not c.get("pack_check_of")), None)
    rest = [c for c in group if c is not base]
    rest.sort(key=lambda c: (not c.get("pack_check_of"), -float(c.get("estimate_s") or 0)))
    return base, rest


def alone(group: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a packed phase's baseline runs alone to its end (the phase has a pack check to compare it with)
    rather than only until its server is up and answered its warmup."""
    return any(c.get("pack_check_of") for c in group)


def gate_s(base: Mapping[str, Any], group: Sequence[Mapping[str, Any]]) -> float:
    """Estimated seconds from the baseline's start until the other configs of its phase may send requests."""
    if alone(group):
        return float(base["estimate_s"])
    return min(float(base["estimate_s"]), float(base.get("estimate_ready_s") or 0.0))


def timeline(configs: Sequence[Mapping[str, Any]], phase_slots: Mapping[str, List[Slot]]) -> List[Placed]:
    """Every config's estimated place: phase after phase; in a phase the baseline first on the first slot, each
    next config on the slot that frees first (the agent's order). Without the pack check the other slots start
    with the baseline, and a config up before the gate (`gate_s`) waits for it before its requests; with it,
    they start at the baseline's end."""
    out: List[Placed] = []
    t = 0.0
    for phase, group in phase_order(configs):
        pool = phase_slots.get(phase) or [Slot(0)]
        base, rest = split(group) if len(pool) > 1 else (None, list(group))
        free, gate = [t] * len(pool), t
        if base is not None:
            out.append(Placed(base["config_id"], phase, pool[0], t, t + base["estimate_s"]))
            gate = t + gate_s(base, group)
            free = [t + base["estimate_s"]] + [t if not alone(group) else gate] * (len(pool) - 1)
        for cfg in rest:
            i = min(range(len(pool)), key=lambda k: (free[k], k))
            est = float(cfg["estimate_s"])
            ready = min(est, float(cfg.get("estimate_ready_s") or 0.0))
            end = max(free[i] + ready, gate) + est - ready
            out.append(Placed(cfg["config_id"], phase, pool[i], free[i], end))
            free[i] = end
        t = max(free)
    return out


def overlap(a: Optional[Sequence[float]], b: Optional[Sequence[float]]) -> float:
    """Seconds two [from, to] windows share."""
    if not a or not b:
        return 0.0
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


def neighbours(spans: Mapping[str, Mapping[str, Any]]) -> Dict[str, List[Dict[str, Any]]]:
    """Per config, the others whose servers were up at the same time: {config_id, slot, overlap_s,
    timed_overlap_s}. `spans` holds per config its slot index, `up` [from, to] and `timed` [from, to] (epoch
    seconds; timed None when no timed request ran)."""
    out: Dict[str, List[Dict[str, Any]]] = {}
    for cid, mine in spans.items():
        near = []
        for other, theirs in spans.items():
            shared = overlap(mine["up"], theirs["up"]) if other != cid else 0.0
            if shared > 0:
                near.append({"config_id": other, "slot": theirs["slot"], "overlap_s": round(shared, 3),
                             "timed_overlap_s": round(overlap(mine.get("timed"), theirs.get("timed")), 3)})
        out[cid] = sorted(near, key=lambda n: n["config_id"])
    return out


class Busy:
    """Which configs of a packed phase are up, ready for their timed requests, and in them, so that a pack check
    and the configs beside it start their timed requests together: the check waits until another config is
    ready or measuring (or none other is left up), a config beside a check that is up but not yet ready waits for
    it (`timed`); and the baseline's gate: `launched` is set once the `gate` config has started (or was kept from
    an earlier invocation), `opened` once it enters its timed requests (its server is up and answered its warmup:
    `proven`) or ends, whichever comes first."""

    def __init__(self, gate: Optional[str] = None) -> None:
        self.cond = threading.Condition()
        self.up: Set[str] = set()
        self.checks: Set[str] = set()  # the pack checks among `up`
        self.ready: Set[str] = set()  # warm, waiting to start their timed requests
        self.timing: Set[str] = set()
        self.gate = gate
        self.launched = threading.Event()
        self.opened = threading.Event()
        self.proven = gate is None
        if gate is None:
            self.launched.set()
            self.opened.set()

    def prove(self) -> None:
        """The gate config answered (or was already ok): the others may send their requests."""
        self.proven = True
        self.launched.set()
        self.opened.set()

    def held_back(self, config_id: str) -> bool:
        """True when `config_id` may not send requests: it is not the gate, and the gate ended without being
        proven. Waits for the gate to open first."""
        if config_id == self.gate:
            return False
        self.opened.wait()
        return not self.proven

    def gate_failed(self, config_id: str) -> bool:
        """Without waiting: whether the gate has already ended unproven (for a server still starting)."""
        return config_id != self.gate and self.opened.is_set() and not self.proven

    def enter(self, config_id: str, check: bool = False) -> None:
        """`config_id` is taken by a slot: up from now on (its server about to start), until `leave`. Called in the
        same critical section as the slot takes it from the queue, so that a config started after a pack check
        always sees the check up."""
        with self.cond:
            self.up.add(config_id)
            if check:
                self.checks.add(config_id)

    def leave(self, config_id: str) -> None:
        with self.cond:
            self.up.discard(config_id)
            self.checks.discard(config_id)
            self.ready.discard(config_id)
            self.timing.discard(config_id)
            self.cond.notify_all()
        if config_id == self.gate:
            self.launched.set()
            self.opened.set()

    def _may_start(self, config_id: str) -> bool:
        others = self.up - {config_id}
        if config_id in self.checks:  # beside another config's timed requests, or alone once none is left
            return bool((self.timing | self.ready) & others) or not others
        return not (self.checks & others) - self.ready - self.timing  # no check beside it still starting

    @contextmanager
    def timed(self, config_id: str, wait_s: float = 0.0) -> Iterator[float]:
        """Around a config's timed requests; first wait (at most `wait_s`) until it may start them (see the
        class). Yields the seconds waited."""
        with self.cond:
            self.ready.add(config_id)
            self.cond.notify_all()
            waited = 0.0
            if wait_s > 0 and not self._may_start(config_id):
                t0 = time.monotonic()
                self.cond.wait_for(lambda: self._may_start(config_id), wait_s)
                waited = time.monotonic() - t0
            self.ready.discard(config_id)
            self.timing.add(config_id)
            self.cond.notify_all()
        if config_id == self.gate:
            self.prove()
        try:
            yield waited
        finally:
            with self.cond:
                self.timing.discard(config_id)
                self.cond.notify_all()

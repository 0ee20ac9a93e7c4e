"""Packing on a real NVIDIA host: the agent's packed Suite run with one GPU slot per GPU, the stand-in engine
(tests/standin/engine.py, not an inference engine) as every config's server, and what each server saw.

Per config it prints the slot, its GPUs and neighbours, ready_s and wall_s from status.json; the stand-in's own
report (torch.cuda.device_count(), each visible device's UUID, CUDA_VISIBLE_DEVICES) against nvidia-smi's UUID for
the slot's GPU index; the memory nvidia-smi saw on every GPU while the server ran; and the release before the next
config on the same slot: the stand-in keeps its memory `--release-delay` seconds after its stop (in a holder that
neither the group stop nor the leftover kill reaches), so the agent's release check must wait, on that slot's GPUs only.

The checks (also asserted by tests/gpu/test_pack_gpu.py):
- each server sees exactly its slot's GPUs: device_count == len(slot gpus), CUDA_VISIBLE_DEVICES is the slot's
  indices and the UUID it sees is nvidia-smi's for that index (CUDA_DEVICE_ORDER=PCI_BUS_ID numbers like nvidia-smi);
- memory appears on the slot's GPU while its server runs, and on no GPU while nothing of the run holds it;
- a config starts only after the memory its slot's previous config left is back, having waited for it, and its
  wait ends once its own GPUs are free: memory held on another GPU never delays it. With 2+ GPUs at least one
  config must have started while another GPU was still held, else that check proved nothing;
- with 2+ GPUs the same configs are run once more unpacked (one after another on the whole host) for the wall ratio.

With one GPU the phase has one slot (`slots: [{gpus: [0]}]`): the configs run in turn on it, confined and checked
the same way; there are no neighbours, and the wall ratio needs 2+ GPUs.

Usage, from the repository's root (or `.venv/bin/python benchmarks/gpu_pack.py` where the project is installed):

  python3 -m benchmarks.gpu_pack [--hold-mib 8192] [--release-delay 6] [--configs 4] [--work DIR] [--json F]
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from agent import config_run as agent_config
from agent import gpu as agent_gpu
from agent import pack
from agent.server import become_subreaper
from agent.suite import Suite
from controller import matrix

ROOT = Path(__file__).resolve().parents[1]
STANDIN = ROOT / "tests" / "standin" / "engine.py"
HOST = "gpu-pack"
TOLERANCE_MIB = agent_gpu.RELEASE_TOLERANCE_MIB  # what the agent's release check allows above idle
SAMPLE_MS = 200
MARGIN_S = 1.0  # around a holding interval's ends, where nvidia-smi may still show the change coming or going
RELEASE_LAG_S = 10.0  # the most a process's memory may take to show as free after it ended
WAIT_SLACK_S = 2.0  # a release wait ends this soon after its own GPUs are free (the agent polls every 0.2 s)
MAX_TOKENS = 200  # a token each 2 ms (two a chunk for ngram): about 1 to 2 s of timed requests, sampled every 0.2 s


# -- nvidia-smi ---------------------------------------------------------------------------------------------
def smi_gpus() -> List[Dict[str, Any]]:
    """index, uuid, pci.bus_id, memory.used and memory.total of every GPU; [] without nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    res = subprocess.run([exe, "--query-gpu=index,uuid,pci.bus_id,memory.used,memory.total",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=60)
    out = []
    for line in res.stdout.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 5 and cells[0].isdigit():
            out.append({"index": int(cells[0]), "uuid": cells[1], "pci_bus_id": cells[2].upper(),
                        "used_mib": int(cells[3]), "total_mib": int(cells[4])})
    return out


class MemorySampler:
    """Every GPU's memory.used, every SAMPLE_MS, from one `nvidia-smi -lms` for the `with` block:
    `samples` is [(epoch seconds, index, MiB)]."""

    def __init__(self) -> None:
        self.samples: List[Tuple[float, int, int]] = []
        self.proc: Optional[subprocess.Popen] = None
        self.thread: Optional[threading.Thread] = None

    def __enter__(self) -> MemorySampler:
        self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits",
                                      "-lms", str(SAMPLE_MS)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, bufsize=1)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        time.sleep(1.0)  # a few samples of the idle GPUs first
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            cells = [c.strip() for c in line.split(",")]
            if len(cells) == 2 and cells[0].isdigit() and cells[1].isdigit():
                self.samples.append((time.time(), int(cells[0]), int(cells[1])))

    def __exit__(self, *exc: object) -> None:
        time.sleep(1.0)
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.thread is not None:
            self.thread.join(5)


# -- the agent's release waits, observed --------------------------------------------------------------------
@contextmanager
def observe_release_waits() -> Iterator[Dict[str, Dict[str, Any]]]:
    """Per config id, the agent's own release wait in its preflight: {gpus, from, to, wait_s, ok} (wall clock).
    Wraps agent.config_run.preflight (to know the config) and agent.gpu.wait_released for the block; changes nothing."""
    waits: Dict[str, Dict[str, Any]] = {}
    local = threading.local()
    preflight, wait_released = agent_config.preflight, agent_gpu.wait_released

    def timed_preflight(host: Any, cfg: Any, slot: Any = None) -> Any:
        local.cid = cfg["config_id"]
        try:
            return preflight(host, cfg, slot)
        finally:
            local.cid = None

    def timed_wait(idle: Dict[int, int], deadline_s: float, *a: Any, **kw: Any) -> Any:
        t0 = time.time()
        ok, now = wait_released(idle, deadline_s, *a, **kw)
        t1 = time.time()
        waits[getattr(local, "cid", None) or "?"] = {"gpus": sorted(idle), "from": t0, "to": t1,
                                                     "wait_s": round(t1 - t0, 3), "ok": ok}
        return ok, now

    agent_config.preflight, agent_gpu.wait_released = timed_preflight, timed_wait
    try:
        yield waits
    finally:
        agent_config.preflight, agent_gpu.wait_released = preflight, wait_released


# -- the plan -----------------------------------------------------------------------------------------------
def write_engine_python(folder: Path, hold_mib: int, release_delay_s: float, record: Path) -> str:
    """An executable standing in for the engine's Python: the stand-in server with these options; its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "standin-python"
    opts = ["--hold-mib", str(hold_mib), "--release-delay", str(release_delay_s), "--record", str(record)]
    # the agent gives its servers a clean environment: a PYTHONPATH that torch came from is kept here
    keep = f"export PYTHONPATH={shlex.quote(os.environ['PYTHONPATH'])}\n" if os.environ.get("PYTHONPATH") else ""
    path.write_text(f"#!/bin/sh\n{keep}export STANDIN_MODEL_CHECK=0\n"
                    f"exec {shlex.join([sys.executable, str(STANDIN), *opts])} \"$@\"\n")
    path.chmod(0o755)
    return str(path)


def checked(suite: Dict[str, Any]) -> Any:
    """matrix.validate; where jsonschema is not installed (a GPU machine without the controller's dependencies)
    the cross-field checks still run and only the schema's type checks are left out."""
    try:
        import jsonschema  # noqa: F401
    except ImportError:
        matrix.schema_errors = lambda _suite: []
    return matrix.validate(suite)


def build_plan(python: str, gpu_count: int, n_configs: int, pack_on: bool, slots: List[Dict[str, Any]],
               release_s: float, run_id: str) -> Dict[str, Any]:
    """A plan as the controller sends it: one tp 1 phase, the baseline and n_configs - 1 ngram configs."""
    configs = [{"method": "autoregressive"},
               *({"method": "ngram", "num_speculative_tokens": k} for k in range(2, 1 + n_configs))]
    suite = {"engine": "vllm", "engine_python": python, "model": {"name": "standin", "path": "/nonexistent/standin"},
             "gpu_count": gpu_count, "pack": pack_on, "slots": slots, "repetitions": 2, "warmup_max_tokens": 4,
             "timeouts": {"health_s": 180, "request_s": 60, "stop_s": 60, "release_s": release_s},
             "phases": [{"name": "tp1", "configs": configs,
                         "sweeps": [{"workloads": ["fib"], "max_tokens": [MAX_TOKENS], "concurrency": [1, 2]}]}]}
    m = checked(suite)
    return {"run_id": run_id, "host": HOST, "suite": m.suite, "configs": matrix.expand(m)}


# -- one run ------------------------------------------------------------------------------------------------
def read_jsonl(path: Path) -> List[Dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_case(work: Path, name: str, gpus: List[Dict[str, Any]], pack_on: bool, slots: List[Dict[str, Any]],
             n_configs: int, hold_mib: int, release_delay_s: float) -> Dict[str, Any]:
    """One Suite run with the stand-in as engine; what it recorded, what nvidia-smi saw, and the checks."""
    case = work / name
    record = case / "standin.jsonl"
    python = write_engine_python(case / "engine", hold_mib, release_delay_s, record)
    plan = build_plan(python, len(gpus), n_configs, pack_on, slots, release_delay_s + 60, f"gpu-pack-{name}")
    root = case / "results" / plan["run_id"]
    with MemorySampler() as sampler, observe_release_waits() as waits:
        t0 = time.time()
        Suite(plan, root, invocation=f"gpu-pack-{name}").run()
        t1 = time.time()
    # holders still holding after the suite (the last config's) are waited for, so the next run starts idle
    agent_gpu.wait_released({g["index"]: g["used_mib"] for g in gpus}, release_delay_s + 60)
    return analyse(name, plan, root / HOST, read_jsonl(record), waits, sampler.samples, gpus, hold_mib,
                   release_delay_s, t0, t1, pack_on)


def analyse(name: str, plan: Dict[str, Any], host_dir: Path, records: List[Dict[str, Any]],
            waits: Dict[str, Dict[str, Any]], samples: List[Tuple[float, int, int]], gpus: List[Dict[str, Any]],
            hold_mib: int, delay_s: float, t0: float, t1: float, confined: bool) -> Dict[str, Any]:
    idle = {g["index"]: g["used_mib"] for g in gpus}
    smi_uuid = {g["index"]: g["uuid"] for g in gpus}
    smi_bus = {g["index"]: g["pci_bus_id"] for g in gpus}
    servers: Dict[str, Dict[str, Any]] = {}  # config id -> its server's events by name
    for r in records:
        if r["role"] == "server" and r.get("mark"):
            servers.setdefault(r["mark"].split("/")[1], {})[r["event"]] = r
    holders: Dict[int, Dict[str, Any]] = {}
    for r in records:
        if r["role"] == "holder":
            holders.setdefault(r["pid"], {})[r["event"]] = r

    configs: List[Dict[str, Any]] = []
    for cfg in plan["configs"]:
        cid = cfg["config_id"]
        st = json.loads((host_dir / cid / "status.json").read_text())
        ev = servers.get(cid, {})
        report = (ev.get("held") or {}).get("report") or {}
        slot = st.get("slot") or {}
        handed = ev.get("handed_over") or {}
        held_by = holders.get(handed.get("holder_pid"), {})
        c: Dict[str, Any] = {
            "config_id": cid, "status": st["status"], "reason": st.get("reason"), "slot": slot.get("index"),
            "gpus": slot.get("gpus"), "neighbours": st.get("neighbours"), "ready_s": st.get("ready_s"),
            "wall_s": st.get("wall_s"), "requests_ok": st.get("requests_ok"), "requests": st.get("requests"),
            "counters": (st.get("counters") or {}).get("verdict"),
            "standin": {k: report.get(k) for k in ("pid", "cuda_visible_devices", "cuda_device_order",
                                                   "device_count", "devices", "allocated_mib")},
            "t_start": (ev.get("start") or {}).get("t"), "t_held": (ev.get("held") or {}).get("t"),
            "t_sigterm": (ev.get("sigterm") or {}).get("t"), "t_exit": (ev.get("exit") or {}).get("t"),
            "t_holder_held": (held_by.get("holder_held") or {}).get("t"),
            "t_holder_freeing": (held_by.get("holder_freeing") or {}).get("t"),
            "release_wait": waits.get(cid),
        }
        c["smi_uuids"] = [smi_uuid.get(i) for i in (c["gpus"] or [])]
        c["smi_pci_bus_ids"] = [smi_bus.get(i) for i in (c["gpus"] or [])]
        configs.append(c)

    def mem(g: int, a: float, b: float) -> List[int]:
        return [m for t, i, m in samples if i == g and a <= t <= b]

    def back_at(g: int, after: float) -> Optional[float]:
        """When nvidia-smi first showed GPU g within the tolerance of idle after `after`."""
        return next((t for t, i, m in samples if i == g and t >= after and m <= idle[g] + TOLERANCE_MIB), None)

    # per GPU, when something of this run held memory there: a server from its start, then its holder, until the
    # memory was seen back (at most RELEASE_LAG_S after the last of them let go; without CUDA_VISIBLE_DEVICES a
    # server may use any GPU: all of them)
    busy: Dict[int, List[Tuple[float, float]]] = {i: [] for i in idle}
    for c in configs:
        on = c["gpus"] if confined and c["gpus"] else list(idle)
        if c["t_start"] is None:
            continue
        gone = max(c["t_exit"] or c["t_sigterm"] or t1, c["t_holder_freeing"] or 0)
        for g in on:
            back = back_at(g, gone)
            busy.setdefault(g, []).append((c["t_start"], min(back or gone + RELEASE_LAG_S, gone + RELEASE_LAG_S)))

    def busy_at(g: int, t: float, margin: float = MARGIN_S) -> bool:
        return any(a - margin <= t <= b + margin for a, b in busy.get(g, []))

    for c in configs:
        a, b = (c["t_held"] or 0) + 0.5, (c["t_sigterm"] or 0) - 0.2
        c["memory_while_running"] = {g: (min(v), max(v)) if v else None
                                     for g in idle for v in [mem(g, a, b)]}
        c["memory_samples"] = len(mem((c["gpus"] or [0])[0], a, b))
        # the previous config on the same slot and how its memory came back
        prev = [p for p in configs if p is not c and p["slot"] == c["slot"] and p["t_sigterm"] and c["t_start"]
                and p["t_sigterm"] < c["t_start"]]
        p = max(prev, key=lambda p: p["t_sigterm"]) if prev else None
        c["previous_on_slot"] = p["config_id"] if p else None
        if p is not None:
            backs = [back_at(g, p["t_holder_freeing"] or p["t_sigterm"]) for g in (c["gpus"] or list(idle))]
            back = max(backs) if all(backs) else None
            c["release"] = {"previous": p["config_id"], "t_stop": p["t_sigterm"], "t_freeing": p["t_holder_freeing"],
                            "t_back": back, "stop_to_back_s": round(back - p["t_sigterm"], 3) if back else None,
                            "next_started_after_back_s": round(c["t_start"] - back, 3) if back else None}
        # another GPU held by this run while this config's release wait ran or its server started
        w = c["release_wait"] or {}
        t_ref = w.get("to") or c["t_start"]
        c["started_while_held"] = sorted(g for g in idle if g not in (c["gpus"] or []) and t_ref is not None
                                         and busy_at(g, t_ref, 0.0) and confined)

    # memory on a GPU while nothing of this run held it there
    stray = []
    for t, g, m in samples:
        if t0 <= t <= t1 and not busy_at(g, t) and m > idle[g] + TOLERANCE_MIB:
            stray.append({"t": round(t - t0, 2), "gpu": g, "used_mib": m, "idle_mib": idle[g]})
    return {"name": name, "pack": confined, "gpus": gpus, "hold_mib": hold_mib, "release_delay_s": delay_s,
            "wall_s": round(t1 - t0, 3), "configs": configs, "stray_memory": stray[:20], "n_stray": len(stray),
            "n_samples": len(samples), "t0": t0}


def problems(run: Dict[str, Any]) -> List[str]:
    """What the packed run's records say is wrong with the slots' isolation and release checks ([] when none)."""
    out: List[str] = []
    idle = {g["index"]: g["used_mib"] for g in run["gpus"]}
    hold, delay = run["hold_mib"], run["release_delay_s"]
    for c in run["configs"]:
        cid, s = c["config_id"], c["standin"]
        if c["status"] != "ok":
            out.append(f"{cid}: status {c['status']} ({c['reason']})")
            continue
        gpus = c["gpus"] or []
        if len(gpus) != 1 or c["slot"] is None:
            out.append(f"{cid}: slot {c['slot']} gpus {gpus}, expected one GPU")
            continue
        if s.get("device_count") != len(gpus):
            out.append(f"{cid}: the server saw {s.get('device_count')} GPU(s), its slot has {len(gpus)}")
        if s.get("cuda_visible_devices") != ",".join(map(str, gpus)) or s.get("cuda_device_order") != "PCI_BUS_ID":
            out.append(f"{cid}: CUDA_VISIBLE_DEVICES={s.get('cuda_visible_devices')} CUDA_DEVICE_ORDER="
                       f"{s.get('cuda_device_order')} in the server, slot GPUs {gpus}")
        seen = [d.get("uuid") for d in s.get("devices") or []]
        if seen != c["smi_uuids"]:
            out.append(f"{cid}: the server's GPU UUID(s) {seen} are not nvidia-smi's {c['smi_uuids']} for GPU(s) "
                       f"{gpus}")
        mine = c["memory_while_running"].get(gpus[0])
        if not mine:
            out.append(f"{cid}: no nvidia-smi sample of GPU {gpus[0]} while its server ran")
        elif mine[0] < idle[gpus[0]] + 0.9 * hold:
            out.append(f"{cid}: GPU {gpus[0]} showed only {mine[0]} MiB while its server held {hold} MiB "
                       f"(idle {idle[gpus[0]]})")
        rel, w = c.get("release"), c["release_wait"]
        if w is None:
            out.append(f"{cid}: no release wait observed")
        elif w["gpus"] != gpus:
            out.append(f"{cid}: the release check looked at GPUs {w['gpus']}, its slot has {gpus}")
        if rel is not None and delay > 0 and w is not None:
            if rel["t_freeing"] is None or rel["t_back"] is None:
                out.append(f"{cid}: the memory of {rel['previous']} was not seen coming back")
            else:
                if c["t_start"] < rel["t_freeing"]:
                    out.append(f"{cid}: its server started {rel['t_freeing'] - c['t_start']:.2f} s before "
                               f"{rel['previous']}'s memory was released")
                if w["wait_s"] < delay - 3.0:
                    out.append(f"{cid}: the release check waited {w['wait_s']} s, the memory was held {delay} s "
                               f"after the stop")
                if w["to"] > max(w["from"], rel["t_back"]) + WAIT_SLACK_S:
                    out.append(f"{cid}: the release wait ended {w['to'] - rel['t_back']:.2f} s after its GPU was "
                               f"free: something else held it up")
        elif w is not None and w["wait_s"] > WAIT_SLACK_S:
            out.append(f"{cid}: waited {w['wait_s']} s for a GPU nothing of this slot held")
    for s in run["stray_memory"][:5]:
        out.append(f"GPU {s['gpu']} held {s['used_mib']} MiB (idle {s['idle_mib']}) at +{s['t']} s while no "
                   f"server or holder of the run was on it")
    if len(run["gpus"]) >= 2 and not any(c["started_while_held"] for c in run["configs"]):
        out.append("no config started while another GPU was held: the cross-slot check proved nothing")
    return out


# -- the report ---------------------------------------------------------------------------------------------
def f(v: Any, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def print_run(run: Dict[str, Any]) -> None:
    t0, idle = run["t0"], {g["index"]: g["used_mib"] for g in run["gpus"]}
    print(f"\n== {run['name']}: {'packed' if run['pack'] else 'not packed'}, wall {run['wall_s']:.1f} s, "
          f"{len(run['configs'])} configs, stand-in holds {run['hold_mib']} MiB and releases "
          f"{run['release_delay_s']:g} s after its stop; {run['n_samples']} nvidia-smi samples")
    for c in run["configs"]:
        s = c["standin"]
        up = "..".join("+" + f(t and t - t0, "{:.1f}") for t in (c["t_start"], c["t_sigterm"]))
        print(f"\n{c['config_id']}: {c['status']}{' (' + str(c['reason']) + ')' if c['reason'] else ''}; slot "
              f"{c['slot']} GPUs {c['gpus']}; ready_s {f(c['ready_s'])} wall_s {f(c['wall_s'])}; requests "
              f"{c['requests_ok']}/{c['requests']}; counters {c['counters']}; server up {up} s")
        near = c["neighbours"]
        print("  neighbours: " + ("(none recorded: the phase has one slot, its configs run in turn)" if near is None
                                  else ", ".join(f"{n['config_id']} (slot {n['slot']}, {n['overlap_s']} s up, "
                                                 f"{n['timed_overlap_s']} s timed)" for n in near) or "none"))
        for i, d in enumerate(s.get("devices") or []):
            smi = c["smi_uuids"][i] if i < len(c["smi_uuids"]) else None
            print(f"  stand-in: device_count {s.get('device_count')}, CUDA_VISIBLE_DEVICES="
                  f"{s.get('cuda_visible_devices')}, cuda:{i} {d.get('uuid')} bus {d.get('pci_bus_id')}; nvidia-smi "
                  f"GPU {c['gpus'][i] if c['gpus'] else '?'}: {smi} bus "
                  f"{c['smi_pci_bus_ids'][i] if c['smi_pci_bus_ids'] else '?'} -> "
                  f"{'same' if smi == d.get('uuid') else 'DIFFERENT'}")
        mem = ", ".join(f"GPU {g}: {v[0]}-{v[1]} MiB (idle {idle[g]})" if v else f"GPU {g}: no sample"
                        for g, v in c["memory_while_running"].items())
        print(f"  nvidia-smi while it ran: {mem}")
        w, rel = c["release_wait"], c.get("release")
        if w is not None:
            line = f"  release check before it: GPUs {w['gpus']}, waited {w['wait_s']:.2f} s (ok {w['ok']})"
            if rel is not None:
                line += (f"; after {rel['previous']} on this slot: stop -> memory back {f(rel['stop_to_back_s'])} s, "
                         f"its server started {f(rel['next_started_after_back_s'])} s after the memory was back")
            if c["started_while_held"]:
                line += f"; started while GPU(s) {c['started_while_held']} were still held by another config"
            print(line)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hold-mib", type=int, default=8192)
    ap.add_argument("--release-delay", type=float, default=6.0)
    ap.add_argument("--configs", type=int, default=4, help="configs in the phase: the baseline and ngram ones")
    ap.add_argument("--work", type=Path, help="where runs and results go (default: a temporary folder)")
    ap.add_argument("--json", type=Path, help="write every figure here as JSON")
    args = ap.parse_args(argv)
    gpus = smi_gpus()
    if not gpus:
        print("no nvidia-smi or no GPU: this benchmark needs an NVIDIA host", file=sys.stderr)
        return 2
    become_subreaper()  # as the agent does: workers that leave a server are reaped here
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-pack-"))
    print("nvidia-smi --query-gpu=index,uuid,pci.bus_id,memory.used,memory.total:")
    for g in gpus:
        print(f"  {g['index']}, {g['uuid']}, {g['pci_bus_id']}, {g['used_mib']} MiB used of {g['total_mib']}")
    n = len(gpus)
    slots = [{"gpus": [i]} for i in range(n)]
    auto = pack.slots({"pack": True}, "tp1", 1, n)
    print(f"slots: {slots} given; pack: true with none given makes {[list(s.gpus) for s in auto]} on {n} GPU(s)"
          + ("" if n >= 2 else " (one GPU: no slot of its own unless given)"))
    runs = [run_case(work, "packed", gpus, True, slots, args.configs, args.hold_mib, args.release_delay)]
    if n >= 2:
        runs.append(run_case(work, "serial", gpus, False, [], args.configs, args.hold_mib, args.release_delay))
    for r in runs:
        print_run(r)
    found = problems(runs[0])
    print()
    if n >= 2:
        print(f"wall: packed {runs[0]['wall_s']:.1f} s on {n} slots, serial {runs[1]['wall_s']:.1f} s: packed/serial "
              f"{runs[0]['wall_s'] / runs[1]['wall_s']:.2f}")
    else:
        print(f"wall: {runs[0]['wall_s']:.1f} s on one slot; packed vs serial wall needs 2+ GPUs")
    print("checks: " + ("all passed" if not found else f"{len(found)} problem(s)"))
    for p in found:
        print("  - " + p)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"runs": runs, "problems": found}, indent=1, default=str))
    print(f"results: {work}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

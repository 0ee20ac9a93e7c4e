"""llama.cpp on a real NVIDIA host without network access: llama-server built with CUDA from the source brought
along, then a whole suite run through the agent on the GPU, one server per config, with what nvidia-smi saw.

1. The build: llama.cpp's tree from `--source` (the pinned llama-cpp-python sdist, which vendors it at
   vendor/llama.cpp, another archive of a llama.cpp tree, or an unpacked tree) is configured with the llamacpp
   role's own cmake arguments (read from roles/llamacpp/vars/main.yml, so that they cannot drift) and the role's
   CUDA ones (-DGGML_CUDA=ON, the GPUs' compute capabilities as CMAKE_CUDA_ARCHITECTURES, NCCL and the flash
   attention quant kernels off; nvcc from PATH, else the role's fallback), then `ninja -j <cores> llama-server`.
   Its folder, <work>/build/<key>, is keyed as the role keys it (the source's digest and every cmake argument):
   a build whose record (specfleet-build.json, the role's record, which host.json then carries) is there is kept.
2. The plan: as the controller makes it (controller.matrix; where jsonschema is missing only the schema's type
   checks are left out), engine llamacpp with the built server, the GPUs nvidia-smi sees, tp 1, the GGUF models of
   `--models` (target, draft, dflash, eagle3 .gguf), every layer on the GPU: the baseline, ngram k2, draft_model
   k3, dflash block 4, eagle3 k3 and draft_model k3 told to accept at 2.5 and 3.5 tokens per step, over four
   workloads at contexts 0 and 512 (128 tokens), and fib at concurrency 1, 2, 4 and 8 for the baseline and
   draft_model; 3 repetitions. Each server flag is checked against the build's `--help` first (the agent checks
   every flag again before each server).
3. The run: agent.suite's Suite, as the agent runs a plan, while nvidia-smi samples every GPU's memory every
   0.2 s (benchmarks.gpu_pack's MemorySampler). Per config: memory above the idle level seen while its server
   served (config_ready to config_end) and back near idle after its end, before the next server started (those
   samples and the agent's own reading in its release check, the last step before it starts a server).
4. What it prints: the GPU (host.json), llama-server's version and commit, the build's seconds, per config its
   status, ready_s, the GPU memory seen while it served and after it, its tokens per second and acceptance length;
   every check as PASS or FAIL. It writes the host's results folder as one .tar.gz (`<host>/...`, what
   `specfleet unpack` takes), a JSON summary and the build's log into --out (default: --work).

Exit status: 0 every check passed, 1 a check failed, 2 nothing to check (no GPU, no models, a failed build).

Usage, from the repository's root (python 3.9+, the standard library and the project alone):

  python3 -m benchmarks.gpu_llamacpp --source <sdist .tar.gz | llama.cpp archive | tree> --models <folder of .gguf>
      --work <dir> [--out <dir>] [--jobs N] [--repetitions 3]

Back on the controller, the archive makes a run folder the collector reads:

  specfleet stamp results/<run_id> start --suite gpu-llamacpp --hosts gpu-llamacpp
  specfleet unpack results/<run_id> gpu-llamacpp gpu-llamacpp-results.tar.gz
  specfleet stamp results/<run_id> finish --hosts gpu-llamacpp
  specfleet report results/<run_id>
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import threading
import time
import traceback
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
HOST = "gpu-llamacpp"
SUITE_NAME = "gpu-llamacpp"
ROLE = ROOT / "roles" / "llamacpp"
ROLE_FLAGS_KEY = "_llamacpp_cmake_base"  # the role's own cmake arguments (its vars/main.yml)
RECORD = "specfleet-build.json"  # the role's build record, in the build folder (agent.fingerprint reads it)
NEWLINE = "\n"
# every layer on the GPU, the memory fit left alone; eight slots of 1024 tokens; no warmup run at start
SERVER_ARGS = ["--ctx-size", "8192", "--parallel", "8", "--n-gpu-layers", "all", "--fit", "off", "--no-warmup"]
MODELS = ("target", "draft", "dflash", "eagle3")
WORKLOADS = ["fib", "qsort", "arith", "json"]
SAMPLE_S = 0.2  # benchmarks.gpu_pack's MemorySampler: one nvidia-smi sample of every GPU each 0.2 s
SEEN_MIB = 128  # memory above idle that counts as a server's own while it serves
NEAR_IDLE_MIB = 64  # "back near idle": within this of the idle level
LAUNCH_SLACK_S = 0.05  # the after-window ends this long after the next server's launch (timestamps' rounding)
SETTLE_S = 30.0  # after the suite: the most the last server's memory may take to come back


# -- the role's cmake arguments ----------------------------------------------------------------------------
def _scalar(text: str) -> str:
    """One YAML scalar as the role writes them: quotes and a trailing comment removed."""
    text = text.strip()
    if text[:1] in "\"'" and text[-1:] == text[:1] and len(text) >= 2:
        return text[1:-1]
    return re.sub(r"\s+#.*$", "", text).strip()


def yaml_list(text: str, key: str) -> Optional[List[str]]:
    """The list of strings under a top-level `key:` of a YAML file, in block (`- item` lines) or flow (`[a, b]`)
    form, read without a YAML library; None where the key is missing."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(rf"^{re.escape(key)}:\s*(.*)$", line)
        if not m:
            continue
        rest = re.sub(r"\s+#.*$", "", m.group(1)).strip()
        if rest.startswith("["):
            inner = rest.strip("[]").strip()
            return [_scalar(x) for x in inner.split(",") if x.strip()] if inner else []
        out: List[str] = []
        for follow in lines[i + 1:]:
            if not follow.strip() or follow.lstrip().startswith("#"):
                continue
            item = re.match(r"^\s*-\s+(.*)$", follow)
            if item and (follow[:1].isspace() or follow.startswith("-")):
                out.append(_scalar(item.group(1)))
                continue
            break
        return out
    return None


def yaml_scalar(text: str, key: str) -> Optional[str]:
    """A top-level `key: value` of a YAML file, without a YAML library; None where it is missing."""
    m = re.search(rf"^{re.escape(key)}:[ \t]*(\S.*)$", text, re.M)
    return _scalar(m.group(1)) if m else None


def role_cmake_flags(role: Path = ROLE) -> List[str]:
    """The llamacpp role's own cmake arguments (the generator and its -D flags), as its vars file lists them."""
    for rel in ("vars/main.yml", "defaults/main.yml"):
        path = role / rel
        if path.is_file():
            found = yaml_list(path.read_text(), ROLE_FLAGS_KEY)
            if found:
                return [str(x) for x in found]
    raise SystemExit(f"{role}: no {ROLE_FLAGS_KEY} list in vars/main.yml or defaults/main.yml")


def role_nvcc(role: Path = ROLE) -> str:
    """The role's nvcc for a host where nvcc is not on PATH (llamacpp_nvcc)."""
    path = role / "defaults" / "main.yml"
    found = yaml_scalar(path.read_text(), "llamacpp_nvcc") if path.is_file() else None
    return found or "/usr/local/cuda/bin/nvcc"


def cuda_args(archs: str, nvcc_on_path: bool, nvcc: str) -> List[str]:
    """The CUDA arguments the llamacpp role adds (roles/llamacpp/tasks/preflight.yml, `__llamacpp_cuda_args`,
    a Jinja expression there: kept the same here)."""
    return (["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={archs}", "-DGGML_CUDA_NCCL=OFF",
             "-DGGML_CUDA_FA_ALL_QUANTS=OFF"] + ([] if nvcc_on_path else [f"-DCMAKE_CUDA_COMPILER={nvcc}"]))


def cuda_archs(caps: Iterable[str]) -> str:
    """nvidia-smi's compute capabilities ("9.0") as the role's arch list: "90", unique, sorted, ';'-joined."""
    found = sorted({int(m.group(1) + m.group(2)) for c in caps for m in [re.match(r"^\s*(\d+)\.(\d+)\s*$", c)] if m})
    return ";".join(map(str, found))


def build_key(digest: str, args: Sequence[str]) -> str:
    """The role's build key: the first 16 hex digits of sha256("<digest>\\n<arg 1>\\n...<arg n>\\n")."""
    return hashlib.sha256((NEWLINE.join([digest, *args]) + NEWLINE).encode()).hexdigest()[:16]


# -- the source ----------------------------------------------------------------------------------------------
def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tree_digest(root: Path) -> str:
    """sha256 over an unpacked tree's files (relative path and content, .git left out)."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and ".git" not in p.relative_to(root).parts):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def is_llamacpp(d: Path) -> bool:
    return (d / "CMakeLists.txt").is_file() and (d / "ggml" / "CMakeLists.txt").is_file() and \
        (d / "tools" / "server").is_dir()


def find_tree(root: Path, depth: int = 4) -> Optional[Path]:
    """The shallowest llama.cpp tree (CMakeLists.txt, ggml/, tools/server) at or under `root`: the sdist's
    vendor/llama.cpp, an archive's one top folder, or `root` itself."""
    level = [root]
    for _ in range(depth + 1):
        found = sorted(d for d in level if is_llamacpp(d))
        if found:
            return found[0]
        level = sorted(c for d in level for c in d.iterdir() if c.is_dir() and not c.is_symlink()
                       and c.name != ".git")
    return None


def source_tree(source: Path, work: Path) -> Tuple[Path, Dict[str, Any]]:
    """llama.cpp's tree and what names its source: an archive unpacked once per digest under <work>/src (in a
    .partial folder, then renamed), or the folder given."""
    if source.is_dir():
        digest = "tree:" + tree_digest(source)
        tree = find_tree(source)
        where: Dict[str, Any] = {"source": "tree", "digest": digest}
    else:
        sha = sha256_file(source)
        digest = f"sha256:{sha}"
        dest = work / "src" / sha[:16]
        if not dest.is_dir():
            partial = dest.with_name(dest.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
            with tarfile.open(source) as tar:
                try:
                    tar.extractall(partial, filter="data")
                except TypeError:  # Python before 3.12: no extraction filters
                    tar.extractall(partial)
            partial.rename(dest)
        tree = find_tree(dest)
        where = {"source": "archive", "digest": digest, "archive": source.name, "sha256": sha}
        if tree is not None:
            where["subdir"] = str(tree.relative_to(dest))
    if tree is None:
        raise SystemExit(f"{source}: no llama.cpp tree in it (CMakeLists.txt, ggml/ and tools/server)")
    return tree, where


# -- the GPUs and the build ----------------------------------------------------------------------------------
def smi(fields: str) -> List[List[str]]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    res = subprocess.run([exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"], capture_output=True,
                         text=True, timeout=60)
    return [[c.strip() for c in line.split(",")] for line in res.stdout.splitlines() if line.strip()]


def find_nvcc(fallback: str) -> Tuple[bool, Optional[str]]:
    """(on PATH?, nvcc's path): PATH first, then the role's fallback."""
    exe = shutil.which("nvcc")
    if exe:
        return True, exe
    return False, fallback if os.access(fallback, os.X_OK) else None


def run_logged(argv: List[str], log: Path, cwd: Optional[Path] = None) -> Tuple[int, float]:
    """Run `argv` with its output appended to `log`; (exit status, seconds)."""
    t0 = time.monotonic()
    with open(log, "a") as out:
        out.write(f"\n$ {' '.join(argv)}\n")
        out.flush()
        rc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, cwd=cwd).returncode
    return rc, time.monotonic() - t0


def tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def build_server(tree: Path, where: Dict[str, Any], args: List[str], build_root: Path, jobs: int,
                 log: Path) -> Dict[str, Any]:
    """llama-server built into build_root/<key> (kept where its record is there); its record, with `kept`,
    `binary` and (a build) `configure_seconds`."""
    key = build_key(where["digest"], args)
    bdir = build_root / key
    binary = bdir / "bin" / "llama-server"
    record_path = bdir / RECORD
    if record_path.is_file() and binary.is_file():
        record = json.loads(record_path.read_text())
        return {**record, "kept": True, "binary": str(binary)}
    bdir.mkdir(parents=True, exist_ok=True)
    print(f"building llama-server (key {key}, {jobs} jobs): cmake {' '.join(args)}", flush=True)
    rc, configure_s = run_logged(["cmake", "-S", str(tree), "-B", str(bdir), *args], log)
    if rc != 0:
        raise BuildFailed(f"cmake failed ({rc}) after {configure_s:.1f} s", tail(log))
    rc, ninja_s = run_logged(["ninja", "-C", str(bdir), "-j", str(jobs), "llama-server"], log)
    if rc != 0 or not binary.is_file():
        raise BuildFailed(f"ninja failed ({rc}) after {ninja_s:.1f} s", tail(log))
    res = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=120)
    lines = [x.strip() for x in (res.stdout + res.stderr).splitlines() if x.strip()]
    version = [x for x in lines if x.startswith(("version:", "built with"))] or lines[-2:]
    record = {**where, "key": key, "cmake_args": args, "jobs": jobs,
              "build_seconds": round(configure_s + ninja_s, 1),
              "server_version": NEWLINE.join(version[:2]),
              "built_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    tmp = record_path.with_name(RECORD + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.rename(record_path)  # written last: a folder without it is an unfinished build, redone
    return {**record, "kept": False, "binary": str(binary), "configure_seconds": round(configure_s, 1)}


class BuildFailed(Exception):
    def __init__(self, what: str, log_tail: str) -> None:
        super().__init__(what)
        self.log_tail = log_tail


# -- the plan ------------------------------------------------------------------------------------------------
def model(models: Path, name: str, served: str) -> Dict[str, Any]:
    return {"name": served, "path": str((models / f"{name}.gguf").resolve()), "revision": "seeded-local"}


def suite_for(server: str, models: Path, gpu_count: int, repetitions: int) -> Dict[str, Any]:
    """The suite, as a host's variables give it to the controller."""
    configs = [
        {"method": "autoregressive"},
        {"method": "ngram", "num_speculative_tokens": 2},
        {"method": "draft_model", "num_speculative_tokens": 3},
        {"method": "dflash", "block_size": 4, "draft_model": model(models, "dflash", "tiny-dflash")},
        {"method": "eagle3", "num_speculative_tokens": 3, "draft_model": model(models, "eagle3", "tiny-eagle3")},
        # llama.cpp accepts the drafts at rates whose mean acceptance length (the target's token included) is this
        {"method": "draft_model", "num_speculative_tokens": 3, "synth_len": 2.5},
        {"method": "draft_model", "num_speculative_tokens": 3, "synth_len": 3.5},
    ]
    sweeps = [{"name": "short", "workloads": WORKLOADS, "max_tokens": [128], "context_tokens": [0, 512]},
              {"name": "load", "workloads": ["fib"], "max_tokens": [128], "concurrency": [1, 2, 4, 8],
               "methods": ["draft_model-k3"]}]  # and the baseline, which measures every cell
    return {"suite_name": SUITE_NAME, "engine": "llamacpp", "engine_binary": server,
            "model": {**model(models, "target", "tiny-llama"), "max_model_len": 1024},
            "draft_model": model(models, "draft", "tiny-llama-draft"),
            "gpu_count": gpu_count, "server_args": list(SERVER_ARGS),
            # random weights under greedy decoding stop early or loop: every request produces exactly max_tokens
            "sampling": {"temperature": 0.0, "ignore_eos": True}, "repetitions": repetitions,
            "timeouts": {"health_s": 300, "request_s": 120, "stop_s": 60, "release_s": 60},
            "estimate": {"startup_s": 3, "tok_s": 1000, "prefill_tok_s": 50000},
            "phases": [{"name": "tp1", "tp": 1, "configs": configs, "sweeps": sweeps}]}


def build_plan(server: str, models: Path, gpu_count: int, repetitions: int, run_id: str) -> Dict[str, Any]:
    """The plan as the controller sends it to the agent (controller.matrix's checks and expansion)."""
    from benchmarks.gpu_pack import checked
    from controller import matrix

    m = checked(suite_for(server, models, gpu_count, repetitions))
    return {"run_id": run_id, "host": HOST, "suite": m.suite, "configs": matrix.expand(m)}


def unknown_server_flags(server: str, args: Sequence[str]) -> List[str]:
    """The flags of `args` (and the engine's own, --metrics) that the build's `--help` does not list."""
    from agent import probe
    from agent.engines import ENGINES

    flags, _choices = probe.read_help(server, "", None, 120, "--help")
    wanted = [a for a in [*ENGINES["llamacpp"].always_args, *args] if a.startswith("-")]
    return [a for a in wanted if probe.flag_name(a) not in flags]


# -- what the run recorded -----------------------------------------------------------------------------------
def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def read_jsonl(path: Path) -> List[Dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def spans(events: List[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """Per config id, in run order: t_start, t_ready (and ready_s), t_end (epoch seconds) from its events."""
    out: Dict[str, Dict[str, Any]] = {}
    for e in events:
        cid = e.get("config_id")
        if not cid or e.get("event") not in ("config_start", "config_ready", "config_end"):
            continue
        s = out.setdefault(cid, {})
        s["t_" + e["event"].split("_")[1]] = epoch(e["t"])
        if e["event"] == "config_ready":
            s["ready_s"] = e.get("ready_s")
    return out


def memory_windows(span: Dict[str, Dict[str, Any]], samples: Sequence[Tuple[float, int, int]],
                   idle: Dict[int, int], t_stop: float) -> Dict[str, Dict[str, Any]]:
    """Per config, per GPU: the memory nvidia-smi saw while its server served (config_ready to config_end: the
    most) and after its end until the next server was launched (the next config_ready less its ready_s, and
    LAUNCH_SLACK_S for the clocks' rounding: no server has memory on a GPU that soon; the last config's until
    `t_stop`: the least), with the checks' verdicts. `samples` holds the sampler's readings and the agent's own
    reading right before each launch (its release check, the last step before it starts a server)."""
    order = sorted(span, key=lambda c: span[c].get("t_start", 0.0))
    out: Dict[str, Dict[str, Any]] = {}
    for k, cid in enumerate(order):
        s = span[cid]
        nxt = span[order[k + 1]] if k + 1 < len(order) else None
        t_end = s.get("t_end")
        if nxt is None:
            until = t_stop
        elif nxt.get("t_ready") is not None:
            until = nxt["t_ready"] - float(nxt.get("ready_s") or 0.0)
        else:
            until = nxt.get("t_end", t_stop)
        res: Dict[str, Any] = {"gpus": {}}
        for g, base in sorted(idle.items()):
            serving = [m for t, i, m in samples if i == g and s.get("t_ready") is not None and t_end is not None
                       and s["t_ready"] <= t <= t_end]
            after_to = until + LAUNCH_SLACK_S if nxt is not None else until
            after = [(t, m) for t, i, m in samples if i == g and t_end is not None and t_end <= t <= after_to]
            back = next((t for t, m in after if m <= base + NEAR_IDLE_MIB), None)
            res["gpus"][g] = {"idle_mib": base, "serving_max_mib": max(serving) if serving else None,
                              "serving_samples": len(serving),
                              "after_min_mib": min(m for _, m in after) if after else None,
                              "after_samples": len(after),
                              "back_after_end_s": round(back - t_end, 2) if back is not None and t_end else None}
        gs = res["gpus"].values()
        res["seen"] = any(v["serving_max_mib"] is not None and v["serving_max_mib"] > v["idle_mib"] + SEEN_MIB
                          for v in gs)
        res["released"] = all(v["after_min_mib"] is not None and v["after_min_mib"] <= v["idle_mib"] + NEAR_IDLE_MIB
                              for v in gs)
        out[cid] = res
    return out


def tok_s(rows: List[Dict[str, Any]]) -> Optional[float]:
    """The median output tokens per second of the config's single requests (concurrency 1, no added context)."""
    vals = [r["output_tok_s"] for r in rows if r.get("ok") and r.get("concurrency") == 1
            and not r.get("context_tokens") and isinstance(r.get("output_tok_s"), (int, float))]
    return round(statistics.median(vals), 1) if vals else None


def accept_length(rows: List[Dict[str, Any]]) -> Optional[float]:
    """Tokens per verify step over the config's requests: 1 + accepted / steps (requests that know their steps)."""
    steps = sum(r["spec_steps"] for r in rows if isinstance(r.get("spec_steps"), int) and r.get("ok"))
    acc = sum(r["spec_accepted_tokens"] for r in rows if isinstance(r.get("spec_steps"), int) and r.get("ok")
              and isinstance(r.get("spec_accepted_tokens"), int))
    return round(1 + acc / steps, 2) if steps else None


def analyse(plan: Dict[str, Any], host_dir: Path, samples: Sequence[Tuple[float, int, int]],
            idle: Dict[int, int], t_stop: float) -> Dict[str, Any]:
    span = spans(read_jsonl(host_dir / "events.jsonl"))
    mem = memory_windows(span, samples, idle, t_stop)
    configs = []
    for cfg in plan["configs"]:
        cid = cfg["config_id"]
        st_path = host_dir / cid / "status.json"
        st = json.loads(st_path.read_text()) if st_path.exists() else {}
        rows = read_jsonl(host_dir / cid / "requests.jsonl")
        m = mem.get(cid, {"gpus": {}, "seen": False, "released": False})
        configs.append({"config_id": cid, "status": st.get("status", "missing"), "reason": st.get("reason"),
                        "detail": st.get("detail"), "ready_s": st.get("ready_s"), "wall_s": st.get("wall_s"),
                        "requests_ok": st.get("requests_ok"), "requests": st.get("requests"),
                        "counters": (st.get("counters") or {}).get("verdict"), "tok_s": tok_s(rows),
                        "accept_length": accept_length(rows),
                        "synth_len": cfg["method_params"].get("synth_len"), "memory": m})
    return {"configs": configs}


def host_info(host_dir: Path) -> Dict[str, Any]:
    try:
        return json.loads((host_dir / "host.json").read_text())
    except (OSError, ValueError):
        return {}


def gpu_names(info: Dict[str, Any]) -> List[str]:
    """The GPU names host.json records."""
    return [str(d.get("name")) for d in (info.get("gpus") or {}).get("devices") or [] if d.get("name")]


def checks(result: Dict[str, Any], names: List[str], smi_names: List[str], engine: Dict[str, Any],
           unknown: List[str]) -> List[Dict[str, Any]]:
    """Every check: {name, ok, detail}."""
    out = [{"name": "server flags in the build's --help", "ok": not unknown,
            "detail": "all listed" if not unknown else f"not listed: {', '.join(unknown)}"},
           {"name": "host.json names the GPU", "ok": bool(names) and names == smi_names,
            "detail": f"{', '.join(names) or 'no GPU in host.json'} (nvidia-smi: {', '.join(smi_names)})"},
           {"name": "host.json carries the build record", "ok": bool((engine.get("build") or {}).get("key")),
            "detail": f"key {(engine.get('build') or {}).get('key')}"}]
    for c in result["configs"]:
        cid, m = c["config_id"], c["memory"]
        gpu = ", ".join(f"GPU {g}: idle {v['idle_mib']}, max {v['serving_max_mib']} ({v['serving_samples']} samples)"
                        for g, v in m["gpus"].items())
        after = ", ".join(f"GPU {g}: min {v['after_min_mib']} ({v['after_samples']} samples, back "
                          f"{v['back_after_end_s']} s after the end)" for g, v in m["gpus"].items())
        out += [{"name": f"{cid}: status ok", "ok": c["status"] == "ok",
                 "detail": f"{c['status']} {c['reason'] or ''} {c['requests_ok']}/{c['requests']} requests ok".strip()},
                {"name": f"{cid}: server's counters agree with the requests", "ok": c["counters"] == "ok",
                 "detail": str(c["counters"])},
                {"name": f"{cid}: GPU memory above idle while it served", "ok": bool(m["seen"]), "detail": gpu},
                {"name": f"{cid}: GPU memory back near idle after its end", "ok": bool(m["released"]),
                 "detail": after}]
    return out


# -- output --------------------------------------------------------------------------------------------------
def fmt(v: Any, spec: str = "{:.2f}") -> str:
    return "-" if v is None else spec.format(v) if isinstance(v, (int, float)) else str(v)


def print_table(result: Dict[str, Any]) -> None:
    head = ["config", "status", "ready_s", "GPU MiB serving", "MiB after", "tok/s (c1)", "accept len", "counters"]
    rows = []
    for c in result["configs"]:
        gs = list(c["memory"]["gpus"].values())
        serving = "/".join(fmt(v["serving_max_mib"], "{}") for v in gs) or "-"
        after = "/".join(fmt(v["after_min_mib"], "{}") for v in gs) or "-"
        idle = "/".join(str(v["idle_mib"]) for v in gs)
        acc = fmt(c["accept_length"]) + (f" (set {c['synth_len']:g})" if c["synth_len"] else "")
        rows.append([c["config_id"], c["status"], fmt(c["ready_s"]), f"{serving} (idle {idle})", after,
                     fmt(c["tok_s"], "{:.1f}"), acc, str(c["counters"])])
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, ["-" * w for w in widths], *rows]:
        print("  " + "  ".join(str(x).ljust(w) for x, w in zip(r, widths)))


def archive(host_dir: Path, dest: Path) -> Path:
    """The host's results folder as one .tar.gz whose members are `<host>/...` (specfleet unpack's input)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".partial")
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(host_dir, arcname=host_dir.name)
    tmp.rename(dest)
    return dest


class Progress:
    """Says each config's start, readiness and end as the agent records them (its events.jsonl), once a second,
    so that a log cut short still shows how far the suite got."""

    def __init__(self, events: Path) -> None:
        self.events, self.seen, self.stop = events, 0, threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Progress:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)
        self._read()

    def _loop(self) -> None:
        while not self.stop.wait(1.0):
            self._read()

    def _read(self) -> None:
        try:
            lines = self.events.read_text().splitlines()
        except OSError:
            return
        for line in lines[self.seen:]:
            try:
                e = json.loads(line)
            except ValueError:
                return  # a line being written: read again next time
            self.seen += 1
            kind = e.get("event")
            if kind == "config_start":
                print(f"  [{e.get('k')}/{e.get('n')}] {e.get('config_id')}: start", flush=True)
            elif kind == "config_ready":
                print(f"  {e.get('config_id')}: ready in {e.get('ready_s')} s", flush=True)
            elif kind == "config_end":
                print(f"  {e.get('config_id')}: {e.get('status')} {e.get('reason') or ''} "
                      f"({e.get('requests_ok')}/{e.get('requests')} requests, {e.get('duration_s')} s)", flush=True)


@contextmanager
def agent_readings() -> Iterator[List[Tuple[float, int, int]]]:
    """The agent's own nvidia-smi reading at the end of each release check (agent.gpu.wait_released, the last step
    of a config's preflight, right before its server starts), as (epoch seconds, GPU, MiB); changes nothing."""
    from agent import gpu as agent_gpu

    readings: List[Tuple[float, int, int]] = []
    wait_released = agent_gpu.wait_released

    def recorded(idle: Dict[int, int], deadline_s: float, *a: Any, **kw: Any) -> Any:
        ok, now = wait_released(idle, deadline_s, *a, **kw)
        t = time.time()
        readings.extend((t, int(g), int(m)) for g, m in now.items())
        return ok, now

    agent_gpu.wait_released = recorded
    try:
        yield readings
    finally:
        agent_gpu.wait_released = wait_released


def settle(sampler: Any, idle: Dict[int, int], limit_s: float = SETTLE_S) -> None:
    """Wait until the sampler has seen every GPU back near idle after now (the last server's memory), or limit_s."""
    t0 = time.time()
    while time.time() - t0 < limit_s:
        recent = {i: m for t, i, m in list(sampler.samples) if t > t0}
        if recent and all(i in recent and recent[i] <= base + NEAR_IDLE_MIB for i, base in idle.items()):
            return
        time.sleep(SAMPLE_S)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, required=True,
                    help="llama.cpp's source: the llama-cpp-python sdist (.tar.gz), an archive of a llama.cpp tree, "
                         "or an unpacked tree")
    ap.add_argument("--models", type=Path, required=True, help=f"the folder of {', '.join(MODELS)}.gguf")
    ap.add_argument("--work", type=Path, required=True, help="where the source, the build and the results go")
    ap.add_argument("--out", type=Path, help="where the results' archive, the summary and the build log go "
                                             "(default: --work)")
    ap.add_argument("--jobs", type=int, default=0, help="ninja -j (default: the cores this process may use)")
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--arch", default="", help="CMAKE_CUDA_ARCHITECTURES (default: the GPUs' compute capabilities)")
    args = ap.parse_args(argv)

    work, out = args.work.resolve(), (args.out or args.work).resolve()
    missing = [f"{n}.gguf" for n in MODELS if not (args.models / f"{n}.gguf").is_file()]
    if missing:
        print(f"{args.models}: {', '.join(missing)} missing", file=sys.stderr)
        return 2
    if not args.source.exists():
        print(f"{args.source}: no such source", file=sys.stderr)
        return 2
    gpus = smi("index,name,compute_cap,memory.used,memory.total")
    if not gpus:
        print("no nvidia-smi or no GPU: this benchmark needs an NVIDIA host", file=sys.stderr)
        return 2
    for tool in ("cmake", "ninja"):
        if not shutil.which(tool):
            print(f"{tool} is not on PATH", file=sys.stderr)
            return 2
    on_path, nvcc = find_nvcc(role_nvcc())
    if not nvcc:
        print(f"nvcc is neither on PATH nor at {role_nvcc()}", file=sys.stderr)
        return 2
    archs = args.arch or cuda_archs(g[2] for g in gpus)
    jobs = args.jobs or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    print("nvidia-smi: " + "; ".join(f"GPU {g[0]} {g[1]} (compute {g[2]}, {g[3]} of {g[4]} MiB used)" for g in gpus))
    print(f"nvcc: {nvcc}{'' if on_path else ' (not on PATH: the role fallback)'}; CUDA archs {archs}; jobs {jobs}")

    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "gpu-llamacpp-build.log"
    summary: Dict[str, Any] = {"host": HOST, "gpus_smi": gpus}
    t_src = time.monotonic()
    tree, where = source_tree(args.source.resolve(), work)
    print(f"source: {where['digest']} ({time.monotonic() - t_src:.1f} s to unpack and hash); tree {tree}")
    cmake_args = [*role_cmake_flags(), *cuda_args(archs, on_path, nvcc)]
    try:
        build = build_server(tree, where, cmake_args, work / "build", jobs, log)
    except BuildFailed as exc:
        print(f"BUILD FAILED: {exc}\n{exc.log_tail}", file=sys.stderr)
        summary["build"] = {"failed": str(exc)}
        (out / "gpu-llamacpp-summary.json").write_text(json.dumps(summary, indent=1, default=str))
        return 2
    server = build["binary"]
    summary["build"] = build
    print(f"llama-server: {build['server_version'].splitlines()[0] if build['server_version'] else '?'}; "
          + (f"kept build {build['key']} (built in {build['build_seconds']} s)" if build["kept"] else
             f"built in {build['build_seconds']} s (configure {build['configure_seconds']} s) as key {build['key']}"),
          flush=True)

    # nothing below imports beyond the standard library and the project (and no jsonschema): a bare GPU host
    from agent import gpu as agent_gpu
    from agent.server import become_subreaper
    from agent.suite import Suite
    from benchmarks.gpu_pack import MemorySampler

    unknown = unknown_server_flags(server, SERVER_ARGS)
    if unknown:
        print(f"the build's --help lists none of {unknown}: the agent would refuse every config", file=sys.stderr)
    run_id = "gpu-llamacpp-" + datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    plan = build_plan(server, args.models, len(gpus), args.repetitions, run_id)
    n_req = sum(c.get("requests", 0) for c in plan["configs"])
    print(f"plan {run_id}: {len(plan['configs'])} configs ({', '.join(c['config_id'] for c in plan['configs'])}), "
          f"{n_req} timed requests; server args {' '.join(SERVER_ARGS)}", flush=True)

    become_subreaper()  # as the agent does: workers that leave a server are reaped here
    root = work / "results" / run_id
    idle = agent_gpu.used_by_index(agent_gpu.parse_query_csv(agent_gpu.query() or ""))
    with MemorySampler() as sampler, Progress(root / HOST / "events.jsonl"), agent_readings() as readings:
        t0 = time.time()
        try:
            Suite(plan, root, invocation=f"{run_id}-{HOST}").run()
        except Exception:  # what the agent recorded so far is still checked, archived and brought back
            traceback.print_exc()
            print("the suite stopped on the error above", file=sys.stderr)
        t1 = time.time()
        settle(sampler, idle)
        t_stop = time.time()
    before = [m for t, i, m in sampler.samples if t < t0]
    idle = {g: min([m for t, i, m in sampler.samples if t < t0 and i == g] or [v]) for g, v in idle.items()}
    host_dir = root / HOST
    result = analyse(plan, host_dir, sorted([*sampler.samples, *readings]), idle, t_stop)
    info = host_info(host_dir)
    names, engine = gpu_names(info), info.get("engine") or {}
    found = checks(result, names, [g[1] for g in gpus], engine, unknown)

    print(f"\nGPU (host.json): {', '.join(names) or '?'}; driver {(info.get('gpus') or {}).get('driver_version')}, "
          f"CUDA {(info.get('gpus') or {}).get('cuda_version')}")
    print(f"llama-server: version {engine.get('version')}, commit {engine.get('commit') or 'unknown'}; "
          f"build {build['build_seconds']} s ({'kept' if build['kept'] else 'this run'}, key {build['key']}, "
          f"ninja -j {build['jobs']})")
    print(f"suite: {t1 - t0:.1f} s for {len(result['configs'])} configs; {len(sampler.samples)} nvidia-smi samples "
          f"({len(before)} before the first config); idle {idle} MiB\n")
    print_table(result)
    print()
    for ch in found:
        print(f"{'PASS' if ch['ok'] else 'FAIL'}  {ch['name']}: {ch['detail']}")
    failed = [ch for ch in found if not ch["ok"]]
    print(f"\nchecks: {len(found) - len(failed)}/{len(found)} passed")

    tar = archive(host_dir, out / "gpu-llamacpp-results.tar.gz")
    summary.update(run_id=run_id, suite_s=round(t1 - t0, 1), idle_mib=idle, gpus=names,
                   engine={k: engine.get(k) for k in ("version", "commit", "program")}, configs=result["configs"],
                   checks=found, passed=not failed, archive=tar.name,
                   t0=t0, samples=[(round(t - t0, 2), i, m) for t, i, m in sampler.samples],
                   agent_readings=[(round(t - t0, 2), i, m) for t, i, m in readings])
    (out / "gpu-llamacpp-summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(f"results: {tar} ({tar.stat().st_size // 1024} KiB, members {HOST}/...), run {run_id}; "
          f"summary {out / 'gpu-llamacpp-summary.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""The collector at scale: builds a synthetic run of 1,000,000 request rows (by default) that keeps the results
contract, then times `python -m collector report RUN --format md|csv|json` end to end, each as its own process,
and prints best and median wall seconds against the target.

The run: one host, three phases (tp 1, 2, 4), each a baseline and seven speculative configs (DFlash with and
without overlap scheduling, DDTree at three budgets, n-gram, a draft model) over 144 cells (6 workloads x 2
max_tokens x 3 context lengths x concurrency 1, 2, 4, 8); one config failed (oom) with no rows. With --packed,
each phase is packed: its configs carry slots and neighbours, and a pack check measures the baseline again. Repetitions
are set so the rows add up to exactly --rows. Rows carry every field the agent writes (agent/records.py REQUEST,
written as agent.store.write_jsonl writes them), about 0.3% failed requests, and --damaged broken lines (a
truncated line, a missing field, a wrong type), which the report must skip and name.

Usage: python benchmarks/report_scale.py [--rows N] [--damaged 3] [--packed] [--out DIR [--reuse]] [--repeat 3]
       [--formats md,csv,json] [--keep] [--save-outputs DIR]

Reading a million lines within the target takes msgspec (see collector/load.py); without it the collector reads
them line by line, the same way and several times slower.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 5.0
HOST, ENGINE, MODEL = "gpu1", "sglang", "Qwen3-8B"
WORKLOADS = ["fib", "qsort", "arith", "json", "prose", "sql"]
MAX_TOKENS = [128, 512]
CONTEXT = [0, 4096, 16384]
CONCURRENCY = [1, 2, 4, 8]
TPS = [1, 2, 4]
# (label, method, method_params, speed factor over the baseline, mean accept length, server args, environment)
METHODS: List[Tuple[str, str, Dict[str, Any], float, float, List[str], Dict[str, str]]] = [
    ("autoregressive", "autoregressive", {}, 1.0, 0.0, [], {}),
    ("dflash-spec2", "dflash", {"block_size": 16}, 2.4, 5.1, [], {"SGLANG_ENABLE_SPEC_V2": "1"}),
    ("dflash-plain", "dflash", {"block_size": 16}, 2.1, 5.1, ["--disable-overlap-schedule"], {}),
    ("ddtree-b8", "ddtree", {"budget": 8, "block_size": 16}, 2.6, 5.6, ["--page-size", "1"], {}),
    ("ddtree-b16", "ddtree", {"budget": 16, "block_size": 16}, 2.8, 6.2, ["--page-size", "1"], {}),
    ("ddtree-b32", "ddtree", {"budget": 32, "block_size": 16}, 2.7, 6.6, ["--page-size", "1"], {}),
    ("ngram-k4", "ngram", {"num_speculative_tokens": 4}, 1.3, 1.8, [], {}),
    ("draft-k4", "draft_model", {"num_speculative_tokens": 4}, 1.7, 3.2, [], {}),
]
FAILED = "tp4-ddtree-b32"  # out of memory: a row per cell with the reason, no request rows
ERROR_RATE = 0.003


def cells() -> List[Dict[str, Any]]:
    return [{"workload": w, "max_tokens": m, "context_tokens": c, "concurrency": k}
            for w in WORKLOADS for m in MAX_TOKENS for c in CONTEXT for k in CONCURRENCY]


def configs(packed: bool = False) -> List[Dict[str, Any]]:
    """Every config; with `packed`, each phase also has its pack check (the baseline again, beside the others)."""
    out = []
    for tp in TPS:
        for label, method, params, speed, accept, args, env in METHODS:
            out.append({"config_id": f"tp{tp}-{label}", "phase": f"tp{tp}", "tp": tp, "method": method,
                        "method_params": params, "speed": speed, "accept": accept, "server_args": args,
                        "environment": {"HF_HUB_OFFLINE": "1", **env}})
            if packed and method == "autoregressive":
                out.append({**out[-1], "config_id": f"tp{tp}-{label}-packed", "speed": 0.97,
                            "pack_check_of": f"tp{tp}-{label}"})
    return out


def packing(cfgs: List[Dict[str, Any]], cfg: Dict[str, Any]) -> Dict[str, Any]:
    """status.json's slot and neighbours of a packed phase's config (the baseline ran alone: none): four slots of
    one GPU each, every other non-baseline config of the phase up beside it, most of them measuring too."""
    mates = [c for c in cfgs if c["phase"] == cfg["phase"] and c["config_id"] != FAILED
             and not (c["method"] == "autoregressive" and "pack_check_of" not in c)]
    if cfg not in mates:
        return {}
    slot = mates.index(cfg) % 4
    return {"slot": {"index": slot, "gpus": [slot], "cpus": None},
            "neighbours": [{"config_id": c["config_id"], "slot": i % 4, "overlap_s": 600.0 + i,
                            "timed_overlap_s": 0.0 if i % 3 == 2 else 450.0 + i}
                           for i, c in enumerate(mates) if c is not cfg]}


def repetitions(rows: int, cfgs: List[Dict[str, Any]], cell_list: List[Dict[str, Any]]) -> Dict[Tuple[str, int], int]:
    """Repetitions per (config, cell index) so that the request rows add up to exactly `rows`."""
    measured = [c for c in cfgs if c["config_id"] != FAILED]
    per_rep = len(measured) * sum(c["concurrency"] for c in cell_list)
    base = rows // per_rep
    reps = {(c["config_id"], i): base for c in measured for i in range(len(cell_list))}
    left = rows - base * per_rep
    while left > 0:
        for key in reps:
            k = cell_list[key[1]]["concurrency"]
            if k <= left:
                reps[key] += 1
                left -= k
    return reps


def order(cfg_cells: List[Dict[str, Any]], rng: random.Random) -> Iterator[Tuple[int, int]]:
    """(repetition, cell index): every cell's repetition r before any r + 1, each round shuffled."""
    for rep in range(max(c["repetitions"] for c in cfg_cells)):
        todo = [i for i, c in enumerate(cfg_cells) if rep < c["repetitions"]]
        rng.shuffle(todo)
        yield from ((rep, i) for i in todo)


def base_tok_s(cell: Dict[str, Any], tp: int) -> float:
    """A plausible baseline per-request tok/s: faster at higher tp, slower with context and concurrency."""
    return 42.0 * (1 + 0.45 * math.log2(tp)) / (1 + cell["context_tokens"] / 32768) / (1 + 0.08 * cell["concurrency"])


def burst_rows(cfg: Dict[str, Any], cell: Dict[str, Any], rep: int, rng: random.Random,
               clock: List[float]) -> Iterator[Dict[str, Any]]:
    """One repetition of a cell: a burst of `concurrency` requests, shaped as the agent writes them."""
    spec = cfg["method"] != "autoregressive"
    mean = base_tok_s(cell, cfg["tp"]) * cfg["speed"]
    identity = {"host": HOST, "config_id": cfg["config_id"], "method": cfg["method"],
                "method_params": cfg["method_params"], "tp": cfg["tp"], "engine": ENGINE, "model": MODEL,
                "phase": cfg["phase"], "workload": cell["workload"], "max_tokens": cell["max_tokens"],
                "context_tokens": cell["context_tokens"], "concurrency": cell["concurrency"]}
    prompt = 40 + cell["context_tokens"] + rng.randrange(8)
    t0 = clock[0]
    burst_end = t0
    for slot in range(cell["concurrency"]):
        sent = t0 + rng.random() * 0.002
        started = f"2026-12-01T10:{int(sent // 60) % 60:02d}:{sent % 60:09.6f}+00:00"
        if rng.random() < ERROR_RATE:
            done = sent + rng.uniform(0.01, 2.0)
            row = {**identity, "rep": rep, "slot": slot, "started_at": started, "prompt_tokens": None,
                   "completion_tokens": None, "ttft_s": None, "e2e_s": done - sent, "output_tok_s": None,
                   "decode_tok_s": None, "tpot_s": None, "itl_mean_s": None, "itl_p50_s": None,
                   "chunk_gap_mean_s": None, "chunk_gap_p50_s": None, "chunk_tokens_mean": None, "chunks": 0,
                   "finish_reason": None, "accept_length": None, "spec_steps": None,
                   "spec_accepted_tokens": None, "ok": False,
                   "error": "HTTP 500: Internal Server Error", "sent_s": round(sent, 6), "done_s": round(done, 6)}
        else:
            tokens = cell["max_tokens"]
            tok_s = max(rng.gauss(mean, mean * 0.03), mean * 0.5)
            e2e = tokens / tok_s
            ttft = 0.02 + cell["context_tokens"] / 60000 * rng.uniform(0.9, 1.1)
            decode = (tokens - 1) / (e2e - ttft) if e2e > ttft else None
            accept = rng.gauss(cfg["accept"], 0.3) if spec else None
            steps = max(int(tokens / accept), 1) if accept else None
            per_chunk = accept if accept else 1.0
            chunks = max(int(tokens / per_chunk), 1)
            gap = (e2e - ttft) / max(chunks - 1, 1)
            done = sent + e2e
            burst_end = max(burst_end, done)
            row = {**identity, "rep": rep, "slot": slot, "started_at": started, "prompt_tokens": prompt,
                   "completion_tokens": tokens, "ttft_s": ttft, "e2e_s": e2e, "output_tok_s": tok_s,
                   "decode_tok_s": decode, "tpot_s": 1 / decode if decode else None,
                   "itl_mean_s": gap / per_chunk, "itl_p50_s": gap / per_chunk * rng.uniform(0.9, 1.0),
                   "chunk_gap_mean_s": gap, "chunk_gap_p50_s": gap * rng.uniform(0.9, 1.0),
                   "chunk_tokens_mean": per_chunk, "chunks": chunks + 1, "finish_reason": "length",
                   "accept_length": accept, "spec_steps": steps,
                   "spec_accepted_tokens": tokens - steps if steps else None, "ok": True, "error": None,
                   "sent_s": round(sent, 6), "done_s": round(done, 6)}
        yield row
    clock[0] = burst_end + 0.001


def damaged_lines(cfg: Dict[str, Any], count: int) -> List[str]:
    """Lines the report must skip and name: a truncated write, a missing field, tp as a string."""
    good = {"host": HOST, "config_id": cfg["config_id"], "method": cfg["method"],
            "method_params": cfg["method_params"], "tp": cfg["tp"], "workload": "fib", "max_tokens": 128,
            "context_tokens": 0, "concurrency": 1, "rep": 0, "ok": True, "output_tok_s": 999.0}
    kinds = [json.dumps(good, sort_keys=True)[:50],
             json.dumps({k: v for k, v in good.items() if k != "workload"}, sort_keys=True),
             json.dumps({**good, "tp": str(cfg["tp"])}, sort_keys=True)]
    return [kinds[i % len(kinds)] for i in range(count)]


def write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def build(run_dir: Path, rows: int, damaged: int, seed: int = 1, packed: bool = False) -> Dict[str, Any]:
    """Writes the run; returns what it holds."""
    cell_list, cfgs = cells(), configs(packed)
    reps = repetitions(rows, cfgs, cell_list)
    rng = random.Random(seed)
    write_json(run_dir / "run.json", {"run_id": run_dir.name, "started_at": "2026-12-01T10:00:00+00:00",
                                      "finished_at": "2026-12-02T10:00:00+00:00", "project_version": "scale",
                                      "suite": "scale", "schema_version": 1, "hosts": [HOST]})
    host_dir = run_dir / HOST
    write_json(host_dir / "host.json", {"host": HOST, "hostname": HOST, "gpus": {"count": 4, "devices": [
        {"name": "NVIDIA H200", "memory_total_mib": 143771}] * 4}, "engine": {"name": ENGINE, "version": "0.5.10"}})
    written = bad = 0
    damaged_in = cfgs[1]["config_id"]
    for cfg in cfgs:
        d = host_dir / cfg["config_id"]
        d.mkdir(parents=True)
        failed = cfg["config_id"] == FAILED
        cfg_cells = [{**c, "repetitions": reps.get((cfg["config_id"], i), 0)} for i, c in enumerate(cell_list)]
        command = ["python", "-m", "sglang.launch_server", "--model-path", f"/models/{MODEL}", "--tp",
                   str(cfg["tp"]), *cfg["server_args"]]
        write_json(d / "config.json", {
            "config_id": cfg["config_id"], "phase": cfg["phase"], "host": HOST, "engine": ENGINE,
            "engine_version": "0.5.10", "model": {"name": MODEL, "path": f"/models/{MODEL}", "revision": None,
                                                  "max_model_len": 32768},
            "draft_model": None if cfg["method"] in ("autoregressive", "ngram") else {"name": f"{MODEL}-draft"},
            "method": cfg["method"], "method_params": cfg["method_params"], "tp": cfg["tp"],
            "server_args": cfg["server_args"], "sampling": {"temperature": 0, "ignore_eos": True},
            "warmup_max_tokens": 16, "cells": cfg_cells,
            "requests": sum(c["repetitions"] * c["concurrency"] for c in cfg_cells), "command": command,
            "environment": cfg["environment"], **({"pack_check_of": cfg["pack_check_of"]} if "pack_check_of" in cfg
                                                  else {})})
        n = n_ok = 0
        clock = [0.0]
        if not failed:
            with (d / "requests.jsonl").open("w") as f:
                buf: List[str] = []
                for rep, i in order(cfg_cells, rng):  # round by round, each round shuffled, as the agent runs
                    for r in burst_rows(cfg, cell_list[i], rep, rng, clock):
                        buf.append(json.dumps(r, sort_keys=True) + "\n")
                        n += 1
                        n_ok += r["ok"]
                    if len(buf) > 20000:
                        f.write("".join(buf))
                        buf.clear()
                    if cfg["config_id"] == damaged_in and n == cell_list[i]["concurrency"]:
                        buf += [line + "\n" for line in damaged_lines(cfg, damaged)]
                        bad += damaged
                f.write("".join(buf))
        written += n
        status = {"config_id": cfg["config_id"], "status": "failed" if failed else "ok",
                  "reason": "oom" if failed else None,
                  "detail": "CUDA out of memory while loading the draft" if failed else None,
                  "config_digest": f"digest-{cfg['config_id']}", "log_tail": "", "started_at":
                  "2026-12-01T10:00:00+00:00", "finished_at": "2026-12-01T11:00:00+00:00",
                  "ready_s": None if failed else 55.0, "requests": n, "requests_ok": n_ok, "port": 30000,
                  "timed_s": round(clock[0], 3), "stop_s": 3.0, "wall_s": round(clock[0] + 80.0, 3),
                  "counters": {"verdict": "ok"}, "order_seed": 7, **(packing(cfgs, cfg) if packed else {})}
        write_json(d / "status.json", status)
        (d / "server.log").write_text("INFO The server is fired up and ready to roll!\n")
    return {"rows": written, "damaged": bad, "configs": len(cfgs), "cells": len(cell_list),
            "bytes": sum(p.stat().st_size for p in run_dir.rglob("requests.jsonl"))}


def time_report(run_dir: Path, fmt: str, save: Path | None) -> Tuple[float, float, int, str]:
    """One `report` process: its wall seconds, its CPU seconds (user + system), the warnings it printed and the
    size of its output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "collector", "report", str(run_dir), "--format", fmt], cwd=REPO,
                         capture_output=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    if res.returncode != 0:
        raise SystemExit(f"report --format {fmt} failed ({res.returncode}):\n{res.stderr.decode()[-2000:]}")
    if save is not None:
        save.mkdir(parents=True, exist_ok=True)
        (save / f"report.{fmt}").write_bytes(res.stdout)
        (save / f"report.{fmt}.stderr").write_bytes(res.stderr)
    warnings = res.stderr.decode().count("warning: ")
    return wall, cpu, warnings, f"{len(res.stdout) / 1e6:.1f} MB"


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000, help="request rows in the run (default 1,000,000)")
    p.add_argument("--damaged", type=int, default=3, help="broken lines added (default 3)")
    p.add_argument("--packed", action="store_true", help="packed phases: slots, neighbours and a pack check each")
    p.add_argument("--out", help="build the run here (a new folder; kept); default: a temporary folder")
    p.add_argument("--reuse", action="store_true", help="time the run already at --out instead of building it")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per format (default 3)")
    p.add_argument("--formats", default="md,csv,json")
    p.add_argument("--keep", action="store_true", help="keep the temporary run")
    p.add_argument("--save-outputs", help="write each format's output (and stderr) into this folder")
    args = p.parse_args(argv)
    tmp = None
    if args.out:
        run_dir = Path(args.out)
    else:
        tmp = Path(tempfile.mkdtemp(prefix="report-scale-"))
        run_dir = tmp / "run-scale"
    try:
        if args.reuse:
            if not (run_dir / "run.json").exists():
                raise SystemExit(f"--reuse: no run at {run_dir}")
            files = list(run_dir.rglob("requests.jsonl"))
            print(f"run {run_dir}: reused, {sum(p.stat().st_size for p in files) / 1e6:.0f} MB of requests.jsonl")
        else:
            if run_dir.exists():
                raise SystemExit(f"{run_dir} exists; give a new folder, or --reuse")
            t0 = time.perf_counter()
            facts = build(run_dir, args.rows, args.damaged, packed=args.packed)
            print(f"built {run_dir} in {time.perf_counter() - t0:.0f} s: {facts['rows']:,} request rows "
                  f"(+{facts['damaged']} damaged lines) in {facts['configs']} configs x {facts['cells']} cells, "
                  f"{facts['bytes'] / 1e6:.0f} MB of requests.jsonl")
        if args.repeat < 1:
            return 0
        save = Path(args.save_outputs) if args.save_outputs else None
        print(f"python -m collector report RUN --format FMT, end to end, {args.repeat} runs each "
              f"(target <= {TARGET_S:g} s wall; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} "
              "at the start: other work on the machine slows the wall figures, not the CPU ones as much)")
        print(f"{'format':7} {'best_s':>7} {'median_s':>9} {'cpu_best_s':>10} {'runs_s':24} {'output':>9} "
              f"{'warnings':>8}  verdict")
        worst = 0.0
        for fmt in args.formats.split(","):
            walls, cpus, warnings, size = [], [], 0, ""
            for _ in range(args.repeat):
                wall, cpu, warnings, size = time_report(run_dir, fmt, save)
                walls.append(wall)
                cpus.append(cpu)
            best, median = min(walls), statistics.median(walls)
            worst = max(worst, median)
            runs = ", ".join(f"{w:.2f}" for w in walls)
            print(f"{fmt:7} {best:7.2f} {median:9.2f} {min(cpus):10.2f} {runs:24} {size:>9} {warnings:8d}  "
                  f"{'ok' if median <= TARGET_S else 'OVER TARGET'}", flush=True)
        print(f"load average at the end: {os.getloadavg()[0]:.2f}")
        return 0 if worst <= TARGET_S else 1
    finally:
        if tmp is not None and not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp is not None:
            print(f"kept {run_dir}")


if __name__ == "__main__":
    sys.exit(main())

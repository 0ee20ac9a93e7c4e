"""Agreement with vLLM's own benchmark client: does specfleet's client measure what `vllm bench serve` measures?

One embedded vLLM CPU server (the engine in .cache/engine-venv, the tiny model in .cache/models/target, launched
with the flags and environment of host_vars/local.yml through agent.server's lifecycle) is measured by both
clients on the suite's prompts (agent.workloads, in turn), with the same max_tokens, ignore_eos and
temperature 0, at each concurrency. The clients alternate unit by unit (a unit is one burst of `concurrency`
requests released together, as agent.measure sends them): specfleet then vLLM, then vLLM then specfleet, and so
on, both on the same prompt within a pair, so drift and load from other programs fall on both alike.
Alternation matters on this machine: the unit that directly follows another unit of the same client (the first
of each pair in this order) tended to have the higher TTFT, whichever client it was: specfleet/vLLM TTFT was 1.44
over the pairs specfleet began and 0.70 over those vLLM began (concurrency 1, 370 pairs), 2.6 and 0.33 at
concurrency 4 (0.25 s pauses, 124 pairs); an untimed specfleet request before every pair made specfleet's TTFT
1.21 [1.03, 1.41] of vLLM's (256 pairs). Equal turns cancel the effect on average; it widens the interval.

vLLM's side calls the request function `vllm bench serve --backend vllm` uses
(vllm.benchmarks.lib.endpoint_request_func) from a small driver run by the engine's Python
(benchmarks/vllm_client.py). Running the `vllm bench serve` command once per unit instead would start a new
process (~5 s of imports) and a warm-up request each time, so whole-run figures would carry its start-up and
the two clients could not alternate request by request. Each vLLM request body is what `vllm bench serve
--ignore-eos --temperature 0` sends, plus a fresh `cache_salt` per request as specfleet sends one: without
it vLLM's repeated prompts would be answered from the prefix cache and the two clients would time different
server work. specfleet's body is agent.engines' own (it also asks for `return_token_ids`).

Definitions (tokens are the server's `usage.completion_tokens` for both; nothing is re-tokenized):
  TTFT        specfleet: request sent -> first chunk with a token or text.  vLLM: request sent -> first chunk
              with `choices` (text may be empty). The same chunk for a completions stream.
  per request output tok/s  completion_tokens / request latency, averaged over the unit's requests.
              specfleet's latency ends at the last `data:` line ([DONE], after the usage chunk); vLLM's at the
              last chunk with `choices`, one or two chunks earlier: vLLM's figure is slightly higher.
              specfleet reports this figure; `vllm bench serve` does not print it (it prints TPOT).
  unit output tok/s  the unit's tokens / its wall time, as `vllm bench serve` computes "Output token
              throughput" for a run (total output tokens / benchmark duration). specfleet: from starting the
              unit's threads to joining them (agent.measure.burst); vLLM: before the asyncio tasks are created to
              after the last returned. At concurrency 1 it differs from per request tok/s by the client's own
              overhead. `vllm bench serve --max-concurrency 4` keeps 4 requests in flight over a whole run rather
              than releasing bursts, so its run figure also lacks each burst's tail, where fewer than 4 run.
  Each figure is averaged over the units; the ratio is specfleet / vLLM of those means, with a 95% interval
  over the paired units (delta method on the log ratio, paired: t with n-1 degrees of freedom). "agree" means
  the interval lies inside 0.98-1.02, "differ" that it lies outside, "unresolved" that it is wider.

Stalls. On a machine of few cores a spinning engine thread starves whatever shares its core: with vLLM's CPU
worker bound to core 0, a bare `python -c` pinned there took 21.9 s to finish against 0.35 s on core 1. A client
or API server that waits for a starved core sees the first chunk late, often with the whole response (a lump:
the first chunk after 90% of the request's time), so TTFT turns bimodal and its mean cannot resolve 2%.
`--engine-core 0` gives the engine's compute (vLLM's worker process, bound by VLLM_CPU_OMP_THREADS_BIND) core 0
alone and moves every other thread of the server, and both clients, to the other cores. On 2 idle cores, 250
pairs at each concurrency, no lump: TTFT 0.9831 [0.9809, 0.9854] at concurrency 1 (33.6 against 34.2 ms) and
0.9838 [0.9815, 0.9861] at 4, output tok/s within 0.1%. The run before it, also isolated, had a lump of ~760 ms
in one pair at each concurrency: TTFT 0.9842 [0.9742, 0.9942] and 1.0083 [0.9569, 1.0624]. Sharing the cores
(VLLM_CPU_OMP_THREADS_BIND=0 alone), 5 of 200 requests were above 60 ms. The table counts lumps and, where a pair
has one, adds the TTFT of the pairs without.

specfleet's TTFT is ~0.6 ms (1.7%) lower at both concurrencies. Both clocks start before the request is built
and stop on the first chunk with a token; the difference is each client's own work in between: against
benchmarks/null_server.py (`--null-pairs`), with both cores free, specfleet's client took 0.50 ms and vLLM's
(aiohttp on asyncio) 0.94 ms to its first chunk at concurrency 1.

Usage (after `make engine models`, on an otherwise idle machine; a pair took ~1.4 s at concurrency 1 and ~2 s at
concurrency 4, and the server ~30 s to start):
  .venv/bin/python benchmarks/agreement.py [--pairs 400] [--concurrency 1 4] [--max-tokens 256] [--budget-s S]
                                            [--gap-s 0] [--out rows.jsonl] [--engine-core N] [--null-pairs K]
                                            [--server-env KEY=VALUE ...]
  .venv/bin/python benchmarks/agreement.py --report rows.jsonl [more.jsonl ...]   # the table from saved rows
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml
from scipy import stats

from agent import workloads
from agent.config_run import server_env
from agent.engines import ENGINES
from agent.engines import PORT as PORT_PLACEHOLDER
from agent.leftovers import MARK
from agent.measure import Endpoint, burst
from agent.server import ProcessServer, become_subreaper, free_port
from collector.stats import mean_std

ROOT = Path(__file__).resolve().parents[1]
ENGINE_PYTHON = ROOT / ".cache/engine-venv/bin/python"
VLLM_DRIVER = ROOT / "benchmarks/vllm_client.py"
TOLERANCE = 0.02
FIGURES = (("tok_s", "output tok/s, per request"), ("unit_tok_s", "output tok/s, per unit"),
           ("ttft_ms", "mean TTFT, ms"))


# -- the interval -------------------------------------------------------------------------------------------
def paired_ratio_ci(a: Sequence[float], b: Sequence[float],
                    level: float = 0.95) -> Tuple[Optional[float], Optional[float], Optional[float]]:
    """mean(a)/mean(b) and its interval for paired samples (a[i], b[i]): delta method on the log ratio,
    log R ~ mean(a_i/ma - b_i/mb), so what pairs share (drift, another program's load) cancels."""
    if len(a) != len(b):
        raise ValueError("paired samples need equal lengths")
    ma, _ = mean_std(a)
    mb, _ = mean_std(b)
    if ma is None or mb is None or ma <= 0 or mb <= 0:
        return None, None, None
    ratio = ma / mb
    _, sd = mean_std([x / ma - y / mb for x, y in zip(a, b)])
    if sd is None:
        return ratio, None, None
    half = float(stats.t.ppf(0.5 + level / 2, len(a) - 1)) * sd / math.sqrt(len(a))
    return ratio, ratio * math.exp(-half), ratio * math.exp(half)


def verdict(lo: Optional[float], hi: Optional[float], tol: float = TOLERANCE) -> str:
    """Whether the interval resolves |ratio - 1| < tol: inside, outside, or neither."""
    if lo is None or hi is None:
        return "unresolved"
    if 1 - tol < lo and hi < 1 + tol:
        return "agree"
    if hi < 1 - tol or lo > 1 + tol:
        return "differ"
    return "unresolved"


# -- the server, as the demo configures it ------------------------------------------------------------------
def _render(value: Any, names: Dict[str, str]) -> Any:
    if isinstance(value, str):
        for name, repl in names.items():
            value = value.replace("{{ " + name + " }}", repl)
        return value
    if isinstance(value, list):
        return [_render(v, names) for v in value]
    if isinstance(value, dict):
        return {k: _render(v, names) for k, v in value.items()}
    return value


def demo_server(work: Path, extra_env: Dict[str, str],
                cpus: Optional[str] = None) -> Tuple[ProcessServer, Dict[str, Any]]:
    """The autoregressive server of host_vars/local.yml (its flags and environment, `extra_env` over it),
    caches under `work`, started by taskset on `cpus` when given."""
    hv = yaml.safe_load((ROOT / "host_vars/local.yml").read_text())
    hv = _render(hv, {"specfleet_root": str(ROOT), "bench_host_dir": str(work)})
    cfg = {"model": hv["bench_model"], "tp": 1, "server_args": hv["bench_server_args"], "method": "autoregressive",
           "method_params": {}, "env": {**{k: str(v) for k, v in hv["bench_env"].items()}, **extra_env}}
    for key in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TMPDIR", "VLLM_RPC_BASE_PATH"):
        Path(cfg["env"][key]).mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [str(port) if a == PORT_PLACEHOLDER else a
            for a in ENGINES["vllm"].launch_command(str(ENGINE_PYTHON), cfg, "127.0.0.1")]
    if cpus is not None:
        argv = ["taskset", "--cpu-list", cpus, *argv]
    env = {**server_env(cfg), MARK: f"agreement/{uuid.uuid4().hex[:12]}"}
    server = ProcessServer(argv, env, work / "server.log", port, stop_deadline_s=hv["bench_timeouts"]["stop_s"])
    return server, {**hv, "port": port}


def _tree(pid: int) -> List[int]:
    """`pid` and its descendants, from /proc."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
    return out


def isolate_compute(pid: int, core: int, rest: set) -> Tuple[int, int]:
    """Move every thread of the server's process tree off `core` except those the engine bound to it alone
    (its compute threads): (threads moved, threads left on `core`)."""
    moved = kept = 0
    for p in _tree(pid):
        for task in Path(f"/proc/{p}/task").glob("*"):
            tid = int(task.name)
            try:
                if os.sched_getaffinity(tid) == {core}:
                    kept += 1
                else:
                    os.sched_setaffinity(tid, rest)
                    moved += 1
            except OSError:  # the thread ended meanwhile
                pass
    return moved, kept


def _wait_listening(port: int, deadline_s: float) -> None:
    """Until something accepts connections on 127.0.0.1:`port`."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
            return
        except OSError:
            if time.monotonic() > end:
                raise RuntimeError(f"nothing listens on port {port} after {deadline_s:.0f} s") from None
            time.sleep(0.05)  # poll interval, not a wait for an event


# -- the two clients ----------------------------------------------------------------------------------------
@dataclass
class Unit:
    """One client's figures for one unit (a burst of `n` requests)."""

    tok_s: float
    unit_tok_s: float
    ttft_ms: float
    tokens: List[int]
    coalesced: int = 0  # requests whose first chunk came after 90% of their time: the stream arrived in a lump


def _unit(tokens: List[int], latencies: List[float], ttfts: List[float], wall_s: float) -> Unit:
    return Unit(tok_s=sum(t / e for t, e in zip(tokens, latencies)) / len(tokens), unit_tok_s=sum(tokens) / wall_s,
                ttft_ms=1000 * sum(ttfts) / len(ttfts), tokens=tokens,
                coalesced=sum(f >= 0.9 * e for f, e in zip(ttfts, latencies)))


def specfleet_unit(ep: Endpoint, cfg: Dict[str, Any], prompt: str, max_tokens: int, n: int, tag: str) -> Unit:
    rows, wall_s = burst(cfg, ep, prompt, max_tokens, n, tag)
    bad = [r["error"] for r in rows if not r["ok"]]
    if bad:
        raise RuntimeError(f"specfleet request failed: {bad[0]}")
    return _unit([r["completion_tokens"] for r in rows], [r["e2e_s"] for r in rows], [r["ttft_s"] for r in rows],
                 wall_s)


class VllmClient:
    """vLLM's request function in the engine's Python (benchmarks/vllm_client.py), one burst per call."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([str(ENGINE_PYTHON), str(VLLM_DRIVER)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)

    def unit(self, port: int, model: str, prompt: str, max_tokens: int, n: int, sampling: Dict[str, Any],
             tag: str) -> Unit:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        extra = [{"temperature": sampling["temperature"], "cache_salt": f"{tag}-{i}-{uuid.uuid4().hex[:8]}"}
                 for i in range(n)]
        cmd = {"url": f"http://127.0.0.1:{port}/v1/completions", "model": model, "prompt": prompt,
               "max_tokens": max_tokens, "n": n, "extra_body": extra}
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the vLLM client exited with code {self.proc.wait()}")
        out = json.loads(line)
        bad = [r["error"] for r in out["requests"] if not r["ok"]]
        if bad:
            raise RuntimeError(f"vLLM client request failed: {bad[0]}")
        reqs = out["requests"]
        return _unit([r["output_tokens"] for r in reqs], [r["latency_s"] for r in reqs], [r["ttft_s"] for r in reqs],
                     out["duration_s"])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- the run ------------------------------------------------------------------------------------------------
def pairs_at(n: int, pairs: int, budget_s: float, gap_s: float, max_tokens: int, ep: Endpoint, cfg: Dict[str, Any],
             vllm: VllmClient, rows_out: Optional[Any], server: str = "engine") -> List[Tuple[Unit, Unit]]:
    """`pairs` alternating units of both clients at concurrency `n`, the prompts in turn, `gap_s` of quiet before
    each unit; fewer when `budget_s` seconds have passed (always an even number, so each client went first
    equally often)."""
    names = workloads.known()
    out: List[Tuple[Unit, Unit]] = []
    t0 = time.monotonic()
    for i in range(pairs):
        if i % 2 == 0 and time.monotonic() - t0 > budget_s:
            break
        name = names[i % len(names)]
        prompt = workloads.PROMPTS[name]
        tag = f"c{n}-{i}"
        if i % 2 == 0:
            time.sleep(gap_s)
            a = specfleet_unit(ep, cfg, prompt, max_tokens, n, f"agree-{tag}")
            time.sleep(gap_s)
            b = vllm.unit(ep.port, cfg["model"]["name"], prompt, max_tokens, n, cfg["sampling"], f"vllm-{tag}")
        else:
            time.sleep(gap_s)
            b = vllm.unit(ep.port, cfg["model"]["name"], prompt, max_tokens, n, cfg["sampling"], f"vllm-{tag}")
            time.sleep(gap_s)
            a = specfleet_unit(ep, cfg, prompt, max_tokens, n, f"agree-{tag}")
        for u in (a, b):
            if any(t != max_tokens for t in u.tokens):
                raise RuntimeError(f"the server reported {u.tokens} completion tokens, not {max_tokens} each")
        out.append((a, b))
        if rows_out is not None:
            rows_out.write(json.dumps({"server": server, "concurrency": n, "max_tokens": max_tokens, "gap_s": gap_s,
                                       "pair": i, "workload": name, "first": "specfleet" if i % 2 == 0 else "vllm",
                                       "t_s": round(time.monotonic() - t0, 3),
                                       "specfleet": a.__dict__, "vllm": b.__dict__}) + "\n")
            rows_out.flush()
        if (i + 1) % 50 == 0 and server == "engine":
            print(f"  concurrency {n}: {i + 1}/{pairs} pairs, {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return out


def _row(label: str, a: Sequence[float], b: Sequence[float]) -> None:
    ratio, lo, hi = paired_ratio_ci(a, b)
    interval = f"[{lo:.4f}, {hi:.4f}]" if lo is not None and hi is not None else "-"
    print(f"  {label:26} {sum(a) / len(a):10.2f} {sum(b) / len(b):10.2f} "
          f"{ratio if ratio is not None else float('nan'):7.4f}  {interval:17} {verdict(lo, hi)}")


def _median(xs: Sequence[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def report(n: int, setting: str, got: List[Tuple[Unit, Unit]], null: Sequence[Tuple[Unit, Unit]] = ()) -> None:
    """The table for one concurrency; with `null` (the pairs against benchmarks/null_server.py) each client's TTFT
    there. It is not subtracted: the null server's own share differs by client (a thread per new connection for
    specfleet's client, which opens one per request; none for vLLM's, which keeps its connections open)."""
    print(f"\nconcurrency {n}: {len(got)} pairs ({len(got) * n} requests per client), {setting}")
    print(f"  {'figure':26} {'specfleet':>10} {'vLLM':>10} {'ratio':>7}  {'95% interval':17} |ratio-1| < 2%")
    for key, label in FIGURES:
        _row(label, [getattr(x, key) for x, _ in got], [getattr(y, key) for _, y in got])
    clean = [(x, y) for x, y in got if not x.coalesced and not y.coalesced]
    if 1 < len(clean) < len(got):
        _row("  pairs without a lump", [x.ttft_ms for x, _ in clean], [y.ttft_ms for _, y in clean])
        print(f"  ({len(got) - len(clean)} pairs left out: a stream whose first chunk came after 90% of its "
              f"time, {sum(x.coalesced for x, _ in got)} specfleet and {sum(y.coalesced for _, y in got)} vLLM "
              f"requests)")
    if null:
        own = [_median([u.ttft_ms for u in side]) for side in zip(*null)]
        print(f"  TTFT against benchmarks/null_server.py, which answers at once ({len(null)} pairs, median): "
              f"specfleet {own[0]:.2f} ms, vLLM {own[1]:.2f} ms")
    slow = [sum(u.ttft_ms > 40 for u in side) / len(got) for side in zip(*got)]
    median = [sorted(u.ttft_ms for u in side)[len(got) // 2] for side in zip(*got)]
    print(f"  TTFT of a unit above 40 ms: specfleet {100 * slow[0]:.0f}%, vLLM {100 * slow[1]:.0f}% of units; "
          f"median unit TTFT {median[0]:.1f} and {median[1]:.1f} ms")


def report_rows(paths: Sequence[Path]) -> None:
    """The table again from rows written with --out, pooled over runs (pairs stay within their run)."""
    rows = [{**json.loads(line), "run": str(path)} for path in paths for line in path.read_text().splitlines()
            if line.strip()]
    for n in sorted({r["concurrency"] for r in rows}):
        mine = [r for r in rows if r["concurrency"] == n and r.get("server", "engine") == "engine"]
        null = [r for r in rows if r["concurrency"] == n and r.get("server") == "null"]
        settings = sorted({f"max_tokens {r['max_tokens']}, {r['gap_s']:g} s before each unit" for r in mine})
        report(n, f"{len({r['run'] for r in mine})} run(s): {'; '.join(settings)}",
               [(Unit(**r["specfleet"]), Unit(**r["vllm"])) for r in mine],
               [(Unit(**r["specfleet"]), Unit(**r["vllm"])) for r in null])


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=400, help="alternating pairs of units per concurrency")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--gap-s", type=float, default=0.0, help="quiet before each unit")
    p.add_argument("--budget-s", type=float, default=float("inf"), help="stop a concurrency's pairs after this")
    p.add_argument("--out", type=Path, help="also write every pair's figures here (JSON lines)")
    p.add_argument("--report", type=Path, nargs="+", help="no run: the table from these --out files, pooled")
    p.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE",
                   help="an environment variable for the server, over host_vars/local.yml's (repeatable)")
    p.add_argument("--engine-core", type=int, metavar="N",
                   help="the engine's compute alone on core N (VLLM_CPU_OMP_THREADS_BIND=N); the API server, the "
                        "engine's other threads and both clients on the other cores")
    p.add_argument("--null-pairs", type=int, default=0,
                   help="also this many pairs per concurrency against benchmarks/null_server.py, first")
    p.add_argument("--work", type=Path, default=ROOT / ".work/agreement", help="server log and caches")
    args = p.parse_args(argv)
    if args.report:
        report_rows(args.report)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # leave through the server's stop
    become_subreaper()
    env = dict(kv.split("=", 1) for kv in args.server_env)
    every = os.sched_getaffinity(0)
    rest = every - {args.engine_core}
    if args.engine_core is not None:
        if args.engine_core not in every or not rest:
            p.error(f"--engine-core {args.engine_core}: needs a core of {sorted(every)} and another beside it")
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(args.engine_core)
        os.sched_setaffinity(0, rest)  # this process and the vLLM client driver it starts
    server, hv = demo_server(args.work, env, ",".join(map(str, sorted(every))) if args.engine_core is not None
                             else None)
    sampling = hv["bench_sampling"]
    cfg = {"timeouts": {"request_s": hv["bench_timeouts"]["request_s"]}, "model": hv["bench_model"],
           "sampling": sampling}
    ep = Endpoint(ENGINES["vllm"], hv["port"])
    vllm = VllmClient()
    null_port = free_port()
    null_server = None
    if args.null_pairs:
        null_server = subprocess.Popen([sys.executable, str(ROOT / "benchmarks/null_server.py"), str(null_port)])
        _wait_listening(null_port, 30.0)
    rows_out = args.out.open("w") if args.out else None
    print(__doc__[__doc__.index("Definitions"):__doc__.index("Usage")].rstrip())
    try:
        with server:
            ready = server.wait_ready(ENGINES["vllm"].health_path, hv["bench_timeouts"]["health_s"])
            print(f"\nserver ready in {ready:.1f} s on port {hv['port']} ({' '.join(server.argv[1:4])} ...)")
            if args.engine_core is not None and server.pid is not None:
                moved, kept = isolate_compute(server.pid, args.engine_core, rest)
                print(f"engine compute on core {args.engine_core} ({kept} threads); {moved} other server threads "
                      f"and the clients on {','.join(map(str, sorted(rest)))}")
            for n in args.concurrency:  # warm both clients and the server at this concurrency, untimed
                specfleet_unit(ep, cfg, workloads.PROMPTS["fib"], 16, n, f"warm-c{n}")
                vllm.unit(ep.port, cfg["model"]["name"], workloads.PROMPTS["fib"], 16, n, sampling, f"vwarm-c{n}")
                null = [] if not args.null_pairs else pairs_at(n, args.null_pairs, float("inf"), 0.0, args.max_tokens,
                                Endpoint(ENGINES["vllm"], null_port), cfg, vllm, rows_out, server="null")
                got = pairs_at(n, args.pairs, args.budget_s, args.gap_s, args.max_tokens, ep, cfg, vllm, rows_out)
                report(n, f"max_tokens {args.max_tokens}, ignore_eos, temperature 0, {args.gap_s:g} s before each "
                          f"unit", got, null)
                sys.stdout.flush()
    finally:
        vllm.close()
        if null_server is not None:
            null_server.terminate()
            null_server.wait()
        if rows_out is not None:
            rows_out.close()
    print(f"\nserver stopped in {server.stop_s:.1f} s{'; ' + server.stop_error if server.stop_error else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

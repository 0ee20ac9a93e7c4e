"""The embedded engine's OpenMP wait policy: spinning (the default) against sleeping (OMP_WAIT_POLICY=PASSIVE).

The embedded default (host_vars/local.yml) serves a tiny model with vLLM's CPU build on a machine of two cores,
where the client, the API server and the engine's compute share those cores with whatever else runs. Each pair
runs the same suite twice through `bench.yml -l local` (the real engine, the local host's own flags and
environment, its own host folder): a baseline and an n-gram config, two workloads, contexts 0 and 512,
concurrency 1 and 4, 128 tokens, three repetitions (60 timed requests a config), once with the default wait policy
and once with PASSIVE, in alternating order. `--busy N` keeps N other processes spinning meanwhile (a stand-in for
a second program on the machine). Printed per pair: each config's timed seconds (status.json `timed_s`) under
both policies and their ratio, PASSIVE / default.

    .venv/bin/python -m benchmarks.engine_wait_policy [--pairs 3] [--busy 1]    (from the repository's root)
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import tempfile
from pathlib import Path
from typing import Any

import yaml

from tests.playbooks.conftest import Bench, reduced_matrix

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ("tp1-autoregressive", "tp1-ngram-k2")


def spin() -> None:
    while True:
        pass


def timed(policy: str | None) -> dict[str, float]:
    """One suite with the local host's environment (OMP_WAIT_POLICY set to `policy`, or left out); timed_s by
    config."""
    env: dict[str, Any] = dict(yaml.safe_load((ROOT / "host_vars/local.yml").read_text())["bench_env"])
    env.pop("OMP_WAIT_POLICY", None)
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    with tempfile.TemporaryDirectory(prefix="sf-") as tmp:
        bench = Bench(Path(tmp))
        extra = {**reduced_matrix([{"method": "autoregressive"}, {"method": "ngram", "num_speculative_tokens": 2}],
                                  workloads=["fib", "json"], max_tokens=[128], context_tokens=[0, 512],
                                  concurrency=[1, 4]),
                 "bench_repetitions": 3, "bench_env": env, "run_id": "wait-policy"}
        res = bench.run(extra, timeout=1800)
        if res.returncode != 0:
            raise SystemExit(res.stdout[-3000:])
        host = bench.results / "wait-policy" / "local"
        return {cid: json.loads((host / cid / "status.json").read_text())["timed_s"] for cid in CONFIGS}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=3, help="alternated pairs (at least 3)")
    ap.add_argument("--busy", type=int, default=1, help="other processes spinning meanwhile (0: a quiet machine)")
    args = ap.parse_args()
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for p in spinners:
        p.start()
    ratios: dict[str, list[float]] = {cid: [] for cid in CONFIGS}
    try:
        print(f"{args.busy} busy process(es); timed seconds of 60 requests per config")
        for k in range(max(args.pairs, 3)):
            order = ["default", "PASSIVE"] if k % 2 == 0 else ["PASSIVE", "default"]
            got = {policy: timed(None if policy == "default" else policy) for policy in order}
            for cid in CONFIGS:
                ratios[cid].append(got["PASSIVE"][cid] / got["default"][cid])
                print(f"pair {k + 1} {cid:<20} default {got['default'][cid]:7.1f} s  PASSIVE "
                      f"{got['PASSIVE'][cid]:7.1f} s  ratio {ratios[cid][-1]:.2f}", flush=True)
    finally:
        for p in spinners:
            p.terminate()
    for cid, values in ratios.items():
        print(f"{cid}: PASSIVE / default timed_s, mean {statistics.mean(values):.2f} "
              f"(min {min(values):.2f}, max {max(values):.2f}, {len(values)} pairs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

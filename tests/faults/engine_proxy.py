"""Run as the engine's Python: a fault-injecting HTTP proxy in front of the real engine.

`<engine python> engine_proxy.py -m vllm.entrypoints.openai.api_server ... --port P` starts the real
engine on a free port and serves P itself, forwarding every request, except that completions
requests chosen by SPECFLEET_FAULTS (e.g. `http_error=3,malformed=4`: every 3rd gets an HTTP 500,
every 4th has a stream chunk cut in half; `alter_usage=2`: every 2nd reports one completion token more in its
usage than the engine produced; the first, the warmup, is always passed through) are answered wrongly.
Without SPECFLEET_FAULTS, or for any other invocation (`--help`, `-c ...`), it
is the real Python. Both processes share the agent's process group, so stopping one stops both.
"""
from __future__ import annotations

import http.client
import itertools
import json
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMPLETIONS = "/v1/completions"


def faults() -> dict[str, int]:
    spec = os.environ.get("SPECFLEET_FAULTS", "")
    return {k: int(v) for k, v in (item.split("=", 1) for item in spec.split(",") if "=" in item)}


def main(argv: list[str]) -> None:
    rules = faults()
    if not rules or "--port" not in argv:
        os.execv(sys.executable, [sys.executable, *argv])
    i = argv.index("--port")
    port = int(argv[i + 1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        inner = s.getsockname()[1]
    engine = subprocess.Popen([sys.executable, *argv[:i + 1], str(inner), *argv[i + 2:]])
    counter = itertools.count(1)
    lock = threading.Lock()

    class Proxy(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # close-delimited bodies: streams pass through line by line

        def log_message(self, fmt: str, *args: object) -> None:
            sys.stderr.write(f"[fault-proxy] {fmt % args}\n")

        def _forward(self, method: str, fault: str | None = None) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if method == "POST" else None
            conn = http.client.HTTPConnection("127.0.0.1", inner, timeout=600)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(method, self.path, body, headers)
                resp = conn.getresponse()
            except OSError as exc:
                self.send_error(503, f"engine not reachable: {exc}")
                return
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(k, v)
            self.end_headers()
            data_lines = 0
            while True:
                line = resp.readline()
                if not line:
                    break
                if fault == "malformed" and line.startswith(b"data: {"):
                    data_lines += 1
                    if data_lines == 2:
                        line = line[: len(line) // 2] + b"\n"
                if fault == "alter_usage" and line.startswith(b"data: {") and b'"usage"' in line:
                    obj = json.loads(line[6:])
                    if isinstance(obj.get("usage"), dict) and obj["usage"].get("completion_tokens") is not None:
                        obj["usage"]["completion_tokens"] += 1
                        line = b"data: " + json.dumps(obj).encode() + b"\n"
                self.wfile.write(line)
                self.wfile.flush()
            conn.close()

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            self._forward("GET")

        def do_POST(self) -> None:  # noqa: N802
            fault = None
            if self.path == COMPLETIONS:
                with lock:
                    n = next(counter)
                if n > 1 and "http_error" in rules and n % rules["http_error"] == 0:
                    self.rfile.read(int(self.headers.get("Content-Length") or 0))
                    payload = b'{"error": {"message": "injected fault: internal server error", "code": 500}}'
                    self.send_response(500)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(payload)
                    self.log_message("request %d: injected HTTP 500", n)
                    return
                if n > 1 and "malformed" in rules and n % rules["malformed"] == 0:
                    fault = "malformed"
                    self.log_message("request %d: injected malformed chunk", n)
                elif n > 1 and "alter_usage" in rules and n % rules["alter_usage"] == 0:
                    fault = "alter_usage"
                    self.log_message("request %d: usage altered by one token", n)
            self._forward("POST", fault)

    server = ThreadingHTTPServer(("127.0.0.1", port), Proxy)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    os._exit(engine.wait())


if __name__ == "__main__":
    main(sys.argv[1:])

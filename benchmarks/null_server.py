"""A server that answers a streamed `/v1/completions` request at once: the reference for a client's own time.

Every request gets `max_tokens` chunks of one token each, shaped as vLLM's OpenAI server streams them, then the
usage chunk and `[DONE]`, written as fast as the socket takes them (HTTP/1.1, chunked, keep-alive). A client's
time to first chunk against it is about the client's own part of every TTFT it reports (building and sending the
request, the loopback round trip, parsing the first chunk) plus this server's, which is not the same for every
client: a new connection costs it a thread. `benchmarks/agreement.py --null-pairs K` measures both clients
against it and prints the figures beside the engine's.

Usage: python benchmarks/null_server.py PORT   (binds 127.0.0.1; runs until killed)
"""
from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _chunk(obj: object) -> bytes:
    data = f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # as uvicorn: each chunk leaves at once (else a delayed ACK holds it ~40 ms)

    def do_POST(self) -> None:  # noqa: N802 - the name http.server dispatches to
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        n = int(body.get("max_tokens", 1))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        base = {"id": "cmpl-null", "object": "text_completion", "created": 0, "model": body.get("model", "null")}
        for i in range(n):
            self.wfile.write(_chunk({**base, "choices": [{"index": 0, "text": " x", "logprobs": None,
                                                          "finish_reason": "length" if i == n - 1 else None,
                                                          "token_ids": [1]}], "usage": None}))
            if i == 0:
                self.wfile.flush()
        self.wfile.write(_chunk({**base, "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": n,
                                                                  "total_tokens": n + 1}}))
        self.wfile.write(_chunk("[DONE]"))
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's signature
        pass


if __name__ == "__main__":
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()

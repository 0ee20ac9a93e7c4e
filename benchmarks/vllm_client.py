"""vLLM's own benchmark client, one burst at a time: the half of `benchmarks/agreement.py` that runs in the
engine's virtualenv (vLLM is importable there only).

It sends requests with the function `vllm bench serve --backend vllm --endpoint /v1/completions` uses
(`vllm.benchmarks.lib.endpoint_request_func.ASYNC_REQUEST_FUNCS["vllm"]`) over an aiohttp session set up as
`vllm bench serve` sets up its own (a connection pool limited to the concurrency, keep-alive), and times a
burst as `vllm bench serve` times a run: from before the requests are created to after the last one returned.

Protocol: one JSON object per line on stdin, {"url", "model", "prompt", "max_tokens", "n", "extra_body":
[one per request]}; one JSON line per burst on stdout, {"duration_s", "requests": [{"ok", "ttft_s",
"latency_s", "output_tokens", "error"}]}. Not meant to be run by hand.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any, Dict, Optional

import aiohttp
from vllm.benchmarks.lib.endpoint_request_func import ASYNC_REQUEST_FUNCS, RequestFuncInput

REQUEST_FUNC = ASYNC_REQUEST_FUNCS["vllm"]


def _session(limit: int) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit, ttl_dns_cache=300, use_dns_cache=True,
                                     keepalive_timeout=60, enable_cleanup_closed=True, force_close=False, ssl=False)
    return aiohttp.ClientSession(connector=connector, trust_env=True,
                                 timeout=aiohttp.ClientTimeout(total=6 * 60 * 60))


async def burst(session: aiohttp.ClientSession, cmd: Dict[str, Any]) -> Dict[str, Any]:
    inputs = [RequestFuncInput(prompt=cmd["prompt"], api_url=cmd["url"], prompt_len=0, output_len=cmd["max_tokens"],
                               model=cmd["model"], ignore_eos=True, extra_body=extra)
              for extra in cmd["extra_body"]]
    start = time.perf_counter()
    tasks = [asyncio.create_task(REQUEST_FUNC(request_func_input=i, session=session)) for i in inputs]
    outputs = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    return {"duration_s": duration, "requests": [
        {"ok": o.success, "ttft_s": o.ttft, "latency_s": o.latency, "output_tokens": o.output_tokens,
         "error": o.error[-300:] or None} for o in outputs]}


async def main() -> None:
    session: Optional[aiohttp.ClientSession] = None
    limit = 0
    loop = asyncio.get_running_loop()
    try:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            cmd = json.loads(line)
            if session is None or cmd["n"] != limit:  # one session per concurrency, as one `vllm bench serve` run
                if session is not None:
                    await session.close()
                limit = cmd["n"]
                session = _session(limit)
            sys.stdout.write(json.dumps(await burst(session, cmd)) + "\n")
            sys.stdout.flush()
    finally:
        if session is not None:
            await session.close()


if __name__ == "__main__":
    asyncio.run(main())

"""The stand-in engine's vLLM dialect against the real CPU engine: the same argv (rendered by the agent for an
n-gram config), the same requests, and the answers compared by shape: the field names of every kind of stream chunk
in order and their types, the usage and per-request speculative fields, the /tokenize answer, the health status, and
the /metrics samples the agent reads (names and label keys). One real server serves the whole module. When vLLM
changes what it sends, a test here fails, not a fault test that runs on the stand-in.
"""
from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from agent.counters import SAMPLE
from agent.engines import ENGINES, PORT
from agent.server import free_port
from tests.conftest import ROOT, short_tmp
from tests.standin import ENGINE as STANDIN_ENGINE
from tests.standin import write_python
from tests.standin.engine import VLLM as STANDIN_VLLM

pytestmark = [pytest.mark.slow, pytest.mark.engine]

ENGINE_PY = ROOT / ".cache/engine-venv/bin/python"
MODELS = ROOT / ".cache/models"
ENGINE = ENGINES["vllm"]
CONFIG = {"model": {"name": "tiny-llama", "path": str(MODELS / "target")}, "tp": 1, "method": "ngram",
          "method_params": {"num_speculative_tokens": 2},
          "server_args": ["--dtype", "bfloat16", "--max-model-len", "1024", "--enforce-eager"]}
REQUEST = ENGINE.request("tiny-llama", "def fib(n): return n if n < 2 else fib(n - 1) + fib(n - 2)", 12,
                         {"temperature": 0.0, "ignore_eos": True}, "contract")


def shape(value: Any) -> Any:
    """Field names in order and types, values left out (a list: the shape of its first item)."""
    if isinstance(value, dict):
        return [(k, shape(v)) for k, v in value.items()]
    if isinstance(value, list):
        return ["list", shape(value[0]) if value else None]
    return type(value).__name__


class Served:
    """One server (real or stand-in) started from the agent's argv for CONFIG, its log in `log`."""

    def __init__(self, python: Path, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        argv = [str(a).replace(PORT, str(self.port)) for a in ENGINE.launch_command(str(python), CONFIG, "127.0.0.1")]
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CACHE_ROOT": str(folder / "cache"),
               "TMPDIR": str(folder), "VLLM_RPC_BASE_PATH": str(folder), "HF_HUB_OFFLINE": "1",
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "OMP_WAIT_POLICY": "PASSIVE"}
        self.log = folder / "server.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        end = time.monotonic() + 300
        while self.get("/health")[0] != 200:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() < end, "not healthy within 300 s"
            time.sleep(0.25)

    def get(self, path: str) -> Tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read().decode()
        except OSError:
            return 0, ""
        finally:
            conn.close()

    def post(self, path: str, body: Dict[str, Any]) -> Tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def chunks(self) -> List[Dict[str, Any]]:
        status, raw = self.post(ENGINE.generate_path, REQUEST)
        assert status == 200, raw[:500]
        lines = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
        assert lines[-1] == "[DONE]", lines[-3:]
        return [json.loads(line) for line in lines[:-1]]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture(scope="module")
def pair() -> Iterator[Tuple[Served, Served]]:
    if not ENGINE_PY.exists() or not (MODELS / "target/config.json").exists():
        pytest.fail("the CPU engine and tiny models are missing: run `make engine models` first")
    with short_tmp() as tmp:
        real = Served(ENGINE_PY, tmp / "real")
        try:
            standin = Served(write_python(tmp / "standin-python"), tmp / "standin")
            try:
                yield real, standin
            finally:
                standin.stop()
        finally:
            real.stop()


def kinds(chunks: List[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """One chunk of each kind: the first token, one in between, the one that finishes, the usage."""
    content = [c for c in chunks if c.get("choices")]
    return {"first": content[0], "middle": content[len(content) // 2], "finishing": content[-1],
            "usage": next(c for c in chunks if c.get("usage"))}


def test_stream_chunks_have_the_real_fields_in_order_and_types(pair: Tuple[Served, Served]) -> None:
    real, standin = (kinds(s.chunks()) for s in pair)
    for kind in real:
        assert shape(standin[kind]) == shape(real[kind]), (kind, json.dumps(real[kind]))
    assert real["finishing"]["choices"][0]["finish_reason"] == standin["finishing"]["choices"][0]["finish_reason"]


def test_usage_counts_agree_with_the_tokens_streamed(pair: Tuple[Served, Served]) -> None:
    """Both count the tokens they streamed in usage, and the per-request speculative summary adds up."""
    for served in pair:
        chunks = served.chunks()
        streamed = sum(len(ch["token_ids"]) for c in chunks for ch in c.get("choices") or [])
        usage = next(c["usage"] for c in chunks if c.get("usage"))
        assert usage["completion_tokens"] == streamed == REQUEST["max_tokens"], served.log
        spec = next(c for c in chunks if c.get("usage"))["metrics"]["speculative_decoding"]
        assert spec["num_accepted_draft_tokens"] <= spec["num_draft_tokens"]
        assert 1 <= spec["mean_acceptance_length"] <= 3  # 1 + at most the 2 drafted tokens


def test_tokenize_and_health_answer_alike(pair: Tuple[Served, Served]) -> None:
    answers = []
    for served in pair:
        status, raw = served.post("/tokenize", {"model": "tiny-llama", "prompt": "a b c", "add_special_tokens": True})
        assert status == 200
        answers.append(shape(json.loads(raw)))
        assert served.get(ENGINE.health_path)[0] == 200
    assert answers[1] == answers[0]


def samples(text: str) -> Dict[str, set]:
    """{metric name: its label keys} of a Prometheus text page."""
    out: Dict[str, set] = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m:
            labels = {kv.split("=", 1)[0] for kv in (m.group(2) or "{}")[1:-1].split(",") if kv}
            out.setdefault(m.group(1), set()).update(labels)
    return out


def test_metrics_the_agent_reads_have_the_real_names_and_labels(pair: Tuple[Served, Served]) -> None:
    real, standin = (samples(s.get("/metrics")[1]) for s in pair)
    for name in ENGINE.counters.values():
        assert name in real, f"{name} is gone from vLLM's /metrics: agent/engines.py reads it"
        assert name in standin, name
    for name, labels in standin.items():
        assert name in real, f"the stand-in serves {name}, which vLLM does not"
        assert labels <= real[name], (name, labels, real[name])


def test_every_flag_the_standin_takes_is_in_the_real_help(engine_help: Path) -> None:
    real = json.loads(engine_help.read_text())  # the real `--help` as the agent reads it (tests/conftest.py)
    flags, choices = set(real["flags"]), real["choices"]
    mine = set(STANDIN_VLLM.flags) | set(STANDIN_VLLM.switches)
    assert mine <= flags, sorted(mine - flags)
    for flag, allowed in STANDIN_VLLM.flags.items():
        if allowed:
            assert sorted(allowed) == sorted(choices.get(flag, [])), flag


def test_the_standin_states_the_real_defaults_and_the_fit_takes_them(engine_help: Path) -> None:
    """The defaults the real engine states in its `--help=all` (as the agent reads and keeps them): the stand-in
    states the same for every flag it gives one for (None: the real states none), and without
    --gpu-memory-utilization the memory fit takes the stated fraction, which is also the documented one
    (agent.fit.DEFAULT_FRACTION) used where the host was not probed."""
    from agent import fit, probe

    real = json.loads(engine_help.read_text())["defaults"]
    text = subprocess.run([sys.executable, str(STANDIN_ENGINE), "-m", ENGINE.module, "--help=all"],
                          capture_output=True, text=True, check=True).stdout
    mine = probe.help_defaults(text)
    assert STANDIN_VLLM.help_all
    for flag, value in STANDIN_VLLM.help_all.items():
        assert real.get(flag) == (None if value == "None" else value), (flag, value, real.get(flag))
        assert mine.get(flag) == real.get(flag), flag
    stated = float(real["--gpu-memory-utilization"])
    assert fit.memory_fraction("vllm", [], real) == fit.memory_fraction("vllm", []) == stated
    assert fit.memory_fraction("vllm", [], {"--gpu-memory-utilization": "0.5"}) == 0.5   # a host that says otherwise
    assert fit.memory_fraction("vllm", ["--gpu-memory-utilization", "0.7"], real) == 0.7

"""The stand-in engine on its own (each server starts in a fraction of a second): both dialects read by the agent's
own parser, counters that agree with the streams, argparse's refusals, the missing-model error, and each fault knob
at the point it is set to."""
from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

from agent.classify import Reason, classify
from agent.counters import parse
from agent.engines import ENGINES
from agent.server import free_port
from tests.standin import ENGINE
from tests.standin.engine import steps

MODULES = {"vllm": "vllm.entrypoints.openai.api_server", "sglang": "sglang.launch_server"}


class Standin:
    def __init__(self, folder: Path, engine: str, args: List[str], env: Optional[Dict[str, str]] = None) -> None:
        self.engine = ENGINES[engine]
        self.port = free_port()
        model = folder / "model"
        model.mkdir(parents=True, exist_ok=True)
        (model / "config.json").write_text("{}")
        argv = [sys.executable, str(ENGINE), "-m", MODULES[engine], self.engine.model_flag, str(model),
                "--served-model-name", "tiny", "--port", str(self.port), *args]
        self.log = folder / f"{engine}-{self.port}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                         env={**os.environ, "STANDIN_STARTUP_S": "0", **(env or {})})
        end = time.monotonic() + 20
        while self.status(self.engine.health_path) != 200:
            assert self.proc.poll() is None and time.monotonic() < end, self.log.read_text()
            time.sleep(0.02)

    def status(self, path: str) -> int:
        try:
            return self.get(path)[0]
        except OSError:
            return 0

    def get(self, path: str) -> Tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read().decode()
        finally:
            conn.close()

    def generate(self, n: int, headers: Optional[Dict[str, str]] = None) -> Tuple[int, List[Dict[str, Any]]]:
        body = self.engine.request("tiny", "one two three", n, {"temperature": 0.0, "ignore_eos": True}, "s")
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("POST", self.engine.generate_path, json.dumps(body), headers or {})
            resp = conn.getresponse()
            raw = resp.read().decode()
        finally:
            conn.close()
        data = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
        return resp.status, [json.loads(d) for d in data if d != "[DONE]"]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Any]:
    made: List[Standin] = []

    def start(engine: str, *args: str, **env: str) -> Standin:
        made.append(Standin(tmp_path, engine, list(args), env))
        return made[-1]

    yield start
    for s in made:
        if s.proc.poll() is None:
            s.proc.kill()
        s.proc.wait()


def read(engine: str, chunks: List[Dict[str, Any]]) -> Dict[str, Any]:
    """What the agent's parser makes of a stream: tokens, the server's count, acceptance, steps."""
    state: Dict[str, Any] = {}
    out: Dict[str, Any] = {"tokens": 0}
    for obj in chunks:
        info = ENGINES[engine].parse_chunk(obj, state)
        out["tokens"] += info.tokens or 0
        for key in ("completion_tokens", "accept_length", "spec_steps", "spec_accepted", "finish_reason"):
            if getattr(info, key) is not None:
                out[key] = getattr(info, key)
    return out


@pytest.mark.parametrize("n, accept", [(1, 2.0), (7, 2.0), (32, 2.5), (10, 1.0), (5, 4.0)])
def test_steps_give_exactly_n_tokens_at_the_set_acceptance(n: int, accept: float) -> None:
    plan = steps(n, accept)
    assert sum(plan) == n and plan[0] == 1 and all(k >= 1 for k in plan)
    if n > 8 and accept == int(accept):
        assert set(plan[1:-1]) == {int(accept)}


@pytest.mark.parametrize("engine, spec", [
    ("vllm", []),
    ("vllm", ["--speculative-config", '{"method":"ngram","num_speculative_tokens":3}',
              "--per-request-spec-decode-metrics", "summary"]),
    ("sglang", ["--enable-metrics"]),
    ("sglang", ["--enable-metrics", "--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", "16"]),
])
def test_both_dialects_read_by_the_agent_agree_with_their_counters(served: Any, engine: str, spec: List[str]) -> None:
    s = served(engine, *spec, STANDIN_ACCEPT="3")
    speculating = any(a.startswith("--speculative") for a in spec)
    got = []
    for n in (9, 20):
        status, chunks = s.generate(n)
        assert status == 200
        got.append(read(engine, chunks))
        assert got[-1]["tokens"] == got[-1]["completion_tokens"] == n and got[-1]["finish_reason"] == "length"
        if speculating:
            assert got[-1]["spec_steps"] >= 1 and got[-1]["accept_length"] > 1
        else:
            assert "accept_length" not in got[-1]
    counted = parse(s.get("/metrics")[1], ENGINES[engine].counters)
    assert counted["generation_tokens"] == 29 and counted["requests"] == 2
    if speculating and engine == "vllm":
        steps_sum = sum(g["spec_steps"] for g in got)
        assert counted["drafts"] == steps_sum and counted["accepted_tokens"] == sum(g["spec_accepted"] for g in got)


def test_sglang_serves_metrics_only_when_asked_and_checks_its_key(served: Any) -> None:
    s = served("sglang", "--api-key", "k-123")
    assert s.get("/metrics")[0] == 404
    assert s.generate(4)[0] == 401
    status, chunks = s.generate(4, {"Authorization": "Bearer k-123"})
    assert status == 200 and chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == [1, 2, 3, 4]  # cumulative, as SGLang's


@pytest.mark.parametrize("engine, args, said", [
    ("vllm", ["--no-such-flag"], "error: unrecognized arguments: --no-such-flag"),
    ("vllm", ["--per-request-spec-decode-metrics", "all"], "error: argument --per-request-spec-decode-metrics: "
                                                           "invalid choice: 'all'"),
    ("sglang", ["--enforce-eager"], "error: unrecognized arguments: --enforce-eager"),
])
def test_flags_it_does_not_know_fail_as_argparse_does(tmp_path: Path, engine: str, args: List[str], said: str) -> None:
    (tmp_path / "config.json").write_text("{}")
    res = subprocess.run([sys.executable, str(ENGINE), "-m", MODULES[engine], ENGINES[engine].model_flag,
                          str(tmp_path), "--port", "1", *args], capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and said in res.stderr, res.stderr
    assert classify(res.stderr, Reason.CRASHED) == Reason.UNSUPPORTED_FLAG


def test_a_missing_model_fails_as_a_missing_local_model(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, str(ENGINE), "-m", MODULES["vllm"], "--model", str(tmp_path / "none"),
                          "--port", "1"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 1 and classify(res.stderr, Reason.CRASHED) == Reason.MISSING_MODEL


def test_the_version_probe_and_other_code(tmp_path: Path) -> None:
    probe = ENGINES["sglang"].version_probe
    out = subprocess.run([sys.executable, str(ENGINE), "-c", probe, "sglang"], capture_output=True, text=True)
    assert out.stdout.split() == ["sglang", "0.5.15", "standin"]
    code = subprocess.run([sys.executable, str(ENGINE), "-c", "import sys; print(sys.argv[1:])", "a"],
                          capture_output=True, text=True)
    assert code.stdout.strip() == "['a']"


@pytest.mark.parametrize("action", ["crash", "exit0", "sigkill"])
def test_a_fault_after_n_tokens_ends_the_server_in_that_stream(served: Any, action: str) -> None:
    s = served("vllm", STANDIN_FAULT=action, STANDIN_FAULT_AFTER_TOKENS="12")
    assert read("vllm", s.generate(10)[1])["completion_tokens"] == 10  # 10 tokens: not yet
    _, chunks = s.generate(10)
    assert sum(len(c["choices"][0]["token_ids"]) for c in chunks if c.get("choices")) == 2  # cut after token 12
    rc = s.proc.wait(timeout=10)
    assert rc == {"crash": 1, "exit0": 0, "sigkill": -9}[action]
    if action == "crash":
        assert classify(s.log.read_text(), Reason.CRASHED) == Reason.CRASHED


def in_thread(call: Callable[[], Any]) -> Tuple[threading.Thread, List[Any]]:
    """`call()` in a thread of its own; its answer, or the exception it raised, goes in the list."""
    out: List[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except Exception as exc:  # noqa: BLE001  (the test looks at it)
            out.append(exc)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def until(cond: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    end = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < end, f"{what}: not within {seconds:g} s"
        time.sleep(0.01)


def test_hang_stops_the_whole_process_until_sigcont(served: Any) -> None:
    s = served("vllm", STANDIN_FAULT="hang", STANDIN_FAULT_AFTER_TOKENS="3")
    stat = Path(f"/proc/{s.proc.pid}/stat")
    thread, out = in_thread(lambda: s.generate(10))
    until(lambda: stat.read_text().split(")")[1].split()[0] == "T", "the process stopped")
    assert thread.is_alive() and out == []  # the stream is held: it has not ended
    s.proc.send_signal(15)
    s.proc.send_signal(18)  # SIGTERM, then SIGCONT: it shuts down
    assert s.proc.wait(timeout=30) == 0
    thread.join(30)  # resumed, the stream ends (whole, or cut by the exit)
    assert not thread.is_alive()


def test_together_holds_each_request_until_its_group_has_arrived(served: Any) -> None:
    """STANDIN_TOGETHER=2: after the warmup, a request waits for the next one, and both are answered."""
    s = served("vllm", STANDIN_TOGETHER="2")
    assert s.generate(3)[0] == 200  # the warmup is never held
    first, got = in_thread(lambda: s.generate(3))
    until(lambda: "[standin] together: request 2 waits" in s.log.read_text(), "the second request held")
    assert first.is_alive() and got == []  # held: its group is not complete
    assert s.generate(3)[0] == 200
    first.join(30)
    assert got and got[0][0] == 200


def test_launch_mark_and_a_startup_that_waits_for_a_file(tmp_path: Path) -> None:
    """STANDIN_LAUNCH_MARK is there as soon as the server is launched; with STANDIN_STARTUP_UNTIL (and its text)
    the startup, and the exit at its end, wait for that file to hold that text."""
    mark, until_file = tmp_path / "launched", tmp_path / "until"
    (tmp_path / "config.json").write_text("{}")
    proc = subprocess.Popen([sys.executable, str(ENGINE), "-m", MODULES["vllm"], "--model", str(tmp_path),
                             "--port", str(free_port())], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "STANDIN_LAUNCH_MARK": str(mark), "STANDIN_STARTUP_S": "0",
                                 "STANDIN_STARTUP_UNTIL": str(until_file), "STANDIN_STARTUP_UNTIL_TEXT": "go",
                                 "STANDIN_STARTUP_EXIT": "7"})
    try:
        until(mark.exists, "the launch mark")
        until_file.write_text("not yet")
        assert proc.poll() is None  # still starting: the file does not say "go"
        until_file.write_text("go")
        assert proc.wait(timeout=30) == 7
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_http_faults_hit_the_requests_they_name(served: Any) -> None:
    s = served("vllm", STANDIN_HTTP_FAULTS="http_error=3,alter_usage=2")
    results = [s.generate(5) for _ in range(4)]
    assert [r[0] for r in results] == [200, 200, 500, 200]
    told = [read("vllm", chunks)["completion_tokens"] for status, chunks in results if status == 200]
    assert told == [5, 6, 6]  # the 2nd and 4th say one token more than they streamed
    assert parse(s.get("/metrics")[1], ENGINES["vllm"].counters)["generation_tokens"] == 15

"""Workloads of a `bench_workloads_file` measured end to end: the plan carries them in the configs, and the agent
sends plain prompts as text and chat messages through the server's `/tokenize` (its chat template) before timing
them, at their own length or padded to a context length. Against the stand-in engine of test_config_run, whose chat
template renders `/tokenize`'s messages as `<|role|> content` and, asked for it, `<|assistant|>`."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Tuple

from agent.config_run import Host, run_config
from agent.engines import ENGINES
from agent.store import HostStore
from controller import matrix
from tests.agent.test_config_run import CONTEXT, INVOCATION, assert_contract, suite, write_engine
from tests.standin.engine import NO_TEMPLATE

CHAT = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Capital of France?"}]
PLAIN = "List the planets of the solar system in order."
OUT = 6

def chat_engine(folder: Path) -> str:
    """test_config_run's engine (the stand-in, whose /tokenize also takes chat messages)."""
    return write_engine(folder)


def chat_tokens(messages: List[Dict[str, str]]) -> int:
    """How many tokens the fake's chat template makes of `messages` (one a word, with the generation prompt)."""
    return sum(1 + len(m["content"].split()) for m in messages) + 1


def run(tmp_path: Path, python: str, env: Dict[str, str]) -> Tuple[Host, Dict[str, Any], Dict[str, Any]]:
    """The baseline of a suite over the file's two workloads, plain and at CONTEXT tokens; its status."""
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"name": "planets", "prompt": PLAIN}) + "\n"
                    + json.dumps({"name": "capital", "messages": CHAT}) + "\n")
    checked = matrix.validate(suite(python, env=env, repetitions=2, workloads_file=str(path), phases=[
        {"name": "tp1", "configs": [{"method": "autoregressive"}],
         "sweeps": [{"workloads": ["planets", "capital"], "max_tokens": [OUT], "context_tokens": [0, CONTEXT]}]}]))
    [cfg] = matrix.expand(checked)
    host = Host(suite=checked.suite, engine=ENGINES["vllm"], store=HostStore(tmp_path / "results", "h1", INVOCATION))
    return host, cfg, run_config(host, cfg)


def test_plain_and_chat_workloads_of_the_file_are_measured(tmp_path: Path) -> None:
    host, cfg, status = run(tmp_path, chat_engine(tmp_path / "engine"), {})
    assert status["status"] == "ok", status
    folder = host.store.config_dir(cfg["config_id"])
    _, _, rows = assert_contract(folder, cfg["config_id"])
    assert len(rows) == 2 * 2 * 2  # two workloads, two lengths, two repetitions
    prompt_tokens = {(r["workload"], r["context_tokens"]): r["prompt_tokens"] for r in rows}
    assert prompt_tokens == {("planets", 0): 1 + len(PLAIN.split()), ("capital", 0): chat_tokens(CHAT),
                             ("planets", CONTEXT): CONTEXT, ("capital", CONTEXT): CONTEXT}
    assert all(r["ok"] and r["completion_tokens"] == OUT for r in rows)
    log = (folder / "server.log").read_text()
    # the server's chat template made the prompt, with the generation prompt
    assert ("[standin] chat template: <|system|> Answer in one word. <|user|> Capital of France? <|assistant|>"
            in log)


def test_chat_messages_on_a_model_without_a_chat_template_fail_the_config_before_timing(tmp_path: Path) -> None:
    _, cfg, status = run(tmp_path, chat_engine(tmp_path / "engine"), {"STANDIN_CHAT_TEMPLATE": "none"})
    assert status["status"] == "failed" and status["requests"] == 0
    assert "POST /tokenize: HTTP 400" in status["detail"] and NO_TEMPLATE in status["detail"]

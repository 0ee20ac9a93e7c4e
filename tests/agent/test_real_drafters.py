"""The DFlash and EAGLE-3 drafters `make models` builds (tools/tiny_drafters.py) run in the real CPU engine: for
each, one server started from the agent's own argv with the local host's server args and environment
(host_vars/local.yml), one streamed request through the agent's client, and the engine's own answers: the target
taps the hidden states the drafter names, every verify step drafts the method's number of tokens, and the
agent's counter check agrees with the request's row. Their acceptance is whatever random weights give. Beside it,
without the engine: the drafters are the same bytes on every build, and the bad ones are what they say.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Tuple

import pytest
import yaml

from agent import counters
from agent.client import stream
from agent.engines import ENGINES, PORT
from agent.server import ProcessServer, StartupFailed, free_port
from tests.conftest import ROOT, short_tmp
from tools import tiny_drafters

ENGINE = ENGINES["vllm"]
ENGINE_PY = ROOT / ".cache/engine-venv/bin/python"
MODELS = ROOT / ".cache/models"
LOCAL: Dict[str, Any] = yaml.safe_load((ROOT / "host_vars/local.yml").read_text())
MAX_TOKENS = 64
# method -> (its parameters in the matrix, tokens drafted per verify step, the drafter's architecture, the
# target's capture points as vLLM logs them: 0 before the first layer, i after layer i - 1)
CASES: Dict[str, Tuple[Dict[str, int], int, str, str]] = {
    "dflash": ({"block_size": 8}, 7, "DFlashDraftModel", "(1, 2)"),
    "eagle3": ({"num_speculative_tokens": 3}, 3, "LlamaForCausalLMEagle3", "(0, 1, 2)"),
}


def local_env(folder: Path) -> Dict[str, str]:
    """bench_env of the local host, its folders (templated there) in `folder`."""
    env = {k: str(v) for k, v in LOCAL["bench_env"].items() if "{{" not in str(v)}
    env.update(VLLM_CACHE_ROOT=str(folder / "cache/vllm"), TORCHINDUCTOR_CACHE_DIR=str(folder / "cache/inductor"),
               TMPDIR=str(folder), VLLM_RPC_BASE_PATH=str(folder))
    return env


@pytest.mark.engine
@pytest.mark.parametrize("method", sorted(CASES))
def test_the_built_drafter_drafts_in_the_real_engine(method: str) -> None:
    params, k, arch, taps = CASES[method]
    if not ENGINE_PY.exists() or not (MODELS / method / "config.json").exists():
        pytest.fail("the CPU engine or the tiny drafters are missing: run `make engine models` first")
    cfg = {"model": {"name": "tiny-llama", "path": str(MODELS / "target")}, "tp": 1, "method": method,
           "method_params": params, "draft_model": {"name": f"tiny-{method}", "path": str(MODELS / method)},
           "server_args": LOCAL["bench_server_args"]}
    with short_tmp() as tmp:
        port = free_port()
        argv = [a.replace(PORT, str(port)) for a in ENGINE.launch_command(str(ENGINE_PY), cfg, "127.0.0.1")]
        with ProcessServer(argv, {**os.environ, **local_env(tmp)}, tmp / "server.log", port) as server:
            try:
                server.wait_ready(ENGINE.health_path, LOCAL["bench_timeouts"]["health_s"])
            except StartupFailed as failed:
                pytest.fail(f"{failed.detail}\n{server.log_text()[-3000:]}")
            log = server.log_text()
            assert f"Resolved architecture: {arch}" in log, log[-3000:]
            assert f"Using auxiliary layers from speculative config: {taps}" in log, log[-3000:]
            before = counters.read(ENGINE, port)
            body = ENGINE.request("tiny-llama", "def fib(n):\n    a, b = 0, 1\n", MAX_TOKENS,
                                  LOCAL["bench_sampling"], method)
            row = stream(ENGINE, port, body, LOCAL["bench_timeouts"]["request_s"])
            after = counters.read(ENGINE, port)
            assert server.alive(), server.log_text()[-3000:]
        assert row["ok"] and row["completion_tokens"] == MAX_TOKENS, row
        assert before is not None and after is not None
        drafts = after["drafts"] - before["drafts"]
        assert drafts == row["spec_steps"] > 0, (drafts, row)
        assert after["draft_tokens"] - before["draft_tokens"] == k * drafts
        assert 0 <= after["accepted_tokens"] - before["accepted_tokens"] <= k * drafts
        check = counters.check(before, after, [row], speculative=True)
        assert check["verdict"] == "ok", check


def fake_target(folder: Path, layers: int = 2, vocab: int = 1542) -> Path:
    """The files of a target the drafters read: its config.json and its tokenizer's special tokens."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "hidden_size": 128, "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 32, "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "bos_token_id": 0, "eos_token_id": 1,
        "num_hidden_layers": layers, "vocab_size": vocab}))
    (folder / "tokenizer.json").write_text(json.dumps({"added_tokens": [
        {"id": 0, "content": "<s>"}, {"id": 1, "content": "</s>"}, {"id": 2, "content": "<unk>"}]}))
    return folder


def test_drafters_are_the_same_bytes_on_every_build(tmp_path: Path) -> None:
    target = fake_target(tmp_path / "target")
    built = [tiny_drafters.build_drafters(target, tmp_path / run) for run in ("a", "b")]
    for name in ("dflash", "eagle3"):
        for f in ("config.json", "model.safetensors"):
            assert (built[0][name] / f).read_bytes() == (built[1][name] / f).read_bytes(), (name, f)
    dflash = json.loads((built[0]["dflash"] / "config.json").read_text())
    assert dflash["dflash_config"] == {"block_size": 8, "mask_token_id": 2, "target_layer_ids": [0, 1]}
    eagle3 = json.loads((built[0]["eagle3"] / "config.json").read_text())
    assert eagle3["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]


def test_the_bad_drafters_name_a_layer_past_the_target_and_another_vocabulary(tmp_path: Path) -> None:
    bad = tiny_drafters.bad_drafters(fake_target(tmp_path / "target", layers=3, vocab=100), tmp_path)
    layers = json.loads((bad["dflash-past-layers"] / "config.json").read_text())["dflash_config"]["target_layer_ids"]
    assert layers == [0, 1, 2, 3]
    assert json.loads((bad["dflash-other-vocab"] / "config.json").read_text())["vocab_size"] == 200

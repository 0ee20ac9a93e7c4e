"""One config on this host, step by step: its digest, the engine's flags read from a real `--help`, the
preflight, the results folder and its records, and `serve` against a real HTTP server: the stand-in engine
(tests/standin, its vLLM dialect kept equal to the real engine's by tests/standin/test_contract.py), run as the
engine's Python. It answers `--help`, the fingerprint's probes, `/health`, `/tokenize` and the streamed
`/v1/completions`, and does on demand in a second what the real CPU engine cannot: die at startup with a chosen
message (an out-of-memory line, an unknown flag), print planted secrets. The real engine runs the same steps in
tests/playbooks (the demo, the security checks)."""
from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest

from agent import arrivals, probe, records
from agent.classify import Reason
from agent.client import Measurement
from agent.config_run import (
    Host,
    Result,
    config_digest,
    engine_flags,
    fresh_folder,
    preflight,
    record,
    run_config,
    serve,
    skip,
    unknown_flags,
)
from agent.engines import ENGINES, PORT
from agent.records import Event, Outcome
from agent.server import port_in_use
from agent.store import REDACTED, HostStore, now_iso, read_json
from controller import matrix
from tests.standin import write_python
from tests.standin.engine import VLLM as STANDIN_VLLM

DATA = Path(__file__).parent / "data"
VLLM = ENGINES["vllm"]
ENGINE_VERSION = "0.99.0+fake"
HF_TOKEN = "hf_TESTSECRET0f1e2d3c4b5a69788"
API_KEY = "sk-TESTSECRET-a1b2c3d4e5f60718"
SECRETS = (HF_TOKEN, API_KEY)
HOST = "gpu-test-1"
INVOCATION = "inv-test"
# Every flag the stand-in's vLLM dialect names in its --help (the rendered commands of `suite()` use some of them).
FLAGS = ("--help", *STANDIN_VLLM.flags, *STANDIN_VLLM.switches)
CONTEXT = 48
MAX_TOKENS = 8


def help_text(flags: Sequence[str]) -> str:
    """An argparse-style `--help` naming these flags."""
    opts = "".join(f"  {f} VALUE{' ' * (36 - len(f))}the {f[2:]} setting\n" for f in flags if f != "--help")
    return f"usage: api_server.py [-h] [options]\n\noptions:\n  -h, --help{' ' * 30}show this help\n{opts}"


def write_engine(folder: Path, flags: Sequence[str] = FLAGS, help_out: Optional[str] = None, help_rc: int = 0,
                 crash: str = "", crash_plain_after_s: Optional[float] = None) -> str:
    """The stand-in engine (tests/standin) as the engine's Python, its path: version ENGINE_VERSION, any model
    path taken, the environment's secrets echoed into its log (the agent must scrub them); `flags`: what its
    --help names (the others refused), or `help_out` and `help_rc` instead; `crash`: this message and exit 1 at
    the end of a 0.3 s startup, or `crash_plain_after_s` seconds into it and only for a server without a
    speculative config (a baseline that fails late)."""
    env = {"STANDIN_VERSION": ENGINE_VERSION, "STANDIN_MODEL_CHECK": "0", "STANDIN_ECHO_ENV": "1",
           "STANDIN_STARTUP_S": "0", "STANDIN_HELP_DROP": ",".join(sorted(set(FLAGS) - set(flags)))}
    if help_out is not None:
        env.update(STANDIN_HELP_TEXT=help_out, STANDIN_HELP_RC=str(help_rc))
    if crash:
        env.update(STANDIN_STARTUP_EXIT="1", STANDIN_STARTUP_MESSAGE=crash,
                   STANDIN_STARTUP_EXIT_AFTER_S=str(0.3 if crash_plain_after_s is None else crash_plain_after_s))
        if crash_plain_after_s is not None:
            env["STANDIN_STARTUP_EXIT_IF"] = "plain"
    return str(write_python(folder, env))


def suite(python: str, **over: Any) -> Dict[str, Any]:
    """A small vLLM suite: one phase, the baseline and ngram, plain and long-context cells at 1 and 2
    concurrent requests, two repetitions; a token in the environment and an API key."""
    s: Dict[str, Any] = {
        "engine": "vllm", "engine_python": python, "model": {"name": "tiny", "path": "/models/tiny"},
        "env": {"HF_TOKEN": HF_TOKEN}, "api_key": API_KEY, "repetitions": 2, "warmup_max_tokens": 4,
        "timeouts": {"health_s": 30, "request_s": 30, "stop_s": 10, "release_s": 5},
        "phases": [{"name": "tp1",
                    "configs": [{"method": "autoregressive"}, {"method": "ngram", "num_speculative_tokens": 3}],
                    "sweeps": [{"workloads": ["fib"], "max_tokens": [MAX_TOKENS], "context_tokens": [0, CONTEXT],
                                "concurrency": [1, 2]}]}],
    }
    s.update(over)
    return s


def expanded(s: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Dict[str, Any]]]:
    """(the suite with its defaults, as a plan carries it; its configs by id)."""
    checked = matrix.validate(s)
    return checked.suite, {c["config_id"]: c for c in matrix.expand(checked)}


def make_host(root: Path, s: Dict[str, Any], **fields: Any) -> Host:
    return Host(suite=s, engine=VLLM, store=HostStore(root, HOST, INVOCATION), **fields)


def setup(tmp_path: Path, python: str, **over: Any) -> Tuple[Host, Dict[str, Dict[str, Any]]]:
    full, configs = expanded(suite(python, **over))
    return make_host(tmp_path / "results", full), configs


def events(host: Host) -> List[Dict[str, Any]]:
    path = host.store.dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def assert_no_secrets(folder: Path, *texts: str) -> None:
    """No secret in any byte of any file under `folder`, nor in `texts`."""
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert files
    for p in files:
        data = p.read_bytes()
        for s in SECRETS:
            assert s.encode() not in data, f"{s} written to {p}"
    for t in texts:
        for s in SECRETS:
            assert s not in t


def assert_contract(folder: Path, config_id: str) -> Tuple[Dict[str, Any], Dict[str, Any], List[Dict[str, Any]]]:
    """config.json, requests.jsonl and status.json as the results contract defines them."""
    config = json.loads((folder / "config.json").read_text())
    status = json.loads((folder / "status.json").read_text())
    rows = [json.loads(line) for line in (folder / "requests.jsonl").read_text().splitlines()]
    assert records.problem(config, records.CONFIG) is None, records.problem(config, records.CONFIG)
    assert records.problem(status, records.STATUS) is None, records.problem(status, records.STATUS)
    for row in rows:
        assert records.request_problem(row, config_id) is None, records.request_problem(row, config_id)
    assert status["requests"] == len(rows) and status["requests_ok"] == sum(r["ok"] for r in rows)
    assert config["config_id"] == status["config_id"] == config_id
    return config, status, rows


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# -- config_digest ------------------------------------------------------------------------------------
def test_digest_is_stable_and_ignores_the_estimate_and_timeouts(tmp_path: Path) -> None:
    _, configs = expanded(suite("/py"))
    cfg = configs["tp1-ngram-k3"]
    digest = config_digest(cfg)
    assert len(digest) == 16 and int(digest, 16) >= 0
    reordered = dict(reversed(list(copy.deepcopy(cfg).items())))
    assert config_digest(reordered) == digest
    _, again = expanded(suite("/py"))
    assert config_digest(again["tp1-ngram-k3"]) == digest
    changed = {**cfg, "estimate_s": cfg["estimate_s"] * 3,
               "timeouts": {"health_s": 1, "request_s": 2, "stop_s": 3, "release_s": 4}}
    assert config_digest(changed) == digest
    _, slow = expanded(suite("/py", estimate={"tok_s": 1}, timeouts={"health_s": 5}))
    assert slow["tp1-ngram-k3"]["estimate_s"] != cfg["estimate_s"]
    assert config_digest(slow["tp1-ngram-k3"]) == digest


def test_digest_ignores_secret_values() -> None:
    _, one = expanded(suite("/py"))
    _, other = expanded(suite("/py", env={"HF_TOKEN": "hf_another_token_12345"}, api_key="sk-another-key-0987654321"))
    for cid in one:
        assert one[cid]["env"] != other[cid]["env"]
        assert config_digest(one[cid]) == config_digest(other[cid])
    # SGLang takes the key as a flag: redacted in the digest as well
    _, sg1 = expanded(suite("/py", engine="sglang"))
    _, sg2 = expanded(suite("/py", engine="sglang", api_key="sk-another-key-0987654321"))
    assert sg1["tp1-autoregressive"]["command"] != sg2["tp1-autoregressive"]["command"]
    assert config_digest(sg1["tp1-autoregressive"]) == config_digest(sg2["tp1-autoregressive"])


def test_digest_changes_with_what_is_measured() -> None:
    _, configs = expanded(suite("/py"))
    cfg = configs["tp1-ngram-k3"]
    digest = config_digest(cfg)
    assert config_digest({**cfg, "method_params": {"num_speculative_tokens": 4}}) != digest
    # the same config id with another method parameter
    phases = [{"name": "tp1", "configs": [{"method": "autoregressive"},
                                          {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5}],
               "sweeps": [{"workloads": ["fib"], "max_tokens": [MAX_TOKENS], "context_tokens": [0, CONTEXT],
                           "concurrency": [1, 2]}]}]
    _, other = expanded(suite("/py", phases=phases))
    assert other["tp1-ngram-k3"]["config_id"] == cfg["config_id"]
    assert config_digest(other["tp1-ngram-k3"]) != digest
    # a non-secret environment variable, and the cells
    _, env = expanded(suite("/py", env={"HF_TOKEN": HF_TOKEN, "VLLM_USE_V1": "1"}))
    assert config_digest(env["tp1-ngram-k3"]) != digest
    assert config_digest({**cfg, "cells": cfg["cells"][:1]}) != digest


def test_digest_ignores_the_value_of_a_secret_flag_in_server_args() -> None:
    _, one = expanded(suite("/py", server_args=["--hf-token", "hf_flag_value_aaaa1111"]))
    _, two = expanded(suite("/py", server_args=["--hf-token", "hf_flag_value_bbbb2222"]))
    cfg1, cfg2 = one["tp1-autoregressive"], two["tp1-autoregressive"]
    assert config_digest(cfg1) == config_digest(cfg2)


# -- flags --------------------------------------------------------------------------------------------
def test_unknown_flags_are_those_the_help_does_not_name() -> None:
    argv = ["/py", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--port=8000", "--max-num-seqs",
            "4", "--enforce-eager", "--speculative-config={\"method\":\"ngram\"}", "-O3"]
    known = {"--model", "--port", "--speculative-config"}
    assert unknown_flags(argv, known) == ["--max-num-seqs", "--enforce-eager"]
    assert unknown_flags(argv, known | {"--max-num-seqs", "--enforce-eager"}) == []
    assert unknown_flags([], known) == []


def test_engine_flags_are_read_from_the_engines_own_help(tmp_path: Path) -> None:
    python = write_engine(tmp_path)
    assert VLLM.help_command(python) == [python, "-m", "vllm.entrypoints.openai.api_server", "--help=all"]
    assert engine_flags(VLLM, python, {"PATH": os.environ.get("PATH", "")}) == set(FLAGS)
    fewer = write_engine(tmp_path / "old", flags=FLAGS[:-1])
    assert engine_flags(VLLM, fewer, {}) == set(FLAGS[:-1])


def test_engine_flags_of_a_failing_help_raise(tmp_path: Path) -> None:
    python = write_engine(tmp_path, help_out="Traceback (most recent call last):\nModuleNotFoundError: No module "
                                             "named 'vllm'\n", help_rc=1)
    with pytest.raises(RuntimeError) as exc:
        engine_flags(VLLM, python, {})
    assert "(1)" in str(exc.value) and "No module named 'vllm'" in str(exc.value)
    assert "--help" in str(exc.value)


def test_engine_flags_of_a_help_that_exits_non_zero_raise_even_with_flags(tmp_path: Path) -> None:
    python = write_engine(tmp_path, help_out=help_text(FLAGS) + "Segmentation fault at exit\n", help_rc=139)
    with pytest.raises(RuntimeError, match=r"\(139\)"):
        engine_flags(VLLM, python, {})


def test_engine_flags_of_a_help_that_names_no_flags_raise(tmp_path: Path) -> None:
    python = write_engine(tmp_path, help_out="nothing to see here\n", help_rc=0)
    with pytest.raises(RuntimeError, match="nothing to see here"):
        engine_flags(VLLM, python, {})


def test_engine_flags_of_a_missing_python_raise_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        engine_flags(VLLM, str(tmp_path / "no-such-python"), {})


# -- preflight ----------------------------------------------------------------------------------------
def test_preflight_passes_with_known_flags_and_no_gpus(tmp_path: Path) -> None:
    host, configs = setup(tmp_path, write_engine(tmp_path / "engine"))
    assert host.idle_gpu == {} and host.gpu_count == 0
    for cfg in configs.values():
        assert preflight(host, cfg) is None
    assert host.flags == set(FLAGS)
    # the flags are probed once per host: a vanished engine is not asked again
    host.suite = {**host.suite, "engine_python": str(tmp_path / "gone")}
    assert preflight(host, configs["tp1-ngram-k3"]) is None


def test_preflight_names_a_flag_the_engine_does_not_know(tmp_path: Path) -> None:
    python = write_engine(tmp_path / "engine", flags=[f for f in FLAGS if f != "--per-request-spec-decode-metrics"])
    host, configs = setup(tmp_path, python)
    host.engine_info = {"name": "vllm", "version": ENGINE_VERSION}
    assert preflight(host, configs["tp1-autoregressive"]) is None
    res = preflight(host, configs["tp1-ngram-k3"])
    assert res is not None and res.status == Outcome.FAILED and res.reason == Reason.UNSUPPORTED_FLAG
    assert "--per-request-spec-decode-metrics" in res.detail and f"vllm {ENGINE_VERSION}" in res.detail
    assert res.fields == {"unsupported_flags": ["--per-request-spec-decode-metrics"]}
    host.engine_info = {}
    assert "unknown version" in preflight(host, configs["tp1-ngram-k3"]).detail


def test_preflight_refuses_chat_prompts_a_build_cannot_tokenize(tmp_path: Path) -> None:
    """A build whose /tokenize takes no `messages` (its source says so: SGLang before 0.5.15) cannot build a chat
    workload's prompt: the config fails before its server starts, naming the workload."""
    host, configs = setup(tmp_path, write_engine(tmp_path / "engine"))
    cfg = dict(configs["tp1-autoregressive"])
    cfg["prompts"] = {**cfg["prompts"], cfg["cells"][0]["workload"]: [{"role": "user", "content": "hi"}]}
    host.features = {"tokenize_messages": True}
    assert preflight(host, cfg) is None
    host.features = {"tokenize_messages": False}
    res = preflight(host, cfg)
    assert res is not None and res.status == Outcome.FAILED and res.reason == Reason.PROMPT_BUILD_FAILED
    assert res.detail == (f"chat workload {cfg['cells'][0]['workload']!r}: this build's /tokenize takes no messages "
                          "(SGLang takes them from 0.5.15 on; llama.cpp's takes a text only)")
    assert preflight(host, configs["tp1-ngram-k3"]) is None  # text prompts only


def test_preflight_refuses_a_drafter_shorter_than_the_longest_request(tmp_path: Path) -> None:
    """The drafter's own config.json (read on the host before the start) bounds the request: beyond it, the config
    fails incompatible_config before its server starts."""
    draft = tmp_path / "draft"
    draft.mkdir()
    phases = [{"name": "tp1", "configs": [{"method": "autoregressive"},
                                          {"method": "draft_model", "num_speculative_tokens": 2}],
               "sweeps": [{"workloads": ["fib"], "max_tokens": [MAX_TOKENS], "context_tokens": [0, CONTEXT]}]}]
    host, configs = setup(tmp_path, write_engine(tmp_path / "engine"), phases=phases,
                          draft_model={"name": "d", "path": str(draft)})
    longest = CONTEXT + MAX_TOKENS
    for window, refused in ((longest - 1, True), (longest, False)):
        (draft / "config.json").write_text(json.dumps({"max_position_embeddings": window}))
        res = preflight(host, configs["tp1-draft_model-k2"])
        assert (res is not None and res.reason == Reason.INCOMPATIBLE_CONFIG) is refused, res
    (draft / "config.json").write_text(json.dumps({"max_position_embeddings": longest - 1}))
    res = preflight(host, configs["tp1-draft_model-k2"])
    assert res is not None and res.detail == (
        f"its longest request ({longest} tokens: context + max_tokens) is beyond the drafter's context "
        f"({longest - 1} tokens, max_position_embeddings in its config.json)")
    assert preflight(host, configs["tp1-autoregressive"]) is None


def test_preflight_refuses_a_model_shorter_than_the_longest_request_where_no_length_is_set(tmp_path: Path) -> None:
    """The target's own config.json bounds every config's requests when the matrix sets no length: beyond it, the
    config fails does_not_fit before its server starts; with max_model_len set, the matrix's check is the one."""
    target = tmp_path / "target"
    target.mkdir()
    longest = CONTEXT + MAX_TOKENS
    phases = [{"name": "tp1", "configs": [{"method": "autoregressive"}],
               "sweeps": [{"workloads": ["fib"], "max_tokens": [MAX_TOKENS], "context_tokens": [0, CONTEXT]}]}]
    for window, length, refused in ((longest - 1, None, True), (longest, None, False), (longest - 1, 8192, False)):
        (target / "config.json").write_text(json.dumps({"max_position_embeddings": window}))
        model = {"name": "m", "path": str(target), **({"max_model_len": length} if length else {})}
        host, configs = setup(tmp_path / f"r{window}-{length}", write_engine(tmp_path / "engine"), phases=phases,
                              model=model)
        res = preflight(host, configs["tp1-autoregressive"])
        assert (res is not None and res.reason == Reason.DOES_NOT_FIT) is refused, res
        if refused:
            assert res.detail.startswith(f"its longest request ({longest} tokens: context + max_tokens) is beyond the "
                                         f"model's context ({window} tokens, ")


def test_a_twin_of_an_earlier_config_on_this_build_is_skipped_naming_it(tmp_path: Path) -> None:
    """On a build that runs DFlash without overlap always, `dflash-nooverlap` is `dflash`'s server: not run twice."""
    host, configs = setup(tmp_path, write_engine(tmp_path / "engine"))
    host.twins = {"tp1-ngram-k3": "tp1-autoregressive"}  # any pair: the rule is probe.same_servers' (below)
    res = preflight(host, configs["tp1-ngram-k3"])
    assert res is not None and res.status == Outcome.SKIPPED and res.reason == Reason.SAME_SERVER
    assert res.fields == {"same_server_as": "tp1-autoregressive"} and "tp1-autoregressive's figures" in res.detail
    assert preflight(host, configs["tp1-autoregressive"]) is None


def test_same_servers_pairs_ct200s_dflash_configs_per_tp() -> None:
    from controller import matrix
    from tests.controller.test_matrix import suite_from_host_vars
    configs = matrix.expand(suite_from_host_vars("ct200"))
    assert probe.same_servers(configs) == {f"{tp}-dflash-nooverlap": f"{tp}-dflash" for tp in ("tp1", "tp4", "tp8")}
    # a different environment, or other cells, is another measurement
    changed = [{**c, "env": {**c["env"], "X": "1"}} if c["config_id"] == "tp1-dflash" else c for c in configs]
    assert "tp1-dflash-nooverlap" not in probe.same_servers(changed)


def test_skip_unsupported_records_the_config_skipped_with_the_flag(tmp_path: Path) -> None:
    python = write_engine(tmp_path / "engine", flags=[f for f in FLAGS if f != "--per-request-spec-decode-metrics"])
    host, configs = setup(tmp_path, python)
    host.skip_unsupported, host.engine_info = True, {"name": "vllm", "version": ENGINE_VERSION}
    res = preflight(host, configs["tp1-ngram-k3"])
    assert res is not None and (res.status, res.reason) == (Outcome.SKIPPED, Reason.UNSUPPORTED_FLAG)
    assert res.detail == f"--per-request-spec-decode-metrics not known to vllm {ENGINE_VERSION} (skip_unsupported)"
    assert res.fields == {"unsupported_flags": ["--per-request-spec-decode-metrics"]}


def test_a_value_outside_the_flags_choices_is_unsupported(tmp_path: Path) -> None:
    host, configs = setup(tmp_path, write_engine(tmp_path / "engine"))
    host.flags, host.choices = set(FLAGS), {"--per-request-spec-decode-metrics": ["none", "full"]}
    res = preflight(host, configs["tp1-ngram-k3"])
    assert res is not None and res.fields == {"unsupported_flags": ["--per-request-spec-decode-metrics summary"]}


def test_preflight_refuses_tp_above_the_gpu_count(tmp_path: Path) -> None:
    host, configs = setup(tmp_path, write_engine(tmp_path / "engine"))
    host.gpu_count = 2
    cfg = {**configs["tp1-autoregressive"], "tp": 3}
    res = preflight(host, cfg)
    assert res is not None and res.status == Outcome.FAILED and res.reason == Reason.DOES_NOT_FIT
    assert "tp 3" in res.detail and "has 2" in res.detail
    assert preflight(host, {**cfg, "tp": 2}) is None
    host.gpu_count = 0  # no GPUs seen: nothing to compare with
    assert preflight(host, cfg) is None


def test_preflight_refuses_a_config_whose_memory_does_not_fit(tmp_path: Path) -> None:
    """A model folder with a real config.json and weights: with 1 GiB GPUs the weights leave no room; the
    arithmetic is the detail; with no GPU memory known nothing is judged."""
    host, configs = setup(tmp_path, write_engine(tmp_path / "engine"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 4, "num_attention_heads": 8,
                                                   "num_key_value_heads": 2, "head_dim": 64, "hidden_size": 512,
                                                   "torch_dtype": "bfloat16"}))
    with open(model / "model.safetensors", "wb") as f:
        f.truncate(2 << 30)  # 2 GiB of weights (sparse)
    cfg = {**configs["tp1-autoregressive"], "model": {"name": "m", "path": str(model)}}
    host.gpu_memory_mib = 1024
    res = preflight(host, cfg)
    assert res is not None and res.reason == Reason.DOES_NOT_FIT, res
    assert res.detail.startswith("memory: budget 1.0 GiB") and "no room left" in res.detail
    assert res.fields["memory_fit"] == res.detail.removeprefix("memory: ")
    host.gpu_memory_mib = 80 * 1024
    assert preflight(host, cfg) is None
    host.gpu_memory_mib = 0
    assert preflight(host, {**cfg, "model": {"name": "m", "path": str(model)}}) is None


def test_preflight_without_the_engine_is_engine_unavailable(tmp_path: Path) -> None:
    missing = str(tmp_path / "venv" / "bin" / "python")
    host, configs = setup(tmp_path, missing)
    res = preflight(host, configs["tp1-autoregressive"])
    assert res is not None and res.status == Outcome.FAILED and res.reason == Reason.ENGINE_UNAVAILABLE
    assert missing in res.detail
    assert host.flags is None


def test_preflight_waits_for_gpu_memory_then_gives_up(tmp_path: Path) -> None:
    host, configs = setup(tmp_path, write_engine(tmp_path / "engine"))
    host.idle_gpu = {0: -10 ** 9}  # an idle level no reading can come back to (nor a host without nvidia-smi)
    cfg = {**configs["tp1-autoregressive"], "timeouts": {**configs["tp1-autoregressive"]["timeouts"],
                                                         "release_s": 0.3}}
    res = preflight(host, cfg)
    assert res is not None and res.reason == Reason.GPU_BUSY and "still in use" in res.detail


# -- the results folder and its records ---------------------------------------------------------------
def test_fresh_folder_keeps_earlier_attempts_under_previous(tmp_path: Path) -> None:
    store = HostStore(tmp_path, HOST)
    first = fresh_folder(store, "tp1-ngram-k3")
    assert first == store.dir / "tp1-ngram-k3" and first.is_dir() and not any(first.iterdir())
    (first / "status.json").write_text('{"attempt": 1}')
    second = fresh_folder(store, "tp1-ngram-k3")
    assert second == first and not any(second.iterdir())
    [kept] = list((store.dir / ".previous").iterdir())
    assert kept.name.startswith("tp1-ngram-k3.") and (kept / "status.json").read_text() == '{"attempt": 1}'
    (second / "status.json").write_text('{"attempt": 2}')
    fresh_folder(store, "tp1-ngram-k3")
    kept_all = sorted((p / "status.json").read_text() for p in (store.dir / ".previous").iterdir())
    assert kept_all == ['{"attempt": 1}', '{"attempt": 2}']
    other = fresh_folder(store, "tp1-autoregressive")
    assert other.is_dir() and len(list((store.dir / ".previous").iterdir())) == 2


def recorded_rows(cfg: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Request rows of the config from the recorded vLLM ngram stream, one per repetition of its first cell."""
    m = Measurement(VLLM, t_sent=1.30)
    for line in (DATA / "vllm-ngram-stream.txt").read_text().splitlines():
        t, data = line.split("\t", 1)
        m.feed(float(t), data[len("data:"):].strip())
    identity = {"host": HOST, "config_id": cfg["config_id"], "method": cfg["method"],
                "method_params": cfg["method_params"], "tp": cfg["tp"], "engine": cfg["engine"],
                "model": cfg["model"]["name"], "phase": cfg["phase"]}
    cell = cfg["cells"][0]
    return [records.request_row(identity, cell, rep, {"slot": 0, "started_at": now_iso(), **m.result()})
            for rep in range(cell["repetitions"])]


def test_record_writes_the_contract_without_secrets(tmp_path: Path) -> None:
    host, configs = setup(tmp_path, "/py")
    host.engine_info = {"version": ENGINE_VERSION}
    cfg = configs["tp1-ngram-k3"]
    assert cfg["env"]["HF_TOKEN"] == HF_TOKEN and API_KEY in cfg["env"].values()
    folder = fresh_folder(host.store, cfg["config_id"])
    (folder / "server.log").write_text("INFO engine started\n")
    rows = recorded_rows(cfg)
    argv = [a.replace(PORT, "8123") for a in cfg["command"]]
    result = Result(Outcome.OK, None, f"note: token {HF_TOKEN} seen", rows,
                    f"INFO api key {API_KEY}\nINFO token {HF_TOKEN}\nINFO ready", argv,
                    dict(ready_s=1.25, port=8123, timed_s=2.5, stop_s=0.2, survivors=[], wall_s=4.0))
    started = now_iso()
    status = record(host, cfg, result, folder, started, host.secrets(cfg))
    config, on_disk, written = assert_contract(folder, cfg["config_id"])
    assert on_disk == status
    assert status["status"] == "ok" and status["reason"] is None and status["started_at"] == started
    assert status["config_digest"] == config_digest(cfg)
    assert status["ready_s"] == 1.25 and status["port"] == 8123 and status["wall_s"] == 4.0
    assert status["requests"] == 2 and status["requests_ok"] == 2
    assert written == json.loads(json.dumps(rows))
    assert written[0]["accept_length"] == 3.5 and written[0]["completion_tokens"] == 48
    assert status["log_tail"].endswith("INFO ready") and REDACTED in status["log_tail"]
    assert config["command"] == argv and config["engine_version"] == ENGINE_VERSION and config["host"] == HOST
    assert config["environment"] == {"HF_TOKEN": REDACTED, "VLLM_API_KEY": REDACTED}
    assert "prompts" not in config and "env" not in config
    assert (folder / "server.log").read_text() == "INFO engine started\n"
    assert_no_secrets(folder)


def test_record_of_a_config_never_started_writes_a_server_log(tmp_path: Path) -> None:
    host, configs = setup(tmp_path, "/py")
    cfg = configs["tp1-autoregressive"]
    folder = fresh_folder(host.store, cfg["config_id"])
    status = record(host, cfg, Result.failed(Reason.GPU_BUSY, "GPU memory still in use"), folder, now_iso(),
                    host.secrets(cfg))
    _, _, rows = assert_contract(folder, cfg["config_id"])
    assert rows == [] and status["status"] == "failed" and status["reason"] == "gpu_busy"
    assert status["ready_s"] is None and status["log_tail"] == ""
    assert (folder / "server.log").read_text() == "[specfleet] server not started: GPU memory still in use\n"
    assert_no_secrets(folder)


def test_record_keeps_secrets_in_the_detail_out_of_server_log(tmp_path: Path) -> None:
    host, configs = setup(tmp_path, "/py")
    cfg = configs["tp1-autoregressive"]
    folder = fresh_folder(host.store, cfg["config_id"])
    status = record(host, cfg, Result.failed(Reason.ENGINE_UNAVAILABLE, f"help failed: bad token {HF_TOKEN}"),
                    folder, now_iso(), host.secrets(cfg))
    assert HF_TOKEN not in status["detail"]
    assert (folder / "server.log").read_text().startswith("[specfleet] server not started")
    assert_no_secrets(folder)


def test_record_redacts_secret_flags_in_server_args(tmp_path: Path) -> None:
    token = "hf_FLAGSECRET_99887766"
    host, configs = setup(tmp_path, "/py", server_args=["--hf-token", token])
    cfg = configs["tp1-autoregressive"]
    assert token in host.secrets(cfg)
    folder = fresh_folder(host.store, cfg["config_id"])
    record(host, cfg, Result.failed(Reason.GPU_BUSY, "busy"), folder, now_iso(), host.secrets(cfg))
    assert json.loads((folder / "config.json").read_text())["command"][-1] == REDACTED
    for p in folder.iterdir():
        assert token.encode() not in p.read_bytes(), p.name


def test_skip_records_the_reason(tmp_path: Path) -> None:
    host, configs = setup(tmp_path, "/py")
    cfg = configs["tp1-ngram-k3"]
    status = skip(host, cfg, Reason.BASELINE_FAILED, "the autoregressive baseline of phase tp1 did not finish ok")
    folder = host.store.config_dir(cfg["config_id"])
    _, on_disk, rows = assert_contract(folder, cfg["config_id"])
    assert on_disk == status and rows == []
    assert status["status"] == "skipped" and status["reason"] == "baseline_failed"
    assert status["detail"] == "the autoregressive baseline of phase tp1 did not finish ok"
    assert "server not started" in (folder / "server.log").read_text()
    assert_no_secrets(folder)


def test_run_config_without_the_engine_records_engine_unavailable(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-engine" / "python")
    host, configs = setup(tmp_path, missing)
    cfg = configs["tp1-autoregressive"]
    status = run_config(host, cfg)
    folder = host.store.config_dir(cfg["config_id"])
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "requests.jsonl", "server.log", "status.json"]
    _, on_disk, rows = assert_contract(folder, cfg["config_id"])
    assert on_disk == status and rows == []
    assert status["status"] == "failed" and status["reason"] == "engine_unavailable" and missing in status["detail"]
    assert status["config_digest"] == config_digest(cfg)
    assert "server not started" in (folder / "server.log").read_text()
    assert_no_secrets(folder)


# -- serve, against a real server ---------------------------------------------------------------------
def test_serve_measures_every_request_of_every_repetition(tmp_path: Path) -> None:
    host, configs = setup(tmp_path, write_engine(tmp_path / "engine"))
    cfg = configs["tp1-ngram-k3"]
    folder = fresh_folder(host.store, cfg["config_id"])
    res = serve(host, cfg, folder)
    assert res.status == Outcome.OK and res.reason is None, (res.detail, res.log_tail)
    # the port placeholder replaced by the port chosen
    port = res.fields["port"]
    assert isinstance(port, int) and PORT not in res.argv and res.argv[res.argv.index("--port") + 1] == str(port)
    assert res.argv == [str(port) if a == PORT else a for a in cfg["command"]]
    # one row per request per repetition, each by the contract
    assert len(res.rows) == cfg["requests"] == 12
    expected = sorted((records.cell_key(c), rep, slot) for c in cfg["cells"] for rep in range(c["repetitions"])
                      for slot in range(c["concurrency"]))
    assert sorted((records.cell_key(r), r["rep"], r["slot"]) for r in res.rows) == expected
    for r in res.rows:
        assert records.request_problem(r, cfg["config_id"]) is None, r
        assert r["ok"] and r["completion_tokens"] == MAX_TOKENS and r["finish_reason"] == "length"
        # 8 tokens: the first from prefill, then verify steps of 2, 2, 2 and 1: 3 drafts accepted in 4 steps
        assert r["accept_length"] == 1.75 and r["method_params"] == {"num_speculative_tokens": 3}
        assert r["prompt_tokens"] == (CONTEXT if r["context_tokens"] else len(cfg["prompts"]["fib"].split()) + 1)
    # rep 0 of every cell before rep 1 of any
    reps = [r["rep"] for r in res.rows]
    assert reps == sorted(reps)
    f = res.fields
    assert isinstance(f["ready_s"], float) and 0 < f["ready_s"] < cfg["timeouts"]["health_s"]
    assert f["timed_s"] > 0 and f["stop_s"] >= 0 and f["survivors"] == []
    # the server is gone, and its whole output is in server.log, without secrets
    [ready] = [e for e in events(host) if e["event"] == Event.CONFIG_READY.value]
    assert ready["port"] == port and ready["config_id"] == cfg["config_id"] and ready["invocation"] == INVOCATION
    assert gone(ready["server_pid"]) and not port_in_use(port)
    log = (folder / "server.log").read_text()
    assert f"[standin] listening on port {port}" in log
    assert log.count("[standin] generate:") == cfg["requests"] + 1  # and the warmup
    assert "POST /tokenize" in log and f"generate: prompt_tokens {CONTEXT}" in log
    assert REDACTED in log
    assert_no_secrets(folder, res.log_tail)


def test_serve_sends_an_open_loop_cell_on_its_schedule(tmp_path: Path) -> None:
    """Open-loop cells (20 req/s, Poisson; all at once) against a server that holds each request until the five of
    its cell and repetition have all arrived (STANDIN_TOGETHER): a client that waited for the earlier ones to finish
    would never get there (and fail them). Every request is sent when its schedule says, never before; each row
    keeps when it was due, on the clock of sent_s, and the schedule is the cell's (the same for every config)."""
    sweep = {"workloads": ["fib"], "max_tokens": [MAX_TOKENS], "request_rates": [20, "inf"], "requests": 5}
    host, configs = setup(tmp_path, write_engine(tmp_path / "engine"), env={"STANDIN_TOGETHER": "5"},
                          phases=[{"name": "tp1", "configs": [{"method": "autoregressive"}], "sweeps": [sweep]}])
    cfg = configs["tp1-autoregressive"]
    assert cfg["requests"] == 2 * 5 * 2
    res = serve(host, cfg, fresh_folder(host.store, cfg["config_id"]))
    assert res.status == Outcome.OK, (res.detail, res.log_tail)
    assert len(res.rows) == cfg["requests"]
    for cell in cfg["cells"]:
        for rep in range(2):
            mine = sorted((r for r in res.rows if r["request_rate"] == cell["request_rate"] and r["rep"] == rep),
                          key=lambda r: r["slot"])
            assert [r["slot"] for r in mine] == list(range(5))
            assert all(r["ok"] and r["concurrency"] == 0 and records.request_problem(r, cfg["config_id"]) is None
                       for r in mine)
            due = [r["scheduled_s"] - mine[0]["scheduled_s"] for r in mine]
            assert due == pytest.approx(arrivals.schedule(cell, rep), abs=2e-6)  # the cell's own schedule
            # when it was due, never before (how late it went is the machine's pace: the rows keep it, the report
            # flags it)
            assert all(r["sent_s"] - r["scheduled_s"] + 1e-6 >= 0 for r in mine)
            # and without waiting for the earlier ones: all five were in flight at once
            assert max(r["sent_s"] for r in mine) < min(r["done_s"] for r in mine)
    assert {r["request_rate"] for r in res.rows} == {20, "inf"}


@pytest.mark.parametrize("message, reason", [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB", Reason.OOM),
    ("api_server.py: error: unrecognized arguments: --frobnicate", Reason.UNSUPPORTED_FLAG),
    ("RuntimeError: Engine core initialization failed. See root cause above.", Reason.CRASHED),
])
def test_serve_classifies_a_server_that_dies_during_startup(tmp_path: Path, message: str, reason: Reason) -> None:
    host, configs = setup(tmp_path, write_engine(tmp_path / "engine", crash=message))
    cfg = configs["tp1-autoregressive"]
    folder = fresh_folder(host.store, cfg["config_id"])
    res = serve(host, cfg, folder)
    assert res.status == Outcome.FAILED and res.reason == reason
    assert "exited with code 1 during startup" in res.detail
    assert res.rows == [] and res.fields["ready_s"] is None and res.fields["timed_s"] == 0
    assert message in res.log_tail and message in (folder / "server.log").read_text()
    assert not port_in_use(res.fields["port"])
    assert not [e for e in events(host) if e["event"] == Event.CONFIG_READY.value]
    assert_no_secrets(folder, res.log_tail)


def test_serve_refuses_a_port_another_program_holds(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        host, configs = setup(tmp_path, write_engine(tmp_path / "engine"), port=port)
        cfg = configs["tp1-autoregressive"]
        status = run_config(host, cfg)
    assert (status["status"], status["reason"]) == ("failed", "port_in_use")
    assert str(port) in status["detail"] and status["port"] == port and status["ready_s"] is None
    folder = host.store.config_dir(cfg["config_id"])
    assert_contract(folder, cfg["config_id"])
    assert (folder / "server.log").read_text().startswith("[specfleet] server not started: port")
    assert not [e for e in events(host) if e["event"] == Event.CONFIG_READY.value]


def test_run_config_with_a_real_server_writes_valid_records(tmp_path: Path) -> None:
    host, configs = setup(tmp_path, write_engine(tmp_path / "engine"))
    host.engine_info = {"version": ENGINE_VERSION}
    cfg = configs["tp1-autoregressive"]
    status = run_config(host, cfg)
    folder = host.store.config_dir(cfg["config_id"])
    config, on_disk, rows = assert_contract(folder, cfg["config_id"])
    assert on_disk == status and status["status"] == "ok" and status["reason"] is None
    assert status["requests"] == status["requests_ok"] == cfg["requests"] == len(rows)
    assert status["wall_s"] >= status["timed_s"] > 0 and status["ready_s"] > 0
    assert all(r["accept_length"] is None for r in rows)
    assert config["command"][config["command"].index("--port") + 1] == str(status["port"])
    assert config["engine_version"] == ENGINE_VERSION
    assert read_json(folder / "status.json") == status
    assert_no_secrets(folder)


def test_another_engine_on_the_host_is_recorded_and_flags_the_config(tmp_path: Path) -> None:
    """A server of another stack beside the config (its command line says so), there before the config and through
    its timed requests: status.json `foreign` names it with both moments, and the report flags the rows."""
    from collector.tables.speedup import config_flags
    host, configs = setup(tmp_path, write_engine(tmp_path / "engine"))
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "-m", "sglang.launch_server"])
    try:
        end = time.monotonic() + 30
        while b"sglang.launch_server" not in Path(f"/proc/{other.pid}/cmdline").read_bytes():
            assert time.monotonic() < end
            time.sleep(0.01)
        status = run_config(host, configs["tp1-autoregressive"])
    finally:
        other.kill()
        other.wait(timeout=30)
    assert status["status"] == "ok"
    mine = [p for p in status["foreign"] if p["pid"] == other.pid]
    assert mine and mine[0]["why"] == "engine" and mine[0]["when"] == ["before", "timed"]
    assert all(p["pid"] != status.get("server_pid") for p in status["foreign"])
    flags, words = config_flags(status)
    assert flags.count("foreign_load") == 1 and words.startswith("not this run's, on the host: pid ")

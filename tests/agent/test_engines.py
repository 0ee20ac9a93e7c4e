"""Rendered launch commands, pinned: what runs on the GPU host is exactly this."""
from __future__ import annotations

import json

from controller import matrix
from tests.controller.test_matrix import suite_from_host_vars

SGLANG_BASE = [
    "/opt/specfleet/sglang/bin/python", "-m", "sglang.launch_server", "--model-path", "/models/Qwen3.6-27B",
    "--served-model-name", "Qwen3.6-27B", "--host", "127.0.0.1", "--port", "{port}", "--tp-size", "1",
    "--mem-fraction-static", "0.80", "--context-length", "131072", "--attention-backend", "flashinfer",
    "--disable-radix-cache", "--trust-remote-code", "--enable-metrics",
]


def ct200() -> dict[str, dict]:
    return {c["config_id"]: c for c in matrix.expand(suite_from_host_vars("ct200"))}


def test_sglang_baseline_command() -> None:
    c = ct200()["tp1-autoregressive"]
    assert c["command"] == SGLANG_BASE
    assert c["env"] == {"HF_HUB_OFFLINE": "1"}  # spec v2 only where it is meant: the overlapped DFlash


def test_sglang_dflash_command() -> None:
    dflash = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "/models/Qwen3.6-27B-DFlash",
              "--speculative-num-draft-tokens", "16"]
    assert ct200()["tp1-dflash"]["command"] == SGLANG_BASE + dflash
    assert ct200()["tp1-dflash"]["env"] == {"HF_HUB_OFFLINE": "1"}  # overlapped: the default from 0.5.14
    # the same drafter on DDTree's scheduling path (overlap off, no spec v2)
    assert ct200()["tp1-dflash-nooverlap"]["command"] == SGLANG_BASE + ["--disable-overlap-schedule", *dflash]
    assert ct200()["tp1-dflash-nooverlap"]["env"] == {"HF_HUB_OFFLINE": "1"}
    assert all(c["env"] == {"HF_HUB_OFFLINE": "1"} for cid, c in ct200().items() if "ddtree" in cid)


def test_sglang_ddtree_command_uses_the_patch_flags() -> None:
    assert ct200()["tp1-ddtree-b15"]["command"] == SGLANG_BASE + [
        "--page-size", "1", "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path",
        "/models/Qwen3.6-27B-DFlash", "--speculative-num-draft-tokens", "16", "--speculative-ddtree-budget", "15"]


def test_sglang_tp8() -> None:
    cmd = ct200()["tp8-ddtree-b64"]["command"]
    assert cmd[cmd.index("--tp-size") + 1] == "8"
    assert cmd[-2:] == ["--speculative-ddtree-budget", "64"]


def test_vllm_cpu_commands() -> None:
    local = {c["config_id"]: c for c in matrix.expand(suite_from_host_vars("local"))}
    py = "{{ specfleet_root }}/.cache/engine-venv/bin/python"
    base = [py, "-m", "vllm.entrypoints.openai.api_server", "--model", "{{ specfleet_root }}/.cache/models/target",
            "--served-model-name", "tiny-llama", "--host", "127.0.0.1", "--port", "{port}",
            "--tensor-parallel-size", "1", "--dtype", "bfloat16", "--max-model-len", "1024", "--enforce-eager"]
    assert local["tp1-autoregressive"]["command"] == base
    ngram = local["tp1-ngram-k4"]["command"]
    assert ngram[:len(base)] == base
    assert ngram[len(base)] == "--speculative-config"
    assert json.loads(ngram[len(base) + 1]) == {"method": "ngram", "num_speculative_tokens": 4,
                                                "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    assert ngram[-2:] == ["--per-request-spec-decode-metrics", "summary"]
    draft = json.loads(local["tp1-draft_model-k3"]["command"][len(base) + 1])
    assert draft == {"method": "draft_model", "model": "{{ specfleet_root }}/.cache/models/draft",
                     "num_speculative_tokens": 3}


def test_vllm_dflash_uses_block_minus_one() -> None:
    s = suite_from_host_vars("local")
    s["phases"][0]["configs"].append({"method": "dflash", "block_size": 16})
    cfg = [c for c in matrix.expand(s) if c["method"] == "dflash"][-1]  # the one appended
    spec = json.loads(cfg["command"][cfg["command"].index("--speculative-config") + 1])
    assert spec["method"] == "dflash" and spec["num_speculative_tokens"] == 15

"""Memory fit: the hand-run's arithmetic (96 GB × 0.80 − 52 GB weights − 3.3 GB drafter ≈ 21 GB at TP1) on a
Qwen3.6-27B-shaped config, the tiny model's real folder, and the real H200 capture's memory.

Qwen3.6-27B shape: 64 layers, 16 of them full attention (3 gated-delta-net + 1 attention, 16 times), 24 query and
4 KV heads (the project's reference notes). Assumed, not from a published config: head_dim 256 (as in Qwen3-Next's
attention layers) and bfloat16.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent import fit, gpu, probe
from tests.conftest import ROOT

QWEN36 = {"num_hidden_layers": 64, "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256,
          "hidden_size": 5120, "torch_dtype": "bfloat16",
          "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 16}
GB = 10**9
CARD_MIB = 96 * GB // (1 << 20)  # a 96 GB card
H200_MIB = gpu.parse_query_csv((ROOT / "tests/fixtures/nvidia-h200/query-gpu.csv").read_text())[0]["memory.total"]


def test_qwen36_counts_its_attention_layers_only() -> None:
    shape = fit.Shape.from_config(QWEN36)
    assert (shape.layers, shape.attention_layers, shape.kv_heads, shape.head_dim, shape.dtype_bytes) == \
        (64, 16, 4, 256, 2)
    assert shape.kv_bytes_per_token(1) == 2 * 16 * 4 * 256 * 2 == 65536
    assert shape.kv_bytes_per_token(4) == 65536 // 4          # the 4 KV heads split over 4 GPUs
    assert shape.kv_bytes_per_token(8) == shape.kv_bytes_per_token(4)  # TP8 replicates them: one per GPU
    interval = {k: v for k, v in QWEN36.items() if k != "layer_types"} | {"full_attention_interval": 4}
    assert fit.Shape.from_config(interval) == shape
    dense = {k: v for k, v in QWEN36.items() if k != "layer_types"}
    assert fit.Shape.from_config(dense).attention_layers == 64


def test_the_hand_run_arithmetic_at_tp1() -> None:
    shape = fit.Shape.from_config(QWEN36)
    ok = fit.check(shape, 52 * GB, int(3.3 * GB), CARD_MIB, 0.80, 1, tokens=100_000 + 256)
    assert ok.fits, ok.detail
    assert "× 0.80" in ok.detail and "over tp 1" in ok.detail and "64 KiB/token" in ok.detail
    left = 96 * GB * 0.80 - 55.3 * GB                      # ≈ 21.5 GB for the KV cache
    most = int(left // shape.kv_bytes_per_token(1))        # ≈ 328k tokens
    assert fit.check(shape, 52 * GB, int(3.3 * GB), CARD_MIB, 0.80, 1, most - 1000).fits
    crowded = fit.check(shape, 52 * GB, int(3.3 * GB), CARD_MIB, 0.80, 1, tokens=4 * 100_256)
    assert not crowded.fits and "401024 tokens" in crowded.detail
    assert fit.check(shape, 52 * GB, int(3.3 * GB), CARD_MIB, 0.80, 4, tokens=4 * 100_256).fits


def test_weights_that_do_not_fit_leave_no_room() -> None:
    shape = fit.Shape.from_config(QWEN36)
    result = fit.check(shape, 140 * GB, 0, CARD_MIB, 0.90, 1, tokens=1000)
    assert not result.fits and "no room left for the KV cache" in result.detail
    assert fit.check(shape, 140 * GB, 0, CARD_MIB, 0.90, 2, tokens=1000).fits


def test_without_a_fraction_only_the_weights_are_judged() -> None:
    shape = fit.Shape.from_config(QWEN36)
    result = fit.check(shape, 52 * GB, 0, CARD_MIB, None, 1, tokens=10**9)
    assert result.fits and "not checked" in result.detail


@pytest.mark.parametrize("argv, engine, expected", [
    (["--mem-fraction-static", "0.8"], "sglang", 0.8),
    (["--mem-fraction-static=0.75"], "sglang", 0.75),
    (["--gpu-memory-utilization", "0.5"], "vllm", 0.5),
    (["--gpu_memory_utilization", "0.4"], "vllm", 0.4),         # vLLM reads underscores as dashes
    (["--gpu_memory-utilization=0.3", "--dtype", "auto"], "vllm", 0.3),
    (["--gpu-memory-utilization", "0.5", "--gpu-memory-utilization=0.6"], "vllm", 0.6),   # the last one wins
    (["--mem_fraction_static", "0.8"], "sglang", None),          # SGLang refuses that name (its flag check says so)
    ([], "vllm", 0.92),
    ([], "sglang", None),
])
def test_memory_fraction_from_the_command(argv: list[str], engine: str, expected: float | None) -> None:
    assert fit.memory_fraction(engine, argv) == expected


def test_the_tiny_model_fits_an_h200(tmp_path: Path) -> None:
    folder = ROOT / ".cache/models/target"
    if not (folder / "config.json").exists():
        folder = tmp_path / "target"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 4,
                                                        "num_key_value_heads": 2, "head_dim": 32,
                                                        "hidden_size": 128, "dtype": "float32"}))
        (folder / "model.safetensors").write_bytes(b"\0" * 4096)
    shape = fit.Shape.from_config(json.loads((folder / "config.json").read_text()))
    assert shape.kv_bytes_per_token(1) == 2 * 2 * 2 * 32 * 4
    assert probe.model(str(folder))["weights_bytes"] == (folder / "model.safetensors").stat().st_size
    cfg = {"model": {"path": str(folder)}, "draft_model": None, "tp": 1, "warmup_max_tokens": 32,
           "cells": [{"context_tokens": 512, "max_tokens": 256, "concurrency": 4}]}
    result = fit.of_config(cfg, "vllm", [], H200_MIB)
    assert H200_MIB == 143771 and result is not None and result.fits, result
    assert "3072 tokens" in result.detail
    assert fit.of_config({**cfg, "model": {"path": str(tmp_path / "none")}}, "vllm", [], H200_MIB) is None

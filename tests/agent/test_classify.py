"""Failure reasons from real engine error messages."""
from __future__ import annotations

import pytest

from agent.classify import classify


@pytest.mark.parametrize("log, reason", [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "oom"),
    ("ValueError: Available memory on node 0 (8.55/10.46 GiB) on startup is less than desired CPU memory "
     "utilization (0.92, 9.63 GiB).", "oom"),
    ("RuntimeError: Capture cuda graph failed: out of resources", "cuda_graph"),
    ("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1)", "nccl_timeout"),
    ("api_server.py: error: unrecognized arguments: --speculative-ddtree-budget 16", "unsupported_flag"),
    ("OSError: [Errno 98] Address already in use", "port_in_use"),
    ("FlashAttention v3 Backend requires SM>=80 and SM<=90. Please use --attention-backend flashinfer",
     "attention_backend"),
    ("ValueError: Speculative decoding for Qwen3_5ForCausalLM is not compatible with radix cache when using "
     "--mamba-scheduler-strategy no_buffer", "incompatible_config"),
    ("Value error, Invalid repository ID or local directory specified: '/models/x'", "missing_model"),
    ("RuntimeError: CUDA error: no CUDA-capable device is detected", "cuda_error"),
    ("Traceback (most recent call last):\nKeyError: 'foo'", "crashed"),
])
def test_reason(log: str, reason: str) -> None:
    assert classify(log, "crashed") == reason


def test_unreadable_weights_and_seccomp() -> None:
    assert classify("PermissionError: [Errno 13] Permission denied: '/opt/models/target/model.safetensors'",
                    "crashed") == "permission_denied"
    assert classify("Main process exited, code=killed, status=31/SYS", "crashed") == "seccomp"

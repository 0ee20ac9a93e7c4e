"""Classify why a server failed, from its log: a short word a table can show."""
from __future__ import annotations

import re

# First match wins; patterns come from the engines' real error messages.
PATTERNS: list[tuple[str, str]] = [
    ("seccomp", r"status=31/SYS"),
    ("permission_denied", r"PermissionError|Permission denied"),
    ("oom", r"CUDA out of memory|OutOfMemoryError|torch\.OutOfMemoryError|Cannot allocate memory|"
            r"Not enough memory|insufficient memory|No available memory for the cache blocks|"
            r"on startup is less than desired (GPU|CPU) memory utilization"),
    ("cuda_graph", r"[Cc]apture [Cc][Uu][Dd][Aa] graph failed|CUDA graph capture"),
    ("nccl_timeout", r"NCCL.*[Tt]imeout|Watchdog caught collective operation timeout"),
    ("unsupported_flag", r"unrecognized arguments:|error: argument .*invalid choice"),
    ("port_in_use", r"[Aa]ddress already in use"),
    ("does_not_fit", r"larger than the maximum|exceeds the maximum|max_model_len.*(greater|larger)|"
                     r"is larger than .*KV cache"),
    ("attention_backend", r"FlashAttention v3 Backend requires|Please use --attention-backend"),
    ("incompatible_config", r"is not compatible with|not supported (for|with|when)|NotImplementedError"),
    ("missing_model", r"No such file or directory.*(config\.json|safetensors)|does not appear to have a file|"
                      r"Can't load the configuration|is not a local folder|"
                      r"Invalid repository ID or local directory"),
    ("cuda_error", r"CUDA error|cuInit|no CUDA-capable device|CUDA driver version is insufficient"),
]


def classify(log_text: str, default: str) -> str:
    """The first known failure pattern found in the log, else `default`."""
    for reason, pattern in PATTERNS:
        if re.search(pattern, log_text):
            return reason
    return default


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])

"""Why a config failed: every reason the agent can record, and the classifier that reads it from a log."""
from __future__ import annotations

import enum
import re


class Reason(str, enum.Enum):
    """The `reason` of a failed or skipped config in status.json: a short word a table can show."""

    CRASHED = "crashed"                        # the server exited (or was killed) before or while serving
    HEALTH_TIMEOUT = "health_timeout"          # not healthy within timeouts.health_s
    REQUEST_TIMEOUT = "request_timeout"        # a request passed timeouts.request_s and /health went silent
    OOM = "oom"
    CUDA_GRAPH = "cuda_graph"
    NCCL_TIMEOUT = "nccl_timeout"
    UNSUPPORTED_FLAG = "unsupported_flag"      # a launch flag the installed engine does not know
    PORT_IN_USE = "port_in_use"
    DOES_NOT_FIT = "does_not_fit"              # tp above the GPU count, or weights + KV cache above a GPU's memory
    ATTENTION_BACKEND = "attention_backend"
    INCOMPATIBLE_CONFIG = "incompatible_config"
    MISSING_MODEL = "missing_model"
    CUDA_ERROR = "cuda_error"
    SECCOMP = "seccomp"                        # the unit's syscall filter killed the engine
    PERMISSION_DENIED = "permission_denied"
    GPU_BUSY = "gpu_busy"                      # GPU memory not released by the previous config
    UNIT_BUSY = "unit_busy"                    # the config's systemd unit is already active
    BAD_PROMPT = "bad_prompt"                  # a long-context prompt could not be built to its exact size
    PROMPT_BUILD_FAILED = "prompt_build_failed"  # the server's /tokenize failed while it was alive
    WARMUP_FAILED = "warmup_failed"
    REQUESTS_FAILED = "requests_failed"        # no timed request succeeded
    ENGINE_UNAVAILABLE = "engine_unavailable"  # the engine's --help could not be run
    BASELINE_FAILED = "baseline_failed"        # skipped: the phase's autoregressive baseline did not finish ok
    SAME_SERVER = "same_server"                # skipped: on this build the same server as another config

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


# First match wins; patterns come from the engines' real error messages.
PATTERNS: list[tuple[Reason, str]] = [
    (Reason.SECCOMP, r"status=31/SYS"),
    (Reason.PERMISSION_DENIED, r"PermissionError|Permission denied"),
    (Reason.OOM, r"CUDA out of memory|OutOfMemoryError|torch\.OutOfMemoryError|Cannot allocate memory|"
            r"Not enough memory|insufficient memory|No available memory for the cache blocks|"
            r"on startup is less than desired (GPU|CPU) memory utilization"),
    (Reason.CUDA_GRAPH, r"[Cc]apture [Cc][Uu][Dd][Aa] graph failed|CUDA graph capture"),
    (Reason.NCCL_TIMEOUT, r"NCCL.*[Tt]imeout|Watchdog caught collective operation timeout"),
    (Reason.UNSUPPORTED_FLAG, r"unrecognized arguments:|error: argument .*invalid choice"),
    (Reason.PORT_IN_USE, r"[Aa]ddress already in use"),
    (Reason.DOES_NOT_FIT, r"larger than the maximum|exceeds the maximum|max_model_len.*(greater|larger)|"
                     r"is larger than .*KV cache"),
    (Reason.ATTENTION_BACKEND, r"FlashAttention v3 Backend requires|Please use --attention-backend"),
    (Reason.INCOMPATIBLE_CONFIG, r"is not compatible with|not supported (for|with|when)|NotImplementedError"),
    (Reason.MISSING_MODEL, r"No such file or directory.*(config\.json|safetensors)|does not appear to have a file|"
                      r"Can't load the configuration|is not a local folder|"
                      r"Invalid repository ID or local directory"),
    (Reason.CUDA_ERROR, r"CUDA error|cuInit|no CUDA-capable device|CUDA driver version is insufficient"),
]


def classify(log_text: str, default: Reason) -> Reason:
    """The first known failure pattern found in the log, else `default`."""
    for reason, pattern in PATTERNS:
        if re.search(pattern, log_text):
            return reason
    return default


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])

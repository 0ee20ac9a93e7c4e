"""Why a config failed: every reason the agent can record, the classifier that reads it from a log, and what a
config's drafter and target say of each other before any start (`drafter_problems`)."""
from __future__ import annotations

import enum
import json
import re
from typing import Any, List, Mapping, Optional, Tuple

from .engines import flag_value


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
            r"on startup is less than desired (GPU|CPU) memory utilization|"
            # llama.cpp (ggml-cuda, ggml-backend)
            r"cudaMalloc failed: out of memory|failed to allocate \S+ buffer of size"),
    (Reason.CUDA_GRAPH, r"[Cc]apture [Cc][Uu][Dd][Aa] graph failed|CUDA graph capture"),
    (Reason.NCCL_TIMEOUT, r"NCCL.*[Tt]imeout|Watchdog caught collective operation timeout"),
    (Reason.UNSUPPORTED_FLAG, r"unrecognized arguments:|error: argument .*invalid choice|"
                              r"error: invalid argument: -|Error while handling argument"),  # llama.cpp (arg.cpp)
    (Reason.PORT_IN_USE, r"[Aa]ddress already in use|couldn't bind HTTP server socket"),
    (Reason.DOES_NOT_FIT, r"larger than the maximum|exceeds the maximum|max_model_len.*(greater|larger)|"
                     r"is larger than .*KV cache"),
    (Reason.ATTENTION_BACKEND, r"FlashAttention v3 Backend requires|Please use --attention-backend"),
    (Reason.INCOMPATIBLE_CONFIG, r"is not compatible with|not supported (for|with|when)|NotImplementedError|"
                                 # a drafter tapping target layers that are not there: vLLM 0.32 (qwen3_dflash.py),
                                 # SGLang 0.5.15 on (dflash_utils.py)
                                 r"DFlash drafter expects \d+ concatenated aux hidden features|"
                                 r"DFLASH target_layer_ids contains an out-of-range layer id|"
                                 # an id past an embedding table (vLLM 0.32: the target embedding the tokens of a
                                 # drafter of another vocabulary)
                                 r"embedding\(.*(?:\n.*){0,3}\n.*IndexError: index out of range in self|"
                                 # llama.cpp: a drafter tapping a target layer whose input it never keeps
                                 r"layer input tensor is null"),
    (Reason.MISSING_MODEL, r"No such file or directory.*(config\.json|safetensors)|does not appear to have a file|"
                      r"Can't load the configuration|is not a local folder|"
                      r"Invalid repository ID or local directory|"
                      # llama.cpp: a GGUF file (the target's or the drafter's) that is not there
                      r"failed to open GGUF file .*\(No such file or directory\)"),
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


# -- before a start: a drafter that does not fit its target --------------------------------------------------------
# methods whose drafter taps the target's hidden states at the layers its config.json names
TAPS = {"dflash": "dflash", "ddtree": "dflash", "eagle3": "eagle3"}
# methods whose drafter drafts in the target's vocabulary (it shares, or mirrors, its embeddings and LM head); a
# separate draft model (`draft_model`) may pad its vocabulary otherwise and still serve
SHARED_VOCAB = ("eagle", "eagle3", "dflash", "ddtree")
# a Hugging Face repository id ("name" or "owner/name"), which an engine fetches when no folder of that name is there
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def _text(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """A config.json's language model part (a multimodal one's `text_config`), as the engines read its shape."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _layer_ids(config: Mapping[str, Any], kind: str, engine: str) -> Optional[Tuple[str, Any]]:
    """(the field, its value) naming the target layers a drafter taps, where the engine looks for it: DFlash's
    `dflash_config.target_layer_ids` (else a top-level `target_layer_ids`, as SGLang reads it); EAGLE-3's
    `eagle_aux_hidden_state_layer_ids`, vLLM's at the top (else under `eagle_config`), SGLang's under `eagle_config`
    only (up to 0.5.23 its model runner reads no other)."""
    if kind == "dflash":
        inner, field, top = "dflash_config", "target_layer_ids", True
    else:
        inner, field, top = "eagle_config", "eagle_aux_hidden_state_layer_ids", engine == "vllm"
    nested = config.get(inner) if isinstance(config.get(inner), dict) else {}
    first = [(field, config.get(field))] if top and kind == "eagle3" else []
    last = [(field, config.get(field))] if top and kind == "dflash" else []
    for name, value in [*first, (f"{inner}.{field}", nested.get(field)), *last]:
        if value is not None:
            return name, value
    return None


def _drafter_block(config: Mapping[str, Any]) -> Optional[Tuple[str, int]]:
    """(the field, the block) a DFlash drafter is built for: `dflash_config.block_size`, else a top-level
    `block_size` (SGLang's order)."""
    nested = config.get("dflash_config") if isinstance(config.get("dflash_config"), dict) else {}
    for field, value in (("dflash_config.block_size", nested.get("block_size")),
                         ("block_size", config.get("block_size"))):
        if _int(value) is not None:
            return field, value
    return None


def _served_block(command: List[str]) -> Optional[Tuple[int, str]]:
    """(the block a DFlash server runs, where its command says it) from the rendered command: vLLM's
    `--speculative-config` num_speculative_tokens + 1 (vLLM 0.32 never reads the drafter's block), SGLang's
    `--speculative-num-draft-tokens`; None where the command leaves it to the engine, which then takes the drafter's
    own (SGLang)."""
    spec = flag_value(command, "--speculative-config")
    if spec is not None:
        try:
            k = _int(json.loads(spec).get("num_speculative_tokens"))
        except (ValueError, AttributeError):
            return None
        return (k + 1, f"num_speculative_tokens {k} in --speculative-config; vLLM does not read the drafter's "
                       f"own block") if k is not None else None
    given = flag_value(command, "--speculative-num-draft-tokens")
    return (int(given), "--speculative-num-draft-tokens") if given and given.isdigit() else None


def drafter_problems(cfg: Mapping[str, Any], drafter: Optional[Mapping[str, Any]],
                     target: Optional[Mapping[str, Any]]) -> List[Tuple[Reason, str]]:
    """Why a config's drafter cannot serve its target, one (reason, line) each, from the two folders as
    `agent.probe.model` read them on the host (None: not read, nothing judged): a drafter path with no config.json
    there (`missing_model`; a Hugging Face id the engine may fetch is not judged); and `incompatible_config`: target
    layers the drafter taps that the target does not have (DFlash's `target_layer_ids` count from 0; vLLM's EAGLE-3
    `eagle_aux_hidden_state_layer_ids` are its taps, 0 before the first layer and i after layer i - 1, SGLang's count
    layers from 0), a vocabulary other than the target's (`vocab_size`, for the methods that draft in the target's
    vocabulary), and a DFlash block larger than the drafter is built for, given (`block_size`) or left to an engine
    that does not read the drafter's (vLLM: 16). Each line names the drafter's path, the field, and the target's
    (or the drafter's own) value."""
    spec = cfg.get("draft_model") or {}
    if not spec or drafter is None:
        return []
    path, method = spec.get("path"), cfg.get("method")
    config = drafter.get("config")
    if not isinstance(config, dict):
        if drafter.get("config_problem") or drafter.get("weights_bytes") is not None or HUB_ID.fullmatch(str(path)):
            return []
        what = "no such file" if str(path).endswith(".gguf") else "no config.json"  # llama.cpp's: one GGUF file
        return [(Reason.MISSING_MODEL, f"drafter {path}: no model there on the host ({what}; draft_model.path)")]
    out: List[Tuple[Reason, str]] = []
    shape, own = _text(config), _text((target or {}).get("config") or {})
    layers = _int(own.get("num_hidden_layers"))
    kind = TAPS.get(str(method))
    found = _layer_ids(config, kind, str(cfg.get("engine"))) if kind else None
    if layers is not None and found is not None and isinstance(found[1], list):
        field, ids = found
        taps = kind == "eagle3" and cfg.get("engine") == "vllm"  # vLLM's EAGLE-3 ids are its tap points
        top = layers if taps else layers - 1
        bad = [i for i in ids if _int(i) is None or not 0 <= i <= top]
        if bad:
            how = "vLLM's taps: 0 before the first layer, i after layer i - 1" if taps else "layers counted from 0"
            out.append((Reason.INCOMPATIBLE_CONFIG, (
                f"drafter {path}: {field} {ids} names {'layers' if len(bad) > 1 else 'layer'} "
                f"{', '.join(map(str, bad))} the target does not have (num_hidden_layers {layers} in the target's "
                f"config.json; allowed: 0 to {top}, {how})")))
    vocab, theirs = _int(shape.get("vocab_size")), _int(own.get("vocab_size"))
    if method in SHARED_VOCAB and vocab is not None and theirs is not None and vocab != theirs:
        out.append((Reason.INCOMPATIBLE_CONFIG, (
            f"drafter {path}: vocab_size {vocab} is not the target's (vocab_size {theirs} in the target's "
            f"config.json): a drafter of another vocabulary")))
    built, served = _drafter_block(config), _served_block(list(cfg.get("command") or []))
    if kind == "dflash" and built is not None and served is not None and served[0] > built[1]:
        given = (cfg.get("method_params") or {}).get("block_size")
        said = f"block_size {given}" if given is not None else \
            f"block_size is not set, so the server runs blocks of {served[0]} ({served[1]})"
        out.append((Reason.INCOMPATIBLE_CONFIG, (
            f"drafter {path}: {said}, larger than the block the drafter is built for ({built[0]} {built[1]} in its "
            f"config.json); allowed: block_size at most {built[1]}")))
    return out

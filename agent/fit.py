"""Will a config fit its GPUs? The arithmetic of the hand-run, from the model's own files, before any start.

Per GPU: budget = GPU memory × the engine's memory fraction (`--mem-fraction-static`, `--gpu-memory-utilization`);
weights and drafter are split across TP; what is left holds the KV cache, whose bytes per token come from the
model's `config.json`: 2 (K and V) × attention layers × KV heads on this GPU × head_dim × dtype bytes. Hybrid
models (gated delta net / Mamba layers beside full attention) count their attention layers only; KV heads are
split across TP and replicated when TP exceeds them. The recurrent state of the linear layers is not counted
(a few MiB per request), so a config that fits here can still be refused by the engine at its margin.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence

from . import probe
from .engines import ENGINES, flag_value

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float8_e4m3fn": 1,
               "float8_e5m2": 1, "fp8": 1, "int8": 1}
ATTENTION_TYPES = ("full_attention", "attention", "sliding_attention")
FRACTION_FLAGS = {"sglang": "--mem-fraction-static", "vllm": "--gpu-memory-utilization"}
# The engine's own default where the flag is left out: what the host's engine states in its help (vLLM's
# `--help=all`: agent.probe.help_defaults) when the host was probed, else this documented one (vLLM 0.32's
# CacheConfig.gpu_memory_utilization; the engine contract reads it from the real engine). SGLang chooses its own
# by GPU and TP and states none: without the flag only weights are checked.
DEFAULT_FRACTION = {"vllm": 0.92}
GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True)
class Shape:
    """What of a model decides its KV cache size."""

    layers: int
    attention_layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Shape:
        """From a Hugging Face `config.json` (a multimodal one's `text_config` when present)."""
        text = config.get("text_config") or config
        layers = int(text["num_hidden_layers"])
        kinds = text.get("layer_types")
        if kinds:
            attention = sum(1 for k in kinds if k in ATTENTION_TYPES)
        elif text.get("full_attention_interval"):
            attention = layers // int(text["full_attention_interval"])
        else:
            attention = layers
        heads = int(text["num_attention_heads"])
        kv = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
        dtype = str(text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or "bfloat16")
        return cls(layers, attention, kv, head_dim, DTYPE_BYTES.get(dtype, 2))

    def kv_heads_per_gpu(self, tp: int) -> int:
        return max(1, math.ceil(self.kv_heads / tp))

    def kv_bytes_per_token(self, tp: int) -> int:
        """KV cache bytes one token takes on one GPU at this TP."""
        return 2 * self.attention_layers * self.kv_heads_per_gpu(tp) * self.head_dim * self.dtype_bytes


def memory_fraction(engine: str, argv: Sequence[str], stated: Optional[Mapping[str, str]] = None
                    ) -> Optional[float]:
    """The fraction of GPU memory the engine may use: its flag in the command, else the default the host's engine
    states (`stated`: flag -> default, from its help), else the documented one."""
    flag = FRACTION_FLAGS.get(engine)
    given = flag_value(argv, flag, ENGINES[engine].flexible_names if engine in ENGINES else False) if flag else None
    if given is not None:
        return float(given)
    try:
        return float((stated or {})[flag])  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        return DEFAULT_FRACTION.get(engine)


@dataclass
class Fit:
    """The verdict with its arithmetic, one line per step."""

    fits: bool
    lines: List[str]

    @property
    def detail(self) -> str:
        return "; ".join(self.lines)


def check(shape: Shape, weights: int, drafter: int, gpu_mib: int, fraction: Optional[float], tp: int,
          tokens: int) -> Fit:
    """Whether weights, drafter and `tokens` of KV cache (the largest cell's context + output, times its
    concurrency) fit one GPU of `gpu_mib` at this TP."""
    gpu = gpu_mib * MIB
    lines = []
    budget = gpu * (fraction if fraction is not None else 1.0)
    what = f"{gpu / GIB:.1f} GiB × {fraction:.2f}" if fraction is not None else f"{gpu / GIB:.1f} GiB (no fraction)"
    lines.append(f"budget {what} = {budget / GIB:.1f} GiB per GPU")
    held = (weights + drafter) / tp
    lines.append(f"weights {weights / GIB:.1f} GiB + drafter {drafter / GIB:.1f} GiB over tp {tp} = "
                 f"{held / GIB:.1f} GiB")
    left = budget - held
    if left <= 0:
        lines.append(f"no room left for the KV cache ({left / GIB:.1f} GiB)")
        return Fit(False, lines)
    per_token = shape.kv_bytes_per_token(tp)
    need = per_token * tokens
    lines.append(f"KV {per_token / 1024:.0f} KiB/token ({shape.attention_layers} attention layers × "
                 f"{shape.kv_heads_per_gpu(tp)} KV heads × {shape.head_dim} × {shape.dtype_bytes} B × 2) × "
                 f"{tokens} tokens = {need / GIB:.2f} GiB of {left / GIB:.1f} GiB left")
    if fraction is None:
        lines.append("KV room not checked: the engine sets its own memory fraction")
        return Fit(True, lines)
    return Fit(need <= left, lines)


def largest_tokens(cells: Sequence[Mapping[str, Any]], warmup_max_tokens: int = 0) -> int:
    """The most tokens in the KV cache at once for a config's cells: (context + output) × concurrency; for an
    open-loop cell one request's (its server queues what does not fit, and the queueing is part of what it
    measures)."""
    return max([(c["context_tokens"] + c["max_tokens"]) * (c["concurrency"] or 1) for c in cells]
               + [warmup_max_tokens])


def judge(cfg: Mapping[str, Any], engine: str, argv: Sequence[str], gpu_mib: int, model: Mapping[str, Any],
          drafter_bytes: int, stated: Optional[Mapping[str, str]] = None) -> Optional[Fit]:
    """The fit of one resolved config on GPUs of `gpu_mib`, from its model as `probe.model` reads it (config.json
    and weight bytes, here or on the host); None when there is nothing to judge from."""
    config, weights = model.get("config"), model.get("weights_bytes")
    if not isinstance(config, dict) or not weights:
        return None
    try:
        shape = Shape.from_config(config)
    except (KeyError, TypeError, ValueError):
        return None
    return check(shape, int(weights), drafter_bytes, gpu_mib, memory_fraction(engine, argv, stated), cfg["tp"],
                 largest_tokens(cfg["cells"], cfg.get("warmup_max_tokens", 0)))


def of_config(cfg: Mapping[str, Any], engine: str, argv: Sequence[str], gpu_mib: int,
              stated: Optional[Mapping[str, str]] = None) -> Optional[Fit]:
    """The fit of one resolved config, from its model folders on this host."""
    draft = cfg.get("draft_model") or {}
    drafter = (probe.model(draft["path"])["weights_bytes"] if draft.get("path") else None) or 0
    return judge(cfg, engine, argv, gpu_mib, probe.model(cfg["model"]["path"]), drafter, stated)

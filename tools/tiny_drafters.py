"""Tiny DFlash and EAGLE-3 drafters for the tiny target, in the layout vLLM's drafter classes load.

Seeded and offline, NumPy only (no torch): a drafter is a `config.json` and a `model.safetensors` written
byte for byte the same on every run, in a few milliseconds. Shapes follow the target's `config.json`; the
weights are random, so their acceptance says nothing about any real drafter.

- DFlash (`DFlashDraftModel`, vLLM's `qwen3_dflash.DFlashQwen3ForCausalLM`): Qwen3-style layers with per-head
  q/k norms, `fc` over the target hidden states named by `dflash_config.target_layer_ids` (zero-based target
  layers; the engine taps the stream after each), `hidden_norm` and `norm`; no embeddings or LM head of its own:
  it shares the target's, and `dflash_config.mask_token_id` (the target tokenizer's `<unk>`, which its byte-level
  vocabulary never needs for text) embeds the masked slots.
- EAGLE-3 (`LlamaForCausalLMEagle3`, vLLM's `llama_eagle3.Eagle3LlamaForCausalLM`): one `midlayer` whose
  attention reads the token embedding and the hidden state side by side (2 x hidden wide), `fc` over the three
  target streams of `eagle_aux_hidden_state_layer_ids`, and `norm`; it shares the target's embeddings and LM head.

Both need a target whose vLLM class taps hidden states (`SupportsEagle3`): the tiny Llama's does.
`bad_drafters` builds drafters that do not fit the target (layers it lacks, another vocabulary).
"""
from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import numpy as np

SEED = 20261130
DFLASH_BLOCK_SIZE = 8  # the block the DFlash drafter is built for: the bonus token and 7 masked slots

Tensors = Dict[str, np.ndarray]


def write_safetensors(path: Path, tensors: Tensors) -> None:
    """Tensors as float32 safetensors, names in sorted order (the same bytes for the same tensors)."""
    header: Dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name in sorted(tensors):
        data = np.ascontiguousarray(tensors[name], dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def _save(out: Path, config: Dict[str, Any], tensors: Tensors) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    write_safetensors(out / "model.safetensors", tensors)
    for f in (out / "config.json", out / "model.safetensors"):  # readable by services running as another user
        f.chmod(0o644)
    return out


class _Init:
    """Seeded uniform initialisation (std 0.02, as the target's), in the order tensors are asked for."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, *shape: int) -> np.ndarray:
        bound = 0.02 * 3 ** 0.5
        return (self.rng.random(shape) * 2 * bound - bound).astype("<f4")


def _common(target: Dict[str, Any], vocab_size: int, layers: int) -> Dict[str, Any]:
    """The config fields a drafter shares with its target's shape."""
    keys = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "hidden_act", "rms_norm_eps", "max_position_embeddings", "rope_parameters", "bos_token_id",
            "eos_token_id")
    return {**{k: target[k] for k in keys}, "vocab_size": vocab_size, "num_hidden_layers": layers,
            "attention_bias": False, "tie_word_embeddings": False, "dtype": "float32"}


def _token_id(target: Path, content: str) -> int:
    """The id of a special token of the target's tokenizer."""
    added = json.loads((target / "tokenizer.json").read_text())["added_tokens"]
    return next(t["id"] for t in added if t["content"] == content)


def _mlp(init: _Init, prefix: str, hidden: int, inter: int) -> Tensors:
    return {f"{prefix}.mlp.gate_proj.weight": init(inter, hidden), f"{prefix}.mlp.up_proj.weight": init(inter, hidden),
            f"{prefix}.mlp.down_proj.weight": init(hidden, inter)}


def build_dflash(target: Path, out: Path, *, block_size: int = DFLASH_BLOCK_SIZE,
                 target_layer_ids: Optional[Sequence[int]] = None, vocab_size: Optional[int] = None,
                 layers: int = 2, seed: int = SEED + 1) -> Path:
    """A DFlash drafter for `target` in `out`: `target_layer_ids` default to every target layer; a
    `vocab_size` other than the target's gives the drafter embeddings and an LM head of that size (a drafter
    trained for another model)."""
    cfg = json.loads((target / "config.json").read_text())
    ids = list(range(cfg["num_hidden_layers"]) if target_layer_ids is None else target_layer_ids)
    vocab = cfg["vocab_size"] if vocab_size is None else vocab_size
    hidden, heads, kv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    config = {**_common(cfg, vocab, layers), "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
              "block_size": block_size, "num_target_layers": cfg["num_hidden_layers"],
              "dflash_config": {"block_size": block_size, "mask_token_id": _token_id(target, "<unk>"),
                                "target_layer_ids": ids}}
    init = _Init(seed)
    tensors: Tensors = {"fc.weight": init(hidden, hidden * len(ids)), "hidden_norm.weight": np.ones(hidden, "<f4"),
                        "norm.weight": np.ones(hidden, "<f4")}
    for i in range(layers):
        p = f"layers.{i}"
        tensors.update({f"{p}.self_attn.q_proj.weight": init(heads * hd, hidden),
                        f"{p}.self_attn.k_proj.weight": init(kv * hd, hidden),
                        f"{p}.self_attn.v_proj.weight": init(kv * hd, hidden),
                        f"{p}.self_attn.o_proj.weight": init(hidden, heads * hd),
                        f"{p}.self_attn.q_norm.weight": np.ones(hd, "<f4"),
                        f"{p}.self_attn.k_norm.weight": np.ones(hd, "<f4"),
                        f"{p}.input_layernorm.weight": np.ones(hidden, "<f4"),
                        f"{p}.post_attention_layernorm.weight": np.ones(hidden, "<f4"),
                        **_mlp(init, p, hidden, cfg["intermediate_size"])})
    if vocab != cfg["vocab_size"]:
        tensors.update({"embed_tokens.weight": init(vocab, hidden), "lm_head.weight": init(vocab, hidden)})
    return _save(out, config, tensors)


def build_eagle3(target: Path, out: Path, *, aux_layer_ids: Optional[Sequence[int]] = None,
                 seed: int = SEED + 2) -> Path:
    """An EAGLE-3 drafter for `target` in `out`. `aux_layer_ids` are the engine's capture points in the target,
    0 before its first layer and i after layer i - 1. The default, the last three (all of them for the 2-layer
    target), replaces the engine's own (2, layers // 2, layers - 3): (2, 1, -1) for 2 layers, two streams where
    the drafter's `fc` takes three."""
    cfg = json.loads((target / "config.json").read_text())
    ids = list(range(cfg["num_hidden_layers"] + 1)[-3:] if aux_layer_ids is None else aux_layer_ids)
    hidden, heads, kv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    config = {**_common(cfg, cfg["vocab_size"], 1), "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
              "draft_vocab_size": cfg["vocab_size"], "eagle_aux_hidden_state_layer_ids": ids}
    init = _Init(seed)
    p = "midlayer"
    tensors: Tensors = {
        f"{p}.self_attn.q_proj.weight": init(heads * hd, 2 * hidden),
        f"{p}.self_attn.k_proj.weight": init(kv * hd, 2 * hidden),
        f"{p}.self_attn.v_proj.weight": init(kv * hd, 2 * hidden),
        f"{p}.self_attn.o_proj.weight": init(hidden, heads * hd),
        f"{p}.input_layernorm.weight": np.ones(hidden, "<f4"),
        f"{p}.hidden_norm.weight": np.ones(hidden, "<f4"),
        f"{p}.post_attention_layernorm.weight": np.ones(hidden, "<f4"),
        **_mlp(init, p, hidden, cfg["intermediate_size"]),
        "fc.weight": init(hidden, hidden * len(ids)), "norm.weight": np.ones(hidden, "<f4")}
    return _save(out, config, tensors)


def build_drafters(target: Path, out: Path) -> Dict[str, Path]:
    """The drafters the suite runs: `dflash` (block size DFLASH_BLOCK_SIZE) and `eagle3`."""
    return {"dflash": build_dflash(target, out / "dflash"), "eagle3": build_eagle3(target, out / "eagle3")}


def bad_drafters(target: Path, out: Path) -> Dict[str, Path]:
    """Drafters that do not fit `target`: `dflash-past-layers` (every target layer and the one after its last, as
    a drafter for a deeper model names them) and `dflash-other-vocab` (twice the target's vocabulary, with its own
    embeddings and head)."""
    cfg = json.loads((target / "config.json").read_text())
    return {"dflash-past-layers": build_dflash(target, out / "dflash-past-layers",
                                               target_layer_ids=range(cfg["num_hidden_layers"] + 1)),
            "dflash-other-vocab": build_dflash(target, out / "dflash-other-vocab", vocab_size=2 * cfg["vocab_size"])}


def main(argv: Sequence[str]) -> None:
    """`python tools/tiny_drafters.py [--bad] TARGET_DIR OUT_DIR`: the suite's drafters (with --bad: those that
    do not fit) for the target in TARGET_DIR, each in a folder of OUT_DIR named as the functions above say."""
    args = list(argv)
    bad = "--bad" in args
    if bad:
        args.remove("--bad")
    if len(args) != 2:
        sys.exit(main.__doc__)
    for name, path in (bad_drafters if bad else build_drafters)(Path(args[0]), Path(args[1])).items():
        print(f"built {path} ({name})")


if __name__ == "__main__":
    main(sys.argv[1:])

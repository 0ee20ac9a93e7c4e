"""Build the tiny target and draft models for the embedded CPU default.

Seeded and offline: a byte-level BPE tokenizer trained on local text and a 2-layer Llama with
random weights; the draft model is a 1-layer copy that shares the target's embeddings, first
layer, norm and head; the target's second layer is scaled down so the draft agrees with it often
enough to exercise speculation. A DFlash and an EAGLE-3 drafter for the target follow
(tools/tiny_drafters.py).
The numbers these models produce say nothing about any real model.

Usage: python tools/build_tiny_models.py OUT_DIR
       (writes OUT_DIR/target, OUT_DIR/draft, OUT_DIR/dflash and OUT_DIR/eagle3)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from tiny_drafters import build_drafters  # beside this file: a script's own folder is on its import path

SEED = 20261130
VOCAB_SIZE = 2048
HIDDEN = 128
HEADS = 4  # head_dim 32: the CPU attention kernels need head_dim >= 32
KV_HEADS = 2
MAX_POSITIONS = 4096


def corpus() -> list[str]:
    """Deterministic local text: code, arithmetic and JSON-like lines."""
    lines = []
    for i in range(400):
        lines.append(f"def fib_{i}(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a")
        lines.append(f"def qsort_{i}(xs):\n    if len(xs) <= 1:\n        return xs\n    p = xs[0]\n"
                     f"    lo = [x for x in xs[1:] if x < p]\n    hi = [x for x in xs[1:] if x >= p]\n"
                     f"    return qsort_{i}(lo) + [p] + qsort_{i}(hi)")
        lines.append(f"A shop sells {i} apples at {i % 7 + 2} dollars each and {i * 3 % 11} pears; "
                     f"the total cost is {i * (i % 7 + 2)} dollars.")
        lines.append(json.dumps({"id": i, "name": f"item-{i}", "tags": ["a", "b"], "price": i * 1.5,
                                 "ok": i % 2 == 0}))
    return lines


def build(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=["<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   model_max_length=MAX_POSITIONS)

    def config(layers: int) -> LlamaConfig:
        return LlamaConfig(vocab_size=len(fast), hidden_size=HIDDEN, intermediate_size=4 * HIDDEN,
                           num_hidden_layers=layers, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                           max_position_embeddings=MAX_POSITIONS, bos_token_id=fast.bos_token_id,
                           eos_token_id=fast.eos_token_id, tie_word_embeddings=False, torch_dtype="float32")

    torch.manual_seed(SEED)
    target = LlamaForCausalLM(config(2)).eval()
    with torch.no_grad():  # keep the second layer's contribution small so the 1-layer draft agrees often
        target.model.layers[1].self_attn.o_proj.weight.mul_(0.05)
        target.model.layers[1].mlp.down_proj.weight.mul_(0.05)
    draft = LlamaForCausalLM(config(1)).eval()
    state = {k: v for k, v in target.state_dict().items() if not k.startswith("model.layers.1.")}
    draft.load_state_dict(state)
    for name, model in (("target", target), ("draft", draft)):
        path = out / name
        path.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(path, safe_serialization=True)
        fast.save_pretrained(path)
        for f in path.iterdir():  # the weights are written 0600: services running as another user read them
            f.chmod(0o644)
        print(f"built {path} ({sum(p.numel() for p in model.parameters())} parameters)")
    for name, path in build_drafters(out / "target", out).items():
        print(f"built {path} ({name} drafter)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    build(Path(sys.argv[1]))

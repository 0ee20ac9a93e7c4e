"""The tiny target and drafters as GGUF for llama.cpp's `llama-server`, converted by llama.cpp's own converter.

Runs the converter of a llama.cpp source tree (`convert_hf_to_gguf.py`'s `conversion` package and its `gguf-py`)
in this process, with the Python that built the models (torch, transformers, safetensors). Writes, in
MODELS_DIR/gguf (F16 weights, F32 norms: the converter's `f16`, which llama.cpp's CPU backend runs):

- `target.gguf`: the 2-layer Llama target (MODELS_DIR/target);
- `draft.gguf`: the 1-layer draft model (MODELS_DIR/draft), for `--spec-type draft-simple`;
- `dflash.gguf`: a DFlash drafter (`--spec-type draft-dflash`) of block size 4 (GGUF_DFLASH_BLOCK), as the
  profile's `dflash-blk4` names it: llama.cpp reads the block from the file and computes a whole block each step,
  drafting at most block size - 1 tokens (`--spec-draft-n-max`);
- `eagle3.gguf`: an EAGLE-3 drafter (`--spec-type draft-eagle3`).

The two drafters are not MODELS_DIR/dflash and MODELS_DIR/eagle3 (those stay as vLLM uses them) but variants
built by tools/tiny_drafters.py into MODELS_DIR/gguf/hf, tapping only what llama.cpp serves for a Llama target.
llama.cpp taps the *input* of target layer i (`t_layer_inp[i]`: 0 is the embeddings, i the stream after layer
i - 1), which the Llama graph (src/models/llama.cpp) defines for i < n_layer only. For a target of n_layer layers:

- DFlash: the converter writes `target_layers` = `dflash_config.target_layer_ids` + 1 (HF id k is the output of
  layer k), so the ids must be <= n_layer - 2; one more (vLLM's default, every layer) makes the first request
  abort on `GGML_ASSERT(t_layer_inp[il] != nullptr && "layer input tensor is null")` (src/llama-graph.cpp).
  Here: (0,) for the 2-layer target.
- EAGLE-3: the converter writes `eagle_aux_hidden_state_layer_ids` as they are (the same capture points);
  exactly three (src/models/eagle3.cpp), each < n_layer. n_layer itself asks the target for its `h_nextn`,
  which the Llama graph never fills: no error, the drafter silently reads an unwritten buffer
  (common/speculative.cpp, src/llama-context.cpp). Here: (0, 1, 1) for the 2-layer target.

The tiny byte-level BPE tokenizer is GPT-2's scheme, but its pre-tokenizer hash is not in the converter's list
(`TextModel.get_vocab_base_pre`), which refuses it: it is told "gpt-2" here, in this process only; the source
tree is not touched. The same inputs give the same bytes (no timestamps or paths are written).

Usage: python tools/tiny_gguf.py LLAMA_CPP_SRC MODELS_DIR
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Dict, List, Optional, Tuple

from tiny_drafters import build_dflash, build_eagle3  # beside this file

GGUF_DFLASH_BLOCK = 4  # the block llama.cpp's DFlash computes each step (vLLM's drafter keeps its own)

PRE_TOKENIZER = "gpt-2"


def llama_taps(target: Path) -> Tuple[List[int], List[int]]:
    """The DFlash `target_layer_ids` (every target layer but the last) and the EAGLE-3 aux ids (the last three
    capture points below n_layer, the last one repeated while fewer than three) llama.cpp serves for `target`."""
    n = json.loads((target / "config.json").read_text())["num_hidden_layers"]
    if n < 2:
        sys.exit(f"{target}: a DFlash drafter for llama.cpp needs a target of at least 2 layers, not {n}")
    aux = list(range(n))[-3:]
    return list(range(n - 1)), aux + aux[-1:] * (3 - len(aux))


def load_converter(src: Path) -> Tuple[ModuleType, ModuleType]:
    """llama.cpp's `conversion` package and `gguf` from `src` (the caller puts `src` and `src/gguf-py` on
    PYTHONPATH, as `make gguf-models` does), told our tokenizer's pre-tokenizer."""
    os.environ.setdefault("TQDM_DISABLE", "1")  # no progress bars in make's log (read when tqdm is imported)
    import conversion
    import gguf
    from conversion.base import TextModel

    if not Path(conversion.__file__).resolve().is_relative_to(src.resolve()):
        sys.exit(f"llama.cpp's converter is not the one of {src}: put {src} and {src}/gguf-py on PYTHONPATH")

    def get_vocab_base_pre(self: object, tokenizer: object) -> str:
        return PRE_TOKENIZER

    TextModel.get_vocab_base_pre = get_vocab_base_pre
    return conversion, gguf


def convert(conversion: ModuleType, gguf: ModuleType, model: Path, out: Path, target: Optional[Path] = None) -> None:
    """One HF folder to one F16 GGUF file (`target`: the target folder a drafter takes its tokenizer and the
    target's shape from)."""
    import torch

    hparams = conversion.ModelBase.load_hparams(model, False)
    cls = conversion.get_model_class(conversion.get_model_architecture(hparams, conversion.ModelType.TEXT))
    with torch.inference_mode():
        instance = cls(model, gguf.LlamaFileType.MOSTLY_F16, out, model_name=f"specfleet-tiny-{out.stem}",
                       target_model_dir=target)
        instance.write()
    out.chmod(0o644)


def build(src: Path, models: Path) -> Dict[str, Path]:
    """The four GGUF files in `models`/gguf (module docstring), by name."""
    conversion, gguf = load_converter(src)
    logging.basicConfig(level=logging.WARNING)
    target, gdir = models / "target", models / "gguf"
    dflash_ids, eagle3_ids = llama_taps(target)
    hf = {"dflash": build_dflash(target, gdir / "hf" / "dflash", block_size=GGUF_DFLASH_BLOCK,
                                 target_layer_ids=dflash_ids),
          "eagle3": build_eagle3(target, gdir / "hf" / "eagle3", aux_layer_ids=eagle3_ids)}
    jobs = {"target": (target, None), "draft": (models / "draft", None),
            "dflash": (hf["dflash"], target), "eagle3": (hf["eagle3"], target)}
    done: Dict[str, Path] = {}
    for name, (folder, tgt) in jobs.items():
        start = time.monotonic()
        done[name] = gdir / f"{name}.gguf"
        convert(conversion, gguf, folder, done[name], tgt)
        print(f"built {done[name]} ({time.monotonic() - start:.1f} s)")
    return done


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    build(Path(sys.argv[1]), Path(sys.argv[2]))

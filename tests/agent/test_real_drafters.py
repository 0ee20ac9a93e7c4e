"""The DFlash and EAGLE-3 drafters `make models` builds (tools/tiny_drafters.py): the same bytes on every build,
and the bad ones what they say. The real CPU engine serves the good ones in `make demo` (host_vars/local.yml's
dflash and eagle3 configs), where tests/playbooks/test_readme_local.py checks that the engine loaded each drafter,
tapped the target's layers it names, and counted exactly the verify steps and accepted drafts the rows report."""
from __future__ import annotations

import json
from pathlib import Path

from tools import tiny_drafters


def fake_target(folder: Path, layers: int = 2, vocab: int = 1542) -> Path:
    """The files of a target the drafters read: its config.json and its tokenizer's special tokens."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "hidden_size": 128, "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 32, "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "bos_token_id": 0, "eos_token_id": 1,
        "num_hidden_layers": layers, "vocab_size": vocab}))
    (folder / "tokenizer.json").write_text(json.dumps({"added_tokens": [
        {"id": 0, "content": "<s>"}, {"id": 1, "content": "</s>"}, {"id": 2, "content": "<unk>"}]}))
    return folder


def test_drafters_are_the_same_bytes_on_every_build(tmp_path: Path) -> None:
    target = fake_target(tmp_path / "target")
    built = [tiny_drafters.build_drafters(target, tmp_path / run) for run in ("a", "b")]
    for name in ("dflash", "eagle3"):
        for f in ("config.json", "model.safetensors"):
            assert (built[0][name] / f).read_bytes() == (built[1][name] / f).read_bytes(), (name, f)
    dflash = json.loads((built[0]["dflash"] / "config.json").read_text())
    assert dflash["dflash_config"] == {"block_size": 8, "mask_token_id": 2, "target_layer_ids": [0, 1]}
    eagle3 = json.loads((built[0]["eagle3"] / "config.json").read_text())
    assert eagle3["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]


def test_the_bad_drafters_name_a_layer_past_the_target_and_another_vocabulary(tmp_path: Path) -> None:
    bad = tiny_drafters.bad_drafters(fake_target(tmp_path / "target", layers=3, vocab=100), tmp_path)
    layers = json.loads((bad["dflash-past-layers"] / "config.json").read_text())["dflash_config"]["target_layer_ids"]
    assert layers == [0, 1, 2, 3]
    assert json.loads((bad["dflash-other-vocab"] / "config.json").read_text())["vocab_size"] == 200

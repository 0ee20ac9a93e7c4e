"""A drafter that cannot serve its target, refused by the agent before its server starts (`preflight`, for a run
without the plan's host check): a drafter path with nothing there (`missing_model`), target layers the drafter taps
that the target lacks, another vocabulary, a DFlash block larger than the drafter's (`incompatible_config`), each in
one line naming the drafter's path, the field and the target's (or the drafter's own) value; the good drafters
pass. The drafters are `tools/tiny_drafters.py`'s, built on disk for a 2-layer target of 1542 tokens (EAGLE-3's bad
ones by its `build_eagle3`, their config.json edited where the builder has no switch for the fault). Beside it, the
classifier on what the real engine prints when such a drafter reaches it anyway (tests/fixtures/README.md).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import pytest

from agent import probe
from agent.classify import Reason, classify, tail
from agent.config_run import Host, Result, preflight
from agent.engines import ENGINES
from agent.records import Outcome
from agent.store import HostStore
from controller import matrix
from tests.agent.test_real_drafters import fake_target
from tools import tiny_drafters

FIXTURES = Path(__file__).parent.parent / "fixtures"
LAYERS, VOCAB = 2, 1542  # the target's num_hidden_layers and vocab_size


def _edit(folder: Path, **fields: Any) -> Path:
    """The drafter in `folder` with these config.json fields replaced (None: removed)."""
    config = json.loads((folder / "config.json").read_text())
    config.update(fields)
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}, indent=2))
    return folder


def build_drafters(root: Path) -> Dict[str, Path]:
    """The target (`target`) and every drafter the cases name, built under `root`; `absent` names nothing."""
    target = fake_target(root / "target", layers=LAYERS, vocab=VOCAB)
    out = {"target": target, "absent": root / "absent", "absent.gguf": root / "absent.gguf",
           **tiny_drafters.build_drafters(target, root), **tiny_drafters.bad_drafters(target, root)}
    # every tap of the target (0 before its first layer, i after layer i - 1) and one past its last
    out["eagle3-past-layers"] = tiny_drafters.build_eagle3(target, root / "eagle3-past-layers",
                                                           aux_layer_ids=range(LAYERS + 2))
    out["eagle3-other-vocab"] = _edit(tiny_drafters.build_eagle3(target, root / "eagle3-other-vocab"),
                                      vocab_size=2 * VOCAB, draft_vocab_size=2 * VOCAB)
    # SGLang reads EAGLE-3's taps under eagle_config only, as zero-based layers: 2 is past a 2-layer target
    out["eagle3-sglang-past-layers"] = _edit(
        tiny_drafters.build_eagle3(target, root / "eagle3-sglang-past-layers"), eagle_aux_hidden_state_layer_ids=None,
        eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 2]})
    return out


@dataclass(frozen=True)
class Case:
    """One config with one drafter: what the check says of it (`reason` None: nothing, it may start)."""

    id: str
    engine: str
    config: Dict[str, Any]  # the matrix config, its drafter added
    drafter: str            # which of build_drafters' folders
    reason: Optional[Reason] = None
    said: Tuple[str, ...] = field(default=())  # what its line names: the field, the value, the target's value


DFLASH8, DFLASH16, EAGLE3 = {"method": "dflash", "block_size": 8}, {"method": "dflash", "block_size": 16}, \
    {"method": "eagle3", "num_speculative_tokens": 3}
BAD, MISSING = Reason.INCOMPATIBLE_CONFIG, Reason.MISSING_MODEL
PAST = (f"num_hidden_layers {LAYERS} in the target's config.json",)
VOCABS = (f"vocab_size {2 * VOCAB} is not the target's", f"vocab_size {VOCAB} in the target's config.json")
NOTHING = ("no model there on the host", "no config.json", "draft_model.path")
BUILT_FOR_8 = ("larger than the block the drafter is built for", "dflash_config.block_size 8 in its config.json",
               "allowed: block_size at most 8")
CASES = [
    # target layers it taps that the target does not have
    Case("past-layers-dflash", "vllm", DFLASH8, "dflash-past-layers", BAD,
         ("dflash_config.target_layer_ids [0, 1, 2] names layer 2 the target does not have", *PAST,
          "allowed: 0 to 1")),
    Case("past-layers-dflash-sglang", "sglang", DFLASH8, "dflash-past-layers", BAD,
         ("dflash_config.target_layer_ids [0, 1, 2] names layer 2 ", *PAST, "allowed: 0 to 1")),
    Case("past-layers-eagle3", "vllm", EAGLE3, "eagle3-past-layers", BAD,
         ("eagle_aux_hidden_state_layer_ids [0, 1, 2, 3] names layer 3 the target does not have", *PAST,
          "allowed: 0 to 2, vLLM's taps")),
    Case("past-layers-eagle3-sglang", "sglang", EAGLE3, "eagle3-sglang-past-layers", BAD,
         ("eagle_config.eagle_aux_hidden_state_layer_ids [0, 1, 2] names layer 2 ", *PAST, "allowed: 0 to 1")),
    # another vocabulary
    Case("other-vocab-dflash", "vllm", DFLASH8, "dflash-other-vocab", BAD, VOCABS),
    Case("other-vocab-dflash-sglang", "sglang", DFLASH8, "dflash-other-vocab", BAD, VOCABS),
    Case("other-vocab-eagle3", "vllm", EAGLE3, "eagle3-other-vocab", BAD, VOCABS),
    # a path with nothing there
    Case("missing-dflash", "vllm", DFLASH8, "absent", MISSING, NOTHING),
    Case("missing-dflash-sglang", "sglang", DFLASH8, "absent", MISSING, NOTHING),
    Case("missing-eagle3", "vllm", EAGLE3, "absent", MISSING, NOTHING),
    Case("missing-gguf-llamacpp", "llamacpp", {"method": "dflash", "block_size": 4}, "absent.gguf", MISSING,
         ("no model there on the host", "no such file", "draft_model.path")),  # llama.cpp's drafter: one file
    # a block larger than the drafter's: given, or left to vLLM, which runs 16 whatever the drafter says
    Case("block-given-dflash", "vllm", DFLASH16, "dflash", BAD, ("block_size 16, ", *BUILT_FOR_8)),
    Case("block-given-dflash-sglang", "sglang", DFLASH16, "dflash", BAD, ("block_size 16, ", *BUILT_FOR_8)),
    Case("block-unset-dflash", "vllm", {"method": "dflash"}, "dflash", BAD,
         ("block_size is not set, so the server runs blocks of 16 (num_speculative_tokens 15 in "
          "--speculative-config; vLLM does not read the drafter's own block)", *BUILT_FOR_8)),
    # the good drafters (a smaller block than the drafter's is a shorter draft: it runs)
    Case("good-dflash", "vllm", DFLASH8, "dflash"),
    Case("good-dflash-b4", "vllm", {"method": "dflash", "block_size": 4}, "dflash"),
    Case("good-dflash-sglang", "sglang", DFLASH8, "dflash"),
    Case("good-dflash-unset-sglang", "sglang", {"method": "dflash"}, "dflash"),  # SGLang takes the drafter's 8
    Case("good-eagle3", "vllm", EAGLE3, "eagle3"),
]


def suite_of(case: Case, drafters: Dict[str, Path]) -> Dict[str, Any]:
    """A one-phase matrix: the baseline and the case's config (its id the case's) with its drafter."""
    config = {**case.config, "id": case.id, "draft_model": {"name": case.drafter, "path": str(drafters[case.drafter])}}
    return {"engine": case.engine, "engine_python": "/py", "model": {"name": "tiny", "path": str(drafters["target"])},
            "phases": [{"name": "tp1", "configs": [{"method": "autoregressive"}, config],
                        "sweeps": [{"workloads": ["fib"], "max_tokens": [8]}]}]}


def refusal(root: Path, case: Case, drafters: Dict[str, Path]) -> Tuple[Dict[str, Any], Optional[Result]]:
    """(the case's config as the plan expands it, what the agent's preflight says of it): the engine knows every
    flag of its command, so the drafter is the one thing judged."""
    checked = matrix.validate(suite_of(case, drafters))
    cfg = next(c for c in matrix.expand(checked) if c["config_id"] == f"tp1-{case.id}")
    flags = {probe.flag_name(a) for a in cfg["command"] if a.startswith("--")}
    host = Host(suite=checked.suite, engine=ENGINES[case.engine], store=HostStore(root, "h"), flags=flags)
    return cfg, preflight(host, cfg)


@pytest.fixture(scope="module")
def drafters(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    return build_drafters(tmp_path_factory.mktemp("drafters"))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_agent_refuses_a_drafter_that_cannot_serve_its_target(case: Case, drafters: Dict[str, Path],
                                                                   tmp_path: Path) -> None:
    cfg, res = refusal(tmp_path, case, drafters)
    if case.reason is None:
        assert res is None, res
        return
    assert res is not None and (res.status, res.reason) == (Outcome.FAILED, case.reason), res
    named = f"drafter {drafters[case.drafter]}: "
    assert res.detail is not None and res.detail.startswith(named), res.detail
    assert all(part in res.detail for part in case.said), (res.detail, case.said)
    assert "\n" not in res.detail and res.detail.count(named) == 1  # one line: each of these has one problem
    assert not (tmp_path / "h" / cfg["config_id"]).exists()  # nothing started, nothing recorded by preflight


def test_the_model_folder_read_holds_every_field_the_check_reads(drafters: Dict[str, Path]) -> None:
    """`agent.probe.model` (the plan's probe on the host, the agent before a start) gives the whole config.json:
    the drafter's and the target's fields the check reads are there as built."""
    dflash, eagle3 = (probe.model(str(drafters[k]))["config"] for k in ("dflash", "eagle3"))
    target = probe.model(str(drafters["target"]))["config"]
    assert (target["num_hidden_layers"], target["vocab_size"]) == (LAYERS, VOCAB)
    assert dflash["architectures"] == ["DFlashDraftModel"] and dflash["vocab_size"] == VOCAB
    assert dflash["dflash_config"]["target_layer_ids"] == [0, 1] and dflash["dflash_config"]["block_size"] == 8
    assert dflash["block_size"] == 8 and dflash["num_hidden_layers"] == 2
    assert eagle3["architectures"] == ["LlamaForCausalLMEagle3"] and eagle3["eagle_aux_hidden_state_layer_ids"] == \
        [0, 1, 2]
    assert probe.model(str(drafters["absent"])) == {"path": str(drafters["absent"]), "config": None,
                                                    "weights_bytes": None}


def test_a_hub_id_the_engine_may_fetch_and_an_unreadable_config_are_not_called_missing(
        drafters: Dict[str, Path], tmp_path: Path) -> None:
    """A drafter path shaped like a Hugging Face id ("owner/name") with no folder of that name is left to the engine,
    which may fetch it; a config.json that is there but cannot be read is the probe's `config_problem`, said by the
    plan's memory line instead."""
    case = Case("hub", "vllm", DFLASH8, "hub")
    for path in ("z-lab/Qwen3-8B-DFlash-b16", "drafter"):
        assert refusal(tmp_path, case, {**drafters, "hub": Path(path)})[1] is None
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "config.json")
    read = probe.model(str(fifo))
    assert read["config"] is None and "not a regular file" in read["config_problem"]
    assert refusal(tmp_path, case, {**drafters, "hub": fifo})[1] is None


# -- when such a drafter reaches the engine anyway: what it prints, classified ------------------------------------
@pytest.mark.parametrize("capture, reason, said", [
    ("vllm-0.32.0-dflash-past-layers.log", "incompatible_config",
     "ValueError: DFlash drafter expects 384 concatenated aux hidden features but received 256"),
    ("vllm-0.32.0-dflash-other-vocab.log", "incompatible_config", "IndexError: index out of range in self"),
    ("vllm-0.32.0-dflash-missing-drafter.log", "missing_model",
     "Invalid repository ID or local directory specified: '<models>/nonexistent'"),
])
def test_the_real_engines_own_messages_are_classified(capture: str, reason: str, said: str) -> None:
    """As the agent reads a server's log (its last 120 lines), the real engine's messages name the cause: the
    first two after /health answered 200, at the first request, the third at startup."""
    text = (FIXTURES / capture).read_text()
    assert said in text
    assert classify(tail(text, 120), Reason.CRASHED) == reason
    assert classify(tail(text, 120), Reason.WARMUP_FAILED) == reason


def test_sglangs_own_range_check_and_a_plain_index_error_elsewhere() -> None:
    """SGLang's DFlash range check (its message as dflash_utils.py writes it, 0.5.15 on) is incompatible_config; an
    IndexError outside an embedding says nothing of the drafter."""
    sglang = ("ValueError: DFLASH target_layer_ids contains an out-of-range layer id. target_layer_ids[2]=2, "
              "target_num_layers=2.")
    assert classify(sglang, Reason.CRASHED) == "incompatible_config"
    other = "  File \"x.py\", line 3, in pick\n    return items[i]\nIndexError: index out of range in self"
    assert classify(other, Reason.CRASHED) == "crashed"

"""A suite's secrets become `<secret:N>` placeholders, the same way for the same suite, and resolve back."""
from __future__ import annotations

import copy
from collections import OrderedDict
from enum import IntEnum
from types import MappingProxyType
from typing import Any

from agent.secrets import is_placeholder, plain, resolve, split


def suite() -> dict[str, Any]:
    """A suite with secrets at every level a secret can hide in."""
    return {
        "engine": "vllm",
        "model": {"name": "m", "path": "/models/m"},
        "api_key": "sk-suite-key-0123456789",
        "env": {"HF_TOKEN": "hf_suite", "CUDA_VISIBLE_DEVICES": "0,1", "EMPTY_TOKEN": ""},
        "server_args": ["--max-model-len", "4096", "--hf-token", "hf_suite"],
        "phases": [
            {"name": "p1", "env": {"wandb_api_key": "wb-phase", "VLLM_LOGGING_LEVEL": "DEBUG"},
             "server_args": ["--token=tok-phase", "--seed", "1"],
             "configs": [
                 {"method": "eagle", "env": {"DB_PASSWORD": "pw-config"},
                  "server_args": ["--api-key", "sk-suite-key-0123456789", "--tokenizer", "tok"]},
                 {"method": "autoregressive"},
             ]},
            {"name": "p2", "server_args": ["--api-key=sk-other", "--port", "9000"]},
        ],
    }


# -- plain --------------------------------------------------------------------------------------------


def test_plain_copies_into_plain_dicts_lists_and_scalars() -> None:
    class Text(str):
        pass

    class Level(IntEnum):
        HIGH = 2

    inner = [Text("a"), (1, 2.5), Level.HIGH, True, None]
    obj = MappingProxyType({"k": OrderedDict(x=inner), "t": (Text("b"),)})
    out = plain(obj)
    assert out == {"k": {"x": ["a", [1, 2.5], 2, True, None]}, "t": ["b"]}
    assert type(out) is dict and type(out["k"]) is dict and type(out["k"]["x"]) is list
    assert [type(v) for v in out["k"]["x"]] == [str, list, int, bool, type(None)] and type(out["t"][0]) is str
    out["k"]["x"].append("new")
    assert len(inner) == 5


# -- split --------------------------------------------------------------------------------------------


def test_split_replaces_every_secret_with_a_placeholder_and_nothing_else() -> None:
    hidden, found = split(suite())
    assert sorted(found.values()) == sorted(["sk-suite-key-0123456789", "hf_suite", "wb-phase", "tok-phase",
                                             "pw-config", "sk-other"])
    ph = {v: k for k, v in found.items()}
    assert all(is_placeholder(p) for p in found)
    assert hidden["api_key"] == ph["sk-suite-key-0123456789"]
    assert hidden["env"] == {"HF_TOKEN": ph["hf_suite"], "CUDA_VISIBLE_DEVICES": "0,1", "EMPTY_TOKEN": ""}
    assert hidden["server_args"] == ["--max-model-len", "4096", "--hf-token", ph["hf_suite"]]
    p1, p2 = hidden["phases"]
    assert p1["env"] == {"wandb_api_key": ph["wb-phase"], "VLLM_LOGGING_LEVEL": "DEBUG"}
    assert p1["server_args"] == [f"--token={ph['tok-phase']}", "--seed", "1"]
    c1, c2 = p1["configs"]
    assert c1 == {"method": "eagle", "env": {"DB_PASSWORD": ph["pw-config"]},
                  "server_args": ["--api-key", ph["sk-suite-key-0123456789"], "--tokenizer", "tok"]}
    assert c2 == {"method": "autoregressive"}
    assert p2["server_args"] == [f"--api-key={ph['sk-other']}", "--port", "9000"]
    assert hidden["model"] == {"name": "m", "path": "/models/m"} and hidden["engine"] == "vllm"


def test_the_same_value_twice_gets_the_same_placeholder() -> None:
    hidden, found = split({"api_key": "same-value", "env": {"A_TOKEN": "same-value", "B_SECRET": "other"},
                           "server_args": ["--token=same-value"]})
    assert len(found) == 2
    assert hidden["api_key"] == hidden["env"]["A_TOKEN"] == hidden["server_args"][0].split("=", 1)[1]
    assert hidden["env"]["B_SECRET"] != hidden["api_key"]


def test_a_suite_without_secrets_is_unchanged() -> None:
    s = {"engine": "vllm", "api_key": "", "env": {"PATH": "/bin"}, "server_args": ["--seed", "1"],
         "phases": [{"name": "p", "configs": [{"method": "ngram", "server_args": ["--port", "1"]}]}]}
    assert split(s) == (s, {})


def test_split_leaves_its_input_alone() -> None:
    s = suite()
    before = copy.deepcopy(s)
    hidden, _ = split(s)
    assert s == before and hidden != before


def test_split_is_deterministic_for_another_order_of_the_top_level_keys() -> None:
    """The controller splits the suite as given and again with its defaults filled in (keys reordered)."""
    s = suite()
    reordered = dict(reversed(list(s.items())))
    assert list(reordered) != list(s)
    assert split(reordered)[1] == split(s)[1]
    assert split(reordered)[0] == split(s)[0]
    assert split(suite()) == split(suite())


def test_malformed_parts_are_passed_over_not_fatal() -> None:
    s = {"api_key": 5, "env": ["HF_TOKEN=x"], "server_args": "--api-key x",
         "phases": [None, {"name": "p", "configs": "no", "env": {"A_TOKEN": 3}, "server_args": [1, "--token", 2]}]}
    hidden, found = split(s)
    # a number under a secret-looking name is a secret too; everything malformed is left for the validator
    assert found == {"<secret:0>": "3"}
    assert hidden == {**s, "phases": [None, {**s["phases"][1], "env": {"A_TOKEN": "<secret:0>"}}]}


# -- resolve, is_placeholder ---------------------------------------------------------------------------


def test_resolve_of_split_gives_back_the_plain_suite() -> None:
    s = suite()
    hidden, found = split(s)
    assert resolve(hidden, found) == plain(s)
    assert resolve(hidden, {}) == hidden  # unknown placeholders stay as they are


def test_resolve_replaces_placeholders_inside_strings_and_leaves_other_values() -> None:
    secrets = {"<secret:0>": "v0", "<secret:1>": "v1"}
    obj = {"a": "--api-key=<secret:0>", "b": ["<secret:1>", 3, None, True], "c": "<secret:9>", "d": "<secret:x>"}
    assert resolve(obj, secrets) == {"a": "--api-key=v0", "b": ["v1", 3, None, True], "c": "<secret:9>",
                                     "d": "<secret:x>"}


def test_is_placeholder_is_a_whole_placeholder_string_only() -> None:
    assert is_placeholder("<secret:0>") and is_placeholder("<secret:12>")
    for value in ["<secret:>", "<secret:a>", " <secret:0>", "<secret:0> ", "--api-key=<secret:0>", None, 0]:
        assert not is_placeholder(value)

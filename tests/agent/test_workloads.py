"""The built-in workloads (agent/workloads.py): each prompt is real text, the filler pads long-context prompts,
and `known()` names them all."""
from __future__ import annotations

import pytest

from agent import workloads

BUILT_IN = ("arith", "fib", "json", "qsort")


def test_known_lists_every_built_in_workload_in_order() -> None:
    assert workloads.known() == sorted(workloads.PROMPTS) == list(BUILT_IN)
    names = workloads.known()
    names.append("mine")  # a copy: the caller may change it
    assert workloads.known() == list(BUILT_IN)


@pytest.mark.parametrize("name", BUILT_IN)
def test_each_prompt_is_text(name: str) -> None:
    prompt = workloads.PROMPTS[name]
    assert isinstance(prompt, str) and prompt.strip()
    assert len(prompt.split()) >= 10  # a question, not a word
    assert prompt == prompt.lstrip()


def test_the_prompts_differ() -> None:
    assert len(set(workloads.PROMPTS.values())) == len(workloads.PROMPTS)


def test_the_filler_is_prose_that_repeats_cleanly() -> None:
    filler = workloads.FILLER
    assert isinstance(filler, str) and filler.strip() and len(filler.split()) >= 50
    # repeated to reach a context length: sentences stay apart
    assert filler.endswith(" ") and not filler.startswith(" ")
    assert filler.rstrip().endswith(".") and filler[0].isupper()
    assert not any(filler in prompt for prompt in workloads.PROMPTS.values())

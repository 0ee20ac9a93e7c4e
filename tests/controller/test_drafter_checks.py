"""The plan's host check on drafters (controller/hostcheck.py via plan.build): every config whose drafter cannot serve
its target fails the plan before anything starts, one line each naming the config, the drafter's path, the field and
the target's value, the same line the agent's refusal gives (tests/agent/test_drafter_refusal.py, whose table of
failure modes × methods × engines and whose drafters on disk these are); the good drafters are planned.

The host's answer is the real `agent.probe.model` of each folder the plan asks for; its engine part is the engine's
help as a probe reads it (every flag of the configs' commands), so that the drafter is the one thing judged.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest

from agent import probe
from controller import matrix, plan
from tests.agent.test_drafter_refusal import CASES, Case, build_drafters, refusal, suite_of

HOST = {"inventory_hostname": "gpu-01"}
HEAD = "gpu-01: these configs ask what the installed engine or the drafter cannot give (nothing was started):"


def asker(suite: Dict[str, Any], gpu_mib: int | None = None) -> Callable[[str, Dict[str, Any]], Dict[str, Any]]:
    """`ask` as the action plugin does it: the probe's answer, its models read by the real `probe.model`."""
    flags = sorted({probe.flag_name(a) for c in matrix.expand(matrix.validate(suite)) for a in c["command"]
                    if a.startswith("--")})

    def ask(python: str, request: Dict[str, Any]) -> Dict[str, Any]:
        answer = {"engine": {"version": "0.32.0", "flags": flags, "choices": {}, "features": {}, "defaults": {}},
                  "models": {k: probe.model(p) for k, p in request["models"].items()}, "gpu_memory_mib": gpu_mib}
        return {"rc": 0, "stdout": json.dumps(answer), "stderr": ""}
    return ask


def build(suite: Dict[str, Any], ask: Callable[..., Dict[str, Any]]) -> Dict[str, Any]:
    args = {"suite": suite, "run_id": "r1", "host_dir": "/var/lib/specfleet", "agent_python": "/usr/bin/python3",
            "limits": {}}
    return plan.build(args, HOST, ask)


def lines_of(res: Dict[str, Any]) -> List[str]:
    assert res.get("failed"), res.get("plan_lines")
    head, *lines = res["msg"].splitlines()
    assert head == HEAD
    return [line.strip() for line in lines]


@pytest.fixture(scope="module")
def drafters(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    return build_drafters(tmp_path_factory.mktemp("drafters"))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_plan_names_each_drafter_that_cannot_serve_its_target(case: Case, drafters: Dict[str, Path],
                                                                  tmp_path: Path) -> None:
    suite = suite_of(case, drafters)
    res = build(suite, asker(suite))
    _, refused = refusal(tmp_path, case, drafters)
    if case.reason is None:
        assert not res.get("failed"), res.get("msg")
        assert refused is None
        return
    [line] = lines_of(res)  # the baseline has no drafter: only the case's config is named
    assert refused is not None and line == f"tp1-{case.id}: {refused.detail}"  # the agent's line, word for word
    assert line.startswith(f"tp1-{case.id}: drafter {drafters[case.drafter]}: ")
    assert all(part in line for part in case.said), (line, case.said)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_one_plan_names_every_bad_config_once_in_order(engine: str, drafters: Dict[str, Path]) -> None:
    cases = [c for c in CASES if c.engine == engine]
    suite = suite_of(cases[0], drafters)
    suite["phases"][0]["configs"] = [{"method": "autoregressive"}] + [
        suite_of(c, drafters)["phases"][0]["configs"][1] for c in cases]
    lines = lines_of(build(suite, asker(suite)))
    assert [line.split(":", 1)[0] for line in lines] == [f"tp1-{c.id}" for c in cases if c.reason is not None]


def test_a_config_json_that_cannot_be_read_is_said_in_the_memory_line(drafters: Dict[str, Path],
                                                                     tmp_path: Path) -> None:
    """The probe says why a config.json that is there could not be read (a FIFO here: never opened, so nothing
    blocks); the plan shows it instead of 'no config.json or weights'."""
    target = tmp_path / "target"
    target.mkdir()
    os.mkfifo(target / "config.json")
    (target / "model.safetensors").write_bytes(b"\0" * 64)
    case = next(c for c in CASES if c.id == "good-dflash")
    suite = suite_of(case, {**drafters, "target": target})
    res = build(suite, asker(suite, gpu_mib=81559))
    assert not res.get("failed"), res.get("msg")
    said = [line for line in res["plan_lines"] if "config.json" in line]
    why = f"not checked: {target / 'config.json'}: a FIFO, not a regular file; allowed: a regular file of at most"
    assert said and all(why in line for line in said), said
    assert not any("no config.json or weights" in line for line in res["plan_lines"])

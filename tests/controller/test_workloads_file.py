"""`bench_workloads_file` (controller/matrix.py): a JSONL file of workloads on the controller, read by the plan
(`controller.plan.build`) into the configs beside the built-ins, usable by name in sweeps; every problem of the
file names the file, its line and its field, and fails the plan before the host is asked anything."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent import workloads
from agent.config_run import config_digest
from controller import matrix, plan

ROOT = Path(__file__).resolve().parents[2]
HOST = {"inventory_hostname": "gpu-01"}
CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three primes."}]


def suite_with(path: Path | str, sweep: list[str], **extra: Any) -> dict[str, Any]:
    suite = {"engine": "vllm", "engine_python": "/py", "model": {"name": "m", "path": "/m"},
             "workloads_file": str(path),
             "phases": [{"name": "tp1", "configs": [{"method": "autoregressive"},
                                                     {"method": "ngram", "num_speculative_tokens": 2}],
                         "sweeps": [{"workloads": sweep, "max_tokens": [64]}]}]}
    suite.update(extra)
    return suite


def build(suite: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The plan's result, and every request the plan made of the host (none once a problem is found)."""
    asked: list[dict[str, Any]] = []

    def ask(python: str, request: dict[str, Any]) -> dict[str, Any]:
        asked.append(request)
        return {"unreachable": True, "msg": "no host in this test"}

    args = {"suite": suite, "run_id": "20250101T000000Z", "host_dir": "/var/lib/specfleet",
            "limits": {"bench_async_s": 3600, "bench_follow_timeout_s": 7200, "bench_follow_interval_s": 2}}
    return plan.build(args, {**HOST, "bench_workloads_file": suite.get("workloads_file", "")}, ask), asked


def write(tmp_path: Path, *lines: Any, name: str = "prompts.jsonl") -> Path:
    path = tmp_path / name
    path.write_bytes(b"".join((x if isinstance(x, bytes) else json.dumps(x).encode()) + b"\n" for x in lines))
    return path


def test_workloads_of_the_file_reach_the_configs_beside_the_built_ins(tmp_path: Path) -> None:
    path = write(tmp_path, {"name": "haiku", "prompt": "Write a haiku about caches."}, b"",
                 {"name": "primes", "messages": CHAT}, b"   ")
    res, asked = build(suite_with(path, ["fib", "haiku", "primes"]))
    assert not res.get("failed"), res.get("msg")
    assert len(asked) == 1  # the matrix passed: the host is asked
    for cfg in res["configs"]:
        assert cfg["prompts"] == {"fib": workloads.PROMPTS["fib"], "haiku": "Write a haiku about caches.",
                                  "primes": CHAT}
        assert sorted({c["workload"] for c in cfg["cells"]}) == ["fib", "haiku", "primes"]
        assert cfg["requests"] == 3 * 3  # three workloads, three repetitions each
    assert "workloads fib,haiku,primes" in "\n".join(res["plan_lines"])


def test_a_file_with_windows_line_ends_and_unicode(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(json.dumps({"name": "umlaut", "prompt": "Grüße — 你好"}, ensure_ascii=False).encode()
                     + b"\r\n")
    res, _ = build(suite_with(path, ["umlaut"]))
    assert not res.get("failed"), res.get("msg")
    assert res["configs"][0]["prompts"] == {"umlaut": "Grüße — 你好"}


def test_a_sweep_using_a_name_the_file_does_not_hold_names_the_sweep_and_lists_the_file_s_names(
        tmp_path: Path) -> None:
    path = write(tmp_path, {"name": "haiku", "prompt": "Write a haiku."})
    res, asked = build(suite_with(path, ["fib", "limerick"]))
    assert res["failed"] and asked == []
    assert ("bench_phases[0].sweeps[0].workloads[1]: unknown workload 'limerick'; allowed: arith, fib, haiku, json, "
            "qsort") in res["msg"]


def test_without_a_file_its_workloads_are_unknown(tmp_path: Path) -> None:
    res, _ = build(suite_with("", ["haiku"]))
    assert res["failed"] and "unknown workload 'haiku'; allowed: arith, fib, json, qsort" in res["msg"]


BAD_CASES = [
    pytest.param([b'{"name": "a", "prompt": "x"', {"name": "b", "prompt": "y"}],
                 "line 1: not valid JSON (Expecting ',' delimiter at column 28)", id="bad-json"),
    pytest.param([b"\xff\xfe{}"], "line 1: not UTF-8 text", id="not-utf8"),
    pytest.param([{"name": "a", "prompt": "x"}, ["b", "y"]], "line 2: a list, not a mapping", id="not-a-mapping"),
    pytest.param([{"prompt": "x"}], "line 1, field name: missing; allowed: a name of letters", id="missing-name"),
    pytest.param([{"name": "a b", "prompt": "x"}], "line 1, field name: 'a b' is not a valid name", id="bad-name"),
    pytest.param([{"name": 7, "prompt": "x"}], "line 1, field name: 7 is not a valid name", id="name-not-text"),
    pytest.param([{"name": "a", "prompt": "x"}, {"name": "c", "prompt": "z"}, {"name": "a", "prompt": "y"}],
                 "line 3, field name: 'a' is already the name of line 1; allowed: a name no other line has",
                 id="duplicate"),
    pytest.param([{"name": "qsort", "prompt": "x"}],
                 "line 1, field name: 'qsort' is already a built-in workload; allowed: another name", id="built-in"),
    pytest.param([{"name": "mine", "prompt": "x"}],
                 "line 1, field name: 'mine' is already a workload of bench_workloads", id="bench-workloads"),
    pytest.param([{"name": "a", "prompt": "x", "messages": CHAT}],
                 "line 1, field prompt, messages: both given; allowed: exactly one of prompt (text) or messages",
                 id="both"),
    pytest.param([{"name": "a"}], "line 1, field prompt, messages: neither given", id="neither"),
    pytest.param([{"name": "a", "promt": "x"}], "line 1, field promt: unknown field; allowed: name, prompt, messages",
                 id="unknown-field"),
    pytest.param([{"name": "a", "prompt": ""}], "line 1, field prompt: '' is not a non-empty string", id="empty"),
    pytest.param([{"name": "a", "prompt": ["x"]}], "line 1, field prompt: a list is not a non-empty string",
                 id="prompt-not-text"),
    pytest.param([{"name": "a", "prompt": "x\u0000y"}], "line 1, field prompt: holds a NUL byte", id="nul"),
    pytest.param([{"name": "a", "prompt": "say <secret:0>"}],
                 "line 1, field prompt: holds text of the form <secret:N>", id="placeholder"),
    pytest.param([{"name": "a", "messages": []}], "line 1, field messages: [] is not a non-empty list", id="no-msgs"),
    pytest.param([{"name": "a", "messages": [CHAT[0], "hi"]}],
                 "line 1, field messages[1]: a string, not a mapping", id="message-not-a-mapping"),
    pytest.param([{"name": "a", "messages": [{"content": "hi"}]}],
                 "line 1, field messages[0].role: missing; allowed: a non-empty string", id="no-role"),
    pytest.param([{"name": "a", "messages": [{"role": "user", "content": 3}]}],
                 "line 1, field messages[0].content: 3 is not a string; allowed: a string", id="content-not-text"),
    pytest.param([{"name": "a", "messages": [{"role": "user", "content": "hi", "name": "x"}]}],
                 "line 1, field messages[0].name: unknown field; allowed: role, content", id="message-extra"),
]


@pytest.mark.parametrize("lines, expected", BAD_CASES)
def test_every_problem_of_the_file_fails_the_plan_naming_file_line_and_field(tmp_path: Path, lines: list[Any],
                                                                             expected: str) -> None:
    path = write(tmp_path, *lines)
    res, asked = build(suite_with(path, ["fib"], workloads={"mine": "my own prompt"}))
    assert res["failed"] and asked == []
    assert res["msg"].startswith("invalid benchmark matrix for gpu-01:\n")
    assert f"bench_workloads_file {path} {expected}" in res["msg"], res["msg"]


def test_all_the_file_s_problems_are_listed_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, {"name": "a"}, b"{", {"name": "a", "prompt": "x"}, {"name": "b", "prompt": "y"})
    res, _ = build(suite_with(path, ["a", "b"]))
    where = f"bench_workloads_file {path}"
    assert [line.split(";")[0] for line in res["msg"].splitlines()[1:]] == [
        f"{where} line 1, field prompt, messages: neither given",
        f"{where} line 2: not valid JSON (Expecting property name enclosed in double quotes at column 2)",
        f"{where} line 3, field name: 'a' is already the name of line 1",
        "bench_phases[0].sweeps[0].workloads[0]: unknown workload 'a'"]


def test_a_file_that_cannot_be_read(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.jsonl"
    res, asked = build(suite_with(missing, ["fib"]))
    assert res["failed"] and asked == []
    assert f"bench_workloads_file: cannot read {missing}: No such file or directory" in res["msg"]
    res, _ = build(suite_with(tmp_path, ["fib"]))
    assert (f"bench_workloads_file: cannot read {tmp_path}: a directory, not a regular file; allowed: a regular "
            "file of at most 8 MiB") in res["msg"]


def test_the_variable_itself_is_type_checked(tmp_path: Path) -> None:
    res, _ = build(suite_with(str(tmp_path), ["fib"], workloads_file=["a.jsonl"]))
    assert res["failed"] and "bench_workloads_file: a list is not of type 'string' or 'null'" in res["msg"]


def test_an_empty_or_null_file_setting_adds_nothing(tmp_path: Path) -> None:
    for value in ("", None):
        res, _ = build(suite_with("", ["fib"], workloads_file=value))
        assert not res.get("failed"), res.get("msg")
        assert res["configs"][0]["prompts"] == {"fib": workloads.PROMPTS["fib"]}


def test_a_changed_file_changes_the_configs_digest(tmp_path: Path) -> None:
    """A result kept from an earlier start of the run must have measured the same prompts."""
    path = write(tmp_path, {"name": "haiku", "prompt": "Write a haiku."})
    before = matrix.expand(suite_with(path, ["haiku"]))
    write(tmp_path, {"name": "haiku", "prompt": "Write a limerick."})
    after = matrix.expand(suite_with(path, ["haiku"]))
    assert [c["config_id"] for c in before] == [c["config_id"] for c in after]
    assert all(config_digest(a) != config_digest(b) for a, b in zip(before, after))


def test_the_file_s_workloads_survive_hiding_the_secrets(tmp_path: Path) -> None:
    path = write(tmp_path, {"name": "primes", "messages": CHAT})
    checked = matrix.validate(suite_with(path, ["primes"], api_key="sk-0123456789abcdef0123"))
    hidden = checked.hide({**checked.suite, "api_key": "<secret:0>"})
    assert hidden.file_workloads == {"primes": CHAT}
    assert [c["prompts"] for c in matrix.expand(hidden)] == [{"primes": CHAT}] * 2


def test_the_role_declares_the_variable_with_the_matrix_default() -> None:
    defaults = yaml.safe_load((ROOT / "roles/bench/defaults/main.yml").read_text())
    specs = yaml.safe_load((ROOT / "roles/bench/meta/argument_specs.yml").read_text())["argument_specs"]
    for name in ("workloads_file", "progress_s"):
        assert defaults[f"bench_{name}"] == matrix.DEFAULTS[name]
        assert specs["plan"]["options"][f"bench_{name}"]["default"] == matrix.DEFAULTS[name]
        assert f"bench_{name}" in plan.known_variables()

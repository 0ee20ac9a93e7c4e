"""The `bench_plan` logic (controller/plan.py): strict switches, phase selection, the invocation's checks, unknown
variables, and the plan built from a suite with every secret replaced by a placeholder."""
from __future__ import annotations

import json
import re
from typing import Any

import pytest

from controller import matrix, plan

API_KEY = "sk-live-0123456789abcdefghij"  # 28 characters
HF_TOKEN = "hf_QWERTYUIOPasdfghjkl0987"


def small_suite(**extra: Any) -> dict[str, Any]:
    suite = {"engine": "vllm", "engine_python": "/py", "model": {"name": "m", "path": "/m"},
             "phases": [{"name": "tp1", "configs": [{"method": "autoregressive"},
                                                     {"method": "ngram", "num_speculative_tokens": 2}],
                         "sweeps": [{"workloads": ["fib"], "max_tokens": [64], "concurrency": [1, 2]}]}]}
    suite.update(extra)
    return suite


def args_of(suite: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"suite": suite, "run_id": "20250101T000000Z", "host_dir": "/var/lib/specfleet",
            "limits": {"bench_async_s": 3600, "bench_follow_timeout_s": 7200, "bench_follow_interval_s": 2},
            **extra}


HOST = {"inventory_hostname": "gpu-01"}


# --- switch ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [
    (True, True), (False, False), ("true", True), ("True", True), ("TRUE", True), (" yes ", True), ("1", True),
    (1, True), ("false", False), ("no", False), ("No", False), ("0", False), (0, False),
])
def test_switch_accepts_the_boolean_spellings(value: Any, expected: bool) -> None:
    problems: list[str] = []
    assert plan.switch("plan", value, problems) is expected
    assert problems == []


@pytest.mark.parametrize("value", ["ture", "y", "", "on", 2, -1, 1.0, None, [], {"a": 1}])
def test_switch_rejects_anything_else_and_names_the_switch(value: Any) -> None:
    problems: list[str] = []
    assert plan.switch("force", value, problems) is False
    assert len(problems) == 1
    assert problems[0].startswith("force: ")
    assert "is not a boolean; allowed: true, false, yes, no, 1, 0" in problems[0]
    assert "-e force=true" in problems[0]


def test_switch_typo_shows_the_value() -> None:
    problems: list[str] = []
    plan.switch("plan", "ture", problems)
    assert problems == ["plan: 'ture' is not a boolean; allowed: true, false, yes, no, 1, 0 (e.g. -e plan=true)"]


# --- phase_names ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [
    ("tp1,tp4", ["tp1", "tp4"]),
    (" tp1 , tp4 ,", ["tp1", "tp4"]),
    ("tp1", ["tp1"]),
    (["tp1", "tp4"], ["tp1", "tp4"]),
    (["tp1", 4], ["tp1", "4"]),
    (4, ["4"]),
    (None, None), ("", None), ([], None), (",", None), ([" "], None),
])
def test_phase_names(value: Any, expected: list[str] | None) -> None:
    problems: list[str] = []
    assert plan.phase_names(value, problems) == expected
    assert problems == []


@pytest.mark.parametrize("value", [{"tp1": True}, True, [True], ["tp1", None], 1.5])
def test_phase_names_rejects_other_shapes(value: Any) -> None:
    problems: list[str] = []
    assert plan.phase_names(value, problems) is None
    assert len(problems) == 1 and problems[0].startswith("phases: ")
    assert "is not a list of phase names" in problems[0] and "-e phases=tp1,tp4" in problems[0]


def test_phase_names_mapping_is_not_shown_by_value() -> None:
    problems: list[str] = []
    plan.phase_names({"secretish": "x"}, problems)
    assert problems[0].startswith("phases: a mapping is not a list of phase names")


# --- run_checks -----------------------------------------------------------------------------------------------

def good_run_args(**extra: Any) -> dict[str, Any]:
    return {"run_id": "r-1.a_b", "host_dir": "/srv/bench", "limits": {"bench_async_s": 1, "bench_follow_timeout_s": 9},
            **extra}


def test_run_checks_normalises_a_valid_invocation() -> None:
    problems: list[str] = []
    out = plan.run_checks(good_run_args(plan="yes", force=0, phases="tp1,tp2", skip_unsupported="true",
                                        wait_for_host="yes", configs="dflash, ddtree-b16", sweeps=["short", 2]),
                          "gpu-01.example", problems)
    assert problems == []
    assert out == {"plan_only": True, "force": False, "skip_unsupported": True, "wait_for_host": True,
                   "phases": ["tp1", "tp2"],
                   "config_names": ["dflash", "ddtree-b16"], "sweep_names": ["short", "2"], "run_id": "r-1.a_b"}


def test_run_checks_defaults() -> None:
    problems: list[str] = []
    out = plan.run_checks({"run_id": 20250101, "host_dir": "/x"}, "h", problems)
    assert problems == []
    assert out == {"plan_only": False, "force": False, "skip_unsupported": False, "wait_for_host": False,
                   "phases": None, "config_names": None, "sweep_names": None, "run_id": "20250101"}


@pytest.mark.parametrize("host", ["bad host", "-leading-dash", "a/b", "x" * 65, "h\n", ""])
def test_run_checks_rejects_host_names_unusable_as_folders(host: str) -> None:
    problems: list[str] = []
    plan.run_checks(good_run_args(), host, problems)
    assert len(problems) == 1
    assert problems[0].startswith("inventory host ") and "not usable as a results folder name" in problems[0]


@pytest.mark.parametrize("run_id", ["r1\n", "a" * 300, "../up", "", " r1", None, True, 1.5, ["r1"], "r1/x"])
def test_run_checks_rejects_bad_run_ids(run_id: Any) -> None:
    problems: list[str] = []
    plan.run_checks(good_run_args(run_id=run_id), "h", problems)
    assert len(problems) == 1, problems
    assert problems[0].startswith("run_id: ") and "is not a valid run id" in problems[0]


def test_run_checks_accepts_a_run_id_of_64_characters_only() -> None:
    problems: list[str] = []
    plan.run_checks(good_run_args(run_id="a" * 64), "h", problems)
    assert problems == []
    plan.run_checks(good_run_args(run_id="a" * 65), "h", problems)
    assert len(problems) == 1


def test_run_checks_long_run_id_is_shortened_in_the_message() -> None:
    problems: list[str] = []
    plan.run_checks(good_run_args(run_id="a" * 300), "h", problems)
    assert "a" * 100 not in problems[0] and "..." in problems[0]


@pytest.mark.parametrize("host_dir", ["relative/dir", "~/bench", "", None, 5, "/srv/be\nnch", "/srv/\tx"])
def test_run_checks_rejects_a_host_dir_that_is_not_an_absolute_printable_path(host_dir: Any) -> None:
    problems: list[str] = []
    plan.run_checks(good_run_args(host_dir=host_dir), "h", problems)
    assert len(problems) == 1
    assert problems[0].startswith("bench_host_dir: ") and "is not an absolute path" in problems[0]


@pytest.mark.parametrize("value", [0, -5, "60", 1.5, 2.0, True, False, None, [60]])
def test_run_checks_rejects_limits_that_are_not_positive_ints(value: Any) -> None:
    problems: list[str] = []
    plan.run_checks(good_run_args(limits={"bench_async_s": 10, "bench_follow_interval_s": value}), "h", problems)
    assert len(problems) == 1
    assert problems[0].startswith("bench_follow_interval_s: ")
    assert "is not a positive whole number of seconds; allowed: an integer >= 1" in problems[0]


def test_run_checks_collects_every_problem() -> None:
    problems: list[str] = []
    plan.run_checks({"run_id": "r1\n", "host_dir": "rel", "plan": "ture", "force": "maybe", "phases": {"a": 1},
                     "limits": {"bench_async_s": 0}}, "bad host", problems)
    heads = sorted(p.split(":")[0] for p in problems)
    assert heads == ["bench_async_s", "bench_host_dir", "force", "inventory host 'bad host'", "phases", "plan",
                     "run_id"]


# --- known / unknown variables --------------------------------------------------------------------------------

def test_known_variables_include_the_role_defaults_and_specs() -> None:
    known = plan.known_variables()
    assert {"bench_repetitions", "bench_phases", "bench_api_key", "bench_host_dir", "bench_run_id",
            "bench_plan_only", "bench_follow_interval_s"} <= known
    assert all(name.startswith("bench_") for name in known)


def test_unknown_variable_suggests_the_closest_known_name() -> None:
    out = plan.unknown_variables({"bench_repetiton": 3, "bench_repetitions": 2, "other": 1,
                                  "inventory_hostname": "h"})
    assert out == ["bench_repetiton: unknown variable; did you mean bench_repetitions?"]


def test_unknown_variable_without_a_close_name_lists_the_allowed_ones() -> None:
    [line] = plan.unknown_variables({"bench_zzzzzzzzzzzzzzzzzzzzzz": 1})
    assert line.startswith("bench_zzzzzzzzzzzzzzzzzzzzzz: unknown variable; allowed: ")
    assert "bench_repetitions" in line and "did you mean" not in line


def test_known_variables_are_not_reported() -> None:
    assert plan.unknown_variables({name: 1 for name in plan.known_variables()}) == []


# --- build ----------------------------------------------------------------------------------------------------

def test_build_a_valid_small_suite() -> None:
    res = plan.build(args_of(small_suite()), HOST)
    assert not res.get("failed"), res.get("msg")
    assert res["changed"] is False
    assert [c["config_id"] for c in res["configs"]] == ["tp1-autoregressive", "tp1-ngram-k2"]
    # 1 workload x 1 max_tokens x 3 repetitions (the default) at concurrency 1 and 2: 3 x (1 + 2) per config
    assert [c["requests"] for c in res["configs"]] == [9, 9]
    assert res["requests"] == 18
    assert res["estimate_s"] == pytest.approx(sum(c["estimate_s"] for c in res["configs"]))
    assert res["estimate_s"] > 0
    assert res["plan_only"] is False and res["force"] is False and res["phases"] is None
    assert res["run_id"] == "20250101T000000Z"
    assert res["suite"]["repetitions"] == 3  # the defaults are filled in
    lines = res["plan_lines"]
    assert re.fullmatch(r"Plan for gpu-01: 2 configs, 18 timed requests, estimated \d+:\d\d:\d\d", lines[0])
    assert any(line.startswith("[1/2] tp1-autoregressive  (vllm, autoregressive") for line in lines)
    assert any(line.startswith("[2/2] tp1-ngram-k2  (vllm, ngram") for line in lines)
    assert lines[-1] == "    ({port} is a free port chosen on the host at launch)"
    json.dumps(res)  # the task result is plain JSON


def test_build_selects_phases_and_switches() -> None:
    suite = small_suite()
    suite["phases"].append({"name": "tp2", "tp": 1, "configs": [{"method": "autoregressive"}],
                            "sweeps": [{"workloads": ["fib"]}]})
    res = plan.build(args_of(suite, phases="tp2", plan="true", force="yes"), HOST)
    assert not res.get("failed"), res.get("msg")
    assert [c["config_id"] for c in res["configs"]] == ["tp2-autoregressive"]
    assert res["phases"] == ["tp2"] and res["plan_only"] is True and res["force"] is True
    assert res["plan_lines"][0].startswith("Plan for gpu-01: 1 configs, ")


def test_build_keeps_every_secret_out_of_its_result() -> None:
    suite = small_suite(api_key=API_KEY, env={"HF_TOKEN": HF_TOKEN}, server_args=["--hf-token", HF_TOKEN])
    suite["phases"][0]["configs"][1]["env"] = {"MY_SECRET": API_KEY[::-1]}
    res = plan.build(args_of(suite), HOST)
    assert not res.get("failed"), res.get("msg")
    text = json.dumps(res)
    for secret in (API_KEY, HF_TOKEN, API_KEY[::-1]):
        assert secret not in text
        assert secret[:12] not in text
    placeholders = set(re.findall(r"<secret:\d+>", text))
    assert placeholders == {"<secret:0>", "<secret:1>", "<secret:2>"}
    assert res["suite"]["api_key"] == "<secret:0>"
    assert res["suite"]["env"] == {"HF_TOKEN": "<secret:1>"}
    assert all(c["env"]["HF_TOKEN"] == "<secret:1>" for c in res["configs"])
    assert all(c["env"]["VLLM_API_KEY"] == "<secret:0>" for c in res["configs"])
    # the plan text redacts even the placeholders
    plan_text = "\n".join(res["plan_lines"])
    assert "HF_TOKEN='<redacted>'" in plan_text and "<secret:" not in plan_text


def test_build_with_the_same_suite_gives_the_same_placeholders() -> None:
    suite = small_suite(api_key=API_KEY, env={"HF_TOKEN": HF_TOKEN})
    assert plan.build(args_of(suite), HOST) == plan.build(args_of(suite), HOST)


def test_build_hides_a_numeric_secret_env_value() -> None:
    res = plan.build(args_of(small_suite(env={"HF_TOKEN": 98765432109876543210})), HOST)
    assert not res.get("failed"), res.get("msg")
    assert "98765432109876543210" not in json.dumps(res)


@pytest.mark.parametrize("mutation, expected", [
    (lambda s: s["phases"][0].update(tp=8), "bench_phases[0].tp: 8 is above the host's GPU count (0)"),
    (lambda s: s.update(repetitions=0), "bench_repetitions: 0 is less than the minimum of 1"),
    (lambda s: s.update(engine="tgi"), "bench_engine: 'tgi' is not one of llamacpp, sglang, vllm"),
    (lambda s: s["phases"][0]["sweeps"][0].update(workloads=["poem"]),
     "bench_phases[0].sweeps[0].workloads[0]: unknown workload 'poem'"),
    (lambda s: s.pop("model"), "bench_model: is required"),
])
def test_build_of_an_invalid_suite_fails_naming_the_field(mutation: Any, expected: str) -> None:
    suite = small_suite(api_key=API_KEY)
    mutation(suite)
    res = plan.build(args_of(suite), HOST)
    assert res["failed"] is True
    assert res["msg"].startswith("invalid benchmark matrix for gpu-01:\n")
    assert expected in res["msg"]
    assert "configs" not in res and "plan_lines" not in res
    assert API_KEY not in json.dumps(res)


def test_build_with_a_secret_in_an_invalid_place_does_not_show_it() -> None:
    res = plan.build(args_of(small_suite(api_key=API_KEY + " x", env={"HF_TOKEN": [HF_TOKEN]})), HOST)
    assert res["failed"] is True
    assert "bench_env.HF_TOKEN" in res["msg"]
    assert API_KEY not in res["msg"] and HF_TOKEN not in res["msg"]


def test_build_of_an_empty_suite_names_the_required_fields() -> None:
    res = plan.build({"run_id": "r1", "host_dir": "/x"}, HOST)
    assert res["failed"] is True
    assert "bench_model: is required" in res["msg"] and "bench_phases: is required" in res["msg"]


def test_build_unknown_phase_is_named() -> None:
    res = plan.build(args_of(small_suite(), phases="tp9"), HOST)
    assert res["failed"] is True
    assert "phases: unknown phase 'tp9'; allowed: tp1" in res["msg"]


def test_build_reports_invocation_problems_before_the_matrix() -> None:
    res = plan.build(args_of({"engine": "tgi"}, run_id="r1\n", plan="ture"), {**HOST, "bench_repetiton": 2})
    assert res["failed"] is True
    lines = res["msg"].splitlines()
    assert lines[0] == "invalid benchmark matrix for gpu-01:"
    assert "bench_repetiton: unknown variable; did you mean bench_repetitions?" in lines
    assert any(line.startswith("run_id: 'r1\\n' is not a valid run id") for line in lines)
    assert any(line.startswith("plan: 'ture' is not a boolean") for line in lines)
    assert not any("bench_engine" in line for line in lines)  # the matrix waits for a valid invocation


def test_build_without_an_inventory_hostname_fails() -> None:
    res = plan.build(args_of(small_suite()), {})
    assert res["failed"] is True and "inventory host '?'" in res["msg"]


# --- describe -------------------------------------------------------------------------------------------------

def test_describe_without_the_suite_lists_only_configs() -> None:
    res = plan.build(args_of(small_suite()), HOST)
    lines = plan.describe("gpu-01", res["configs"])
    assert lines[0] == res["plan_lines"][0]
    assert not any(line.startswith("    bench_") for line in lines)
    assert sum(line.startswith("[") for line in lines) == 2
    cells = [line for line in lines if line.startswith("    cells over:")]
    assert cells[0] == "    cells over: workloads fib; max_tokens 64; context 0; concurrency 1,2; reps 3"


def test_the_plan_warns_about_unpinned_model_revisions() -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    suite = matrix.with_defaults({"model": {"name": "m", "path": "/m", "revision": "main"},
                                  "draft_model": {"name": "d", "path": "/d", "revision": commit}})
    [warning] = plan.unpinned(suite)
    assert warning.startswith("bench_model.revision 'main' is not pinned")
    suite["model"]["revision"] = None
    assert "bench_model.revision None" in plan.unpinned(suite)[0]
    suite["model"]["revision"] = commit
    assert plan.unpinned(suite) == []
    lines = plan.describe("h", [], {**suite, "draft_model": {"name": "d", "path": "/d", "revision": "v1"}})
    assert any(line.startswith("    warning: bench_draft_model.revision 'v1'") for line in lines)


GOOD_SERVICE = {"user": "specfleet", "limit_nofile": 65536, "read_only_paths": ["/models", "-/opt/venv"],
                "read_write_paths": [], "device_allow": ["/dev/nvidia[0-9]* rw", "char-nvidia-uvm rw"]}


@pytest.mark.parametrize("key, value, field", [
    ("user", "spec fleet", "bench_service_user"),
    ("user", "root\nExecStartPre=/bin/sh", "bench_service_user"),
    ("user", "Specfleet", "bench_service_user"),
    ("limit_nofile", 0, "bench_service_limit_nofile"),
    ("limit_nofile", "65536\nUser=root", "bench_service_limit_nofile"),
    ("limit_nofile", True, "bench_service_limit_nofile"),
    ("read_only_paths", ["/models\nExecStartPre=/bin/sh"], "bench_service_read_only_paths[0]"),
    ("read_only_paths", ["models"], "bench_service_read_only_paths[0]"),
    ("read_write_paths", ["/data/my results"], "bench_service_read_write_paths[0]"),
    ("read_write_paths", ["/data/%h"], "bench_service_read_write_paths[0]"),
    ("read_write_paths", "/data", "bench_service_read_write_paths"),
    ("device_allow", ["/dev/nvidia0 rw\nDeviceAllow=/dev/sda rw"], "bench_service_device_allow[0]"),
    ("device_allow", ["/dev/nvidia0 rwx"], "bench_service_device_allow"),
    ("device_allow", ["nvidia0 rw"], "bench_service_device_allow"),
    ("device_allow", [7], "bench_service_device_allow"),
])
def test_values_that_reach_the_unit_are_checked_before_any_host(key: str, value: Any, field: str) -> None:
    """Each value the systemd backend writes into the engine's unit: a newline would start a unit line of its own,
    a space split a path, a `%` be read as a specifier. Refused by the plan, before the host is asked anything."""
    assert plan.service_problems(GOOD_SERVICE) == []
    problems = plan.service_problems({**GOOD_SERVICE, key: value})
    assert problems and all(p.startswith(f"{field}") for p in problems), problems
    asked: list[Any] = []
    res = plan.build({**good_run_args(), "suite": {}, "service": {**GOOD_SERVICE, key: value}},
                     {"inventory_hostname": "ct200"}, lambda *a: asked.append(a))
    assert res["failed"] and field in res["msg"] and asked == []


# The programs the host runs: (which, value, backend, the message's start or None when accepted). The agent's
# Python goes into the unit's ExecStart under the systemd backend; the engine's only into the launch's argv.
PROGRAMS = [
    ("agent_python", "/usr/bin/python3", "systemd", None),
    ("agent_python", "/opt/my venv/bin/python", "process", None),          # a space: fine outside a unit
    ("agent_python", "/opt/my venv/bin/python", "systemd", "is not a path the unit's ExecStart can take"),
    ("agent_python", "/usr/bin/python3 %h", "systemd", "is not a path the unit's ExecStart can take"),
    ("agent_python", "python3", "systemd", "is not a path the unit's ExecStart can take"),
    ("agent_python", "/usr/bin/python3\nUser=root", "systemd", "is not a program path"),
    ("agent_python", "/usr/bin/python3\tx", "process", "is not a program path"),
    ("agent_python", "/usr/bin/py\u2028thon", "process", "is not a program path"),   # a line separator
    ("agent_python", "", "process", "is not a program path"),
    ("engine_python", "/opt/my venv/bin/python", "systemd", None),          # argv only: any one-line path
    ("engine_python", "/usr/bin/python3\nx", "systemd", "is not a program path"),
    ("engine_python", "/usr/bin/python3\rx", "process", "is not a program path"),
]


@pytest.mark.parametrize("name, value, backend, said", PROGRAMS)
def test_programs_the_host_runs_are_checked_for_where_they_go(name: str, value: str, backend: str,
                                                             said: str | None) -> None:
    suite = small_suite(backend=backend, **({"engine_python": value} if name == "engine_python" else {}))
    args = args_of(suite, **({"agent_python": value} if name == "agent_python" else {}))
    asked: list[Any] = []
    res = plan.build(args, HOST, (lambda *a: asked.append(a)) if said else None)  # refused: the host never asked
    lines = [line for line in str(res.get("msg", "")).splitlines() if line.startswith(f"bench_{name}:")]
    if said is None:
        assert lines == [], res.get("msg")
    else:
        assert res["failed"] and len(lines) == 1 and said in lines[0] and asked == [], res.get("msg")


# --- bench_max_plan_hours ---------------------------------------------------------------------------------------

def _many_configs(n: int) -> list[dict[str, Any]]:
    return [{"method": "autoregressive"}] + [{"method": "ngram", "num_speculative_tokens": k} for k in range(1, n)]


@pytest.mark.parametrize("extra", [
    {"estimate": {"tok_s": 0.01}},                                    # a slow engine
    {"repetitions": 1000, "estimate": {"tok_s": 1}},                  # many repetitions
    {"estimate": {"startup_s": 86400}},                               # a startup of a day per config
    {"phases": [{"name": "tp1", "configs": _many_configs(60), "sweeps": [
        {"workloads": ["fib", "json"], "max_tokens": [4096], "concurrency": [1, 64], "repetitions": 20}]}],
     "estimate": {"tok_s": 10}},                                      # a wide matrix
], ids=["slow", "repetitions", "startup", "wide"])
def test_a_plan_past_the_hour_cap_fails_with_its_estimate_and_the_switch(extra: dict[str, Any]) -> None:
    asked: list[Any] = []
    res = plan.build(args_of(small_suite(**extra)), HOST, ask=lambda *a: asked.append(a) or {})
    assert res.get("failed"), res
    msg = res["msg"]
    m = re.match(r"gpu-01: the plan is estimated at (\d+):(\d\d):(\d\d) \((\d+) configs, (\d+) timed requests\), "
                 r"past bench_max_plan_hours 24; nothing was started\.", msg)
    assert m and int(m.group(1)) >= 24, msg
    allowed = int(re.search(r"-e bench_max_plan_hours=(\d+)$", msg).group(1))
    assert allowed > int(m.group(1)) - 1 and "-e phases=" in msg and "-e configs=" in msg
    assert asked == []  # refused before the host was asked anything
    again = plan.build(args_of(small_suite(**extra, max_plan_hours=allowed)), HOST)
    assert not again.get("failed"), again.get("msg")
    assert again["estimate_s"] <= allowed * 3600


@pytest.mark.parametrize("hours", [0, -1, "x", None])
def test_max_plan_hours_must_be_a_positive_number(hours: Any) -> None:
    res = plan.build(args_of(small_suite(max_plan_hours=hours)), HOST)
    assert res.get("failed") and "bench_max_plan_hours" in res["msg"], res


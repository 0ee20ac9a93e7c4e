"""YAML's own spellings of the special numbers (`.inf`, `-.inf`, `.nan`, in every case, with or without `+`), over
every field the matrix declares, in both forms they arrive in: a float (group_vars and host_vars YAML, `-e` JSON or
YAML) and a string (`-e key=value`, a quoted value). A field that takes inf (declared `settings.INF`) takes each
spelling of infinity as inf; minus infinity and NaN anywhere are refused naming the field, with a message that is
true of the value (never "not a number" of a float, nor "write it unquoted" of text no field would take)."""
from __future__ import annotations

import math
from typing import Any

import pytest
import yaml
from ansible.parsing.splitter import parse_kv
from ansible.parsing.utils.yaml import from_yaml

from controller import matrix, plan, settings
from controller.schema_errors import field_path, shown
from tests.controller.test_field_classes import base, declared, get, place, problems, types

Parts = tuple[Any, ...]
CASES = ("inf", "Inf", "INF")
INF_YAML = [f"{sign}.{c}" for sign in ("", "+") for c in CASES]                  # floats to YAML
MINUS_INF_YAML = [f"-.{c}" for c in CASES]
NAN_YAML = [".nan", ".NaN", ".NAN"]
INF_TEXT = [*INF_YAML, "inf", "Inf", "+inf", "Infinity", "infinity", " inf "]  # strings: -e key=value, quoted YAML
NOT_INF_TEXT = [*MINUS_INF_YAML, "-inf", "-Infinity", *NAN_YAML, "nan", "NaN"]


def yaml_float(text: str) -> float:
    value = yaml.safe_load(f"x: {text}")["x"]
    assert isinstance(value, float) and not math.isfinite(value), text
    return value


def inf_fields() -> list[Parts]:
    return declared(settings.INF)


def test_the_fields_that_take_inf_are_the_request_rates() -> None:
    """A floor: the one field the docs say takes inf is declared so (a new one joins every test below)."""
    assert ("phases", "[]", "sweeps", "[]", "request_rates", "[]") in inf_fields()


def rates_of(suite: dict[str, Any]) -> set[Any]:
    return {c.get("request_rate") for cfg in matrix.expand(suite) for c in cfg["cells"]}


@pytest.mark.parametrize("pattern", inf_fields(), ids=lambda p: ".".join(map(str, p)))
@pytest.mark.parametrize("value", [*(yaml_float(t) for t in INF_YAML), float("inf"), *INF_TEXT],
                         ids=[*(f"yaml {t}" for t in INF_YAML), "float", *(f"text {t!r}" for t in INF_TEXT)])
def test_every_spelling_of_infinity_is_taken_as_inf_where_inf_is(pattern: Parts, value: Any) -> None:
    suite = base("vllm")
    parts = place(suite, pattern, value)
    get(suite, parts[:-1])[:] = [2, value]  # beside a finite rate (the base holds "inf" there already)
    assert problems(suite) == []
    assert "inf" in rates_of(suite) and not any(isinstance(r, float) and math.isinf(r) for r in rates_of(suite))


@pytest.mark.parametrize("pattern", inf_fields(), ids=lambda p: ".".join(map(str, p)))
@pytest.mark.parametrize("value", [*(yaml_float(t) for t in MINUS_INF_YAML + NAN_YAML), *NOT_INF_TEXT],
                         ids=[*(f"yaml {t}" for t in MINUS_INF_YAML + NAN_YAML),
                              *(f"text {t!r}" for t in NOT_INF_TEXT)])
def test_minus_infinity_and_nan_are_refused_where_inf_is_taken(pattern: Parts, value: Any) -> None:
    suite = base("vllm")
    where = field_path(place(suite, pattern, value))
    [line] = problems(suite)
    assert line.startswith(f"{where}: ") and "is not a request rate; allowed: a number of requests per second > 0" \
        in line, line
    assert "is not of type" not in line, line
    if isinstance(value, float):
        assert (".nan (not a number)" if math.isnan(value) else "-.inf (minus infinity)") in line, line


def number_fields(text_too: bool = True) -> list[Parts]:
    """Every field that takes a finite number only (`text_too`: beside text, as an environment value does)."""
    return [p for p, schema in settings.fields() if p and types(schema) & {"number", "integer"}
            and not schema.get(settings.INF) and (text_too or "string" not in types(schema))]


def every_field() -> list[Parts]:
    return [p for p, _ in settings.fields() if p]


def test_yaml_spells_each_special_number_one_way() -> None:
    """Every case of a spelling is one float to YAML (and to Ansible's loader), so the field tests below take
    each float once: NaN, infinity, minus infinity."""
    for texts, want in ((INF_YAML, "inf"), (MINUS_INF_YAML, "-inf"), (NAN_YAML, "nan")):
        for text in texts:
            assert repr(yaml_float(text)) == repr(from_yaml(f"x: {text}")["x"]) == want, text


def test_nan_is_refused_in_every_field_naming_it() -> None:
    """NaN in every field the matrix declares (numbers, strings, lists, mappings): refused, naming the field and
    showing the value as YAML spells it; never `is not of type 'number'` of a float."""
    for pattern in every_field():
        suite = base("sglang")
        where = field_path(place(suite, pattern, math.nan))
        lines = problems(suite)
        mine = [line for line in lines if line.startswith(f"{where}: ")]
        assert any(".nan (not a number)" in line or "value not shown" in line for line in mine), (where, lines)
        assert not any("is not of type 'number'" in line or "is not of type 'integer'" in line
                       for line in lines), lines


def free_form_fields() -> list[Parts]:
    """Every field whose items or values the schema leaves undeclared (a list of raw values)."""
    return [p for p, schema in settings.fields() if p and (
        "array" in types(schema) and not isinstance(schema.get("items"), dict)
        or "object" in types(schema) and not schema.get("properties") and not isinstance(
            schema.get("additionalProperties"), dict))]


def test_nan_and_infinity_inside_a_free_form_field_are_refused_naming_where() -> None:
    """No schema judges the items of such a field, and no record (JSON) could hold them."""
    assert ("engine_patches",) in free_form_fields()
    for pattern in free_form_fields():
        for value in (math.nan, math.inf, -math.inf):
            suite = base("vllm")
            where = field_path(place(suite, pattern, [{"name": "a.patch", "sha": value}]))
            assert problems(suite) == [f"{where}[0].sha: {shown(value, False)} is not a finite number; allowed: a "
                                       "value without NaN or infinity (the records are JSON)"]


@pytest.mark.parametrize("key", [1, 2.5, math.nan, True])
def test_a_workload_named_by_a_number_is_named_not_a_crash(key: Any) -> None:
    """YAML reads `1: ...` or `.nan: ...` under bench_workloads as a number key."""
    suite = base("vllm")
    suite["workloads"] = {key: "Write a poem.", "poem": "Write a poem."}
    [line] = problems(suite)
    assert line.startswith(f"bench_workloads: the key {shown(key, False)} is ") and "not a workload name" in line


def test_infinity_is_refused_where_a_finite_number_is_declared() -> None:
    for pattern in number_fields():
        for value in (math.inf, -math.inf):
            suite = base("sglang")
            where = field_path(place(suite, pattern, value))
            lines = problems(suite)
            assert any(line.startswith(f"{where}: ") and "is not a finite number; allowed: " in line
                       and line.endswith("(a finite number)") for line in lines), (where, lines)


@pytest.mark.parametrize("text", ["nan", "NaN", ".nan", "inf", ".inf", "-inf", "Infinity"])
def test_a_special_number_in_text_gets_no_advice_to_write_it_unquoted(text: str) -> None:
    """`-e bench_progress_s=inf` gives the string 'inf': saying "write it unquoted" would be false (no number
    field takes inf or nan, unquoted or not)."""
    for pattern in number_fields(text_too=False):
        suite = base("sglang")
        where = field_path(place(suite, pattern, text))
        mine = [line for line in problems(suite) if line.startswith(f"{where}: ")]
        assert mine and not any("unquoted" in line for line in mine), (where, mine)


# ---------------------------------------------------------------------------------------------------------------
# The way through Ansible: host_vars and -e as Ansible's own parsers read them, then the plan action's code
# ---------------------------------------------------------------------------------------------------------------

def planned(variables: dict[str, Any]) -> dict[str, Any]:
    """plan.build as the bench_plan action calls it: the suite read from the bench_* variables by
    `settings.suite_from`, as the action reads them (each `-e` string coerced where the setting says)."""
    suite = settings.suite_from(lambda name: variables.get(name, settings.role_default(settings.by_key(name[6:]))),
                                "/nowhere")
    args = {"suite": suite, "run_id": "r1", "host_dir": "/var/lib/specfleet", "agent_python": "/usr/bin/python3",
            "limits": {}}
    return plan.build(args, {"inventory_hostname": "gpu-01"})


def bench_vars(rate_text: str) -> str:
    """host_vars text of a small matrix whose open-loop sweep has the rates `rate_text`."""
    return ("bench_engine: vllm\nbench_engine_python: /py\nbench_model: {name: m, path: /m}\nbench_phases:\n"
            "  - name: tp1\n    configs: [{method: autoregressive}]\n"
            f"    sweeps: [{{workloads: [fib], request_rates: {rate_text}, requests: 4}}]\n")


@pytest.mark.parametrize("spelled", [*INF_YAML, "inf", "'.inf'", '".Inf"', "'+.inf'"])
def test_infinity_from_host_vars_reaches_the_plan_as_inf(spelled: str) -> None:
    variables = from_yaml(bench_vars(f"[2, {spelled}]"))
    res = planned(variables)
    assert not res.get("failed"), res.get("msg")
    assert {c["request_rate"] for c in res["configs"][0]["cells"]} == {2, "inf"}


@pytest.mark.parametrize("spelled", ["Infinity", '".inf"', '"+.Inf"', '"inf"', ".inf"])
def test_infinity_from_extra_vars_json_reaches_the_plan_as_inf(spelled: str) -> None:
    """`-e '{"bench_phases": [...]}'`: Ansible reads it as JSON (Infinity a float) or YAML (.inf a float), a quoted
    spelling a string."""
    phases = ('[{"name": "tp1", "configs": [{"method": "autoregressive"}], "sweeps": [{"workloads": ["fib"], '
              f'"request_rates": [2, {spelled}], "requests": 4}}]}}]')
    variables = {**from_yaml(bench_vars("[1]")), **from_yaml(f'{{"bench_phases": {phases}}}')}
    res = planned(variables)
    assert not res.get("failed"), res.get("msg")
    assert {c["request_rate"] for c in res["configs"][0]["cells"]} == {2, "inf"}


@pytest.mark.parametrize("spelled, shown", [("-.inf", "-.inf (minus infinity)"), (".nan", ".nan (not a number)"),
                                            ("NaN", "'NaN'"), ("'-.inf'", "'-.inf'")])
def test_minus_infinity_and_nan_through_ansible_are_named(spelled: str, shown: str) -> None:
    res = planned(from_yaml(bench_vars(f"[2, {spelled}]")))
    assert res["failed"] and res["msg"].splitlines()[1:] == [
        f"bench_phases[0].sweeps[0].request_rates[1]: {shown} is not a request rate; allowed: {settings.RATE_TEXT}"]


@pytest.mark.parametrize("text", [".inf", "inf", ".nan", "nan", "-.inf"])
def test_special_numbers_as_key_value_extra_vars_are_named_truly(text: str) -> None:
    """`-e bench_<number>=.inf`, for every number setting `-e` coerces: a string; named, no false advice."""
    for key in (k for k, how in settings.number_keys().items() if how == "number"):
        variables = {**from_yaml(bench_vars("[1]")), **parse_kv(f"bench_{key}={text}")}
        res = planned(variables)
        lines = res["msg"].splitlines()[1:]
        assert res["failed"] and lines and lines[0].startswith(f"bench_{key}: '{text}' is not of type"), lines
        assert not any("unquoted" in line for line in lines), lines

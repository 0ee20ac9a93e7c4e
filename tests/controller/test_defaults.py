"""Each setting of the bench role is defined once (controller/settings.py): the matrix's schema, its defaults and
the role's defaults/main.yml and meta/argument_specs.yml come from it (the role's files generated, and committed as
generated), and the plan action reads the variables it lists."""
from __future__ import annotations

from pathlib import Path

import yaml

from collector.verdict import FAIL_ON
from controller import matrix, rolefiles, settings

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles/bench"


def test_role_defaults_equal_the_matrix_defaults() -> None:
    defaults = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
    for key, value in matrix.DEFAULTS.items():
        assert defaults[f"bench_{key}"] == value, f"roles/bench/defaults/main.yml bench_{key}"


def test_argument_specs_document_the_matrix_defaults() -> None:
    specs = yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text())["argument_specs"]
    for entry, spec in specs.items():
        for name, option in (spec.get("options") or {}).items():
            key = name.removeprefix("bench_")
            if key in matrix.DEFAULTS and "default" in option:
                assert option["default"] == matrix.DEFAULTS[key], f"argument_specs {entry}.{name}"
    plan = specs["plan"]["options"]
    for key in matrix.PARTIAL:
        assert plan[f"bench_{key}"]["default"] == matrix.DEFAULTS[key]


def test_a_mapping_set_in_part_keeps_the_other_defaults() -> None:
    for key in matrix.PARTIAL:
        first = next(iter(matrix.DEFAULTS[key]))
        value = not matrix.DEFAULTS[key][first] if isinstance(matrix.DEFAULTS[key][first], bool) else 7
        filled = matrix.with_defaults({key: {first: value}})
        assert filled[key] == {**matrix.DEFAULTS[key], first: value}


def test_expanded_configs_carry_the_documented_timeouts_and_sampling() -> None:
    suite = {"engine": "vllm", "engine_python": "/py", "model": {"name": "m", "path": "/m"},
             "timeouts": {"health_s": 300}, "sampling": {"ignore_eos": True},
             "phases": [{"name": "tp1", "configs": [{"method": "autoregressive"}],
                         "sweeps": [{"workloads": ["fib"]}]}]}
    [cfg] = matrix.expand(suite)
    assert cfg["timeouts"] == {"health_s": 300, "request_s": 900, "stop_s": 60, "release_s": 120}
    assert cfg["sampling"] == {"temperature": 0.0, "ignore_eos": True}
    assert cfg["warmup_max_tokens"] == 32 and cfg["cells"][0]["max_tokens"] == 256


def test_unit_template_takes_the_stop_deadline_from_the_matrix() -> None:
    text = (ROLE / "templates/engine@.service.j2").read_text()
    assert "bench_defaults('timeouts')" in text and "default(60)" not in text


SPEC_TYPES = {"integer": "int", "number": "float", "string": "str", "boolean": "bool", "array": "list",
              "object": "dict"}


def test_the_role_files_are_generated_from_the_settings() -> None:
    assert rolefiles.main(["--check"]) == 0, "run `python -m controller.rolefiles --write`"
    assert matrix.SCHEMA is settings.SCHEMA and matrix.DEFAULTS is settings.DEFAULTS


def test_the_plan_reads_exactly_the_matrix_settings() -> None:
    """The suite the action validates holds every matrix setting under its key, taken from bench_<key> (no
    hand-written mapping in the role any more), and nothing else."""
    seen: list[str] = []
    suite = settings.suite_from(lambda name: seen.append(name) or f"value of {name}", "/play")
    assert list(suite) == list(matrix.SCHEMA["properties"]) and seen == [f"bench_{k}" for k in suite]
    assert suite["workloads_file"] == "/play/value of bench_workloads_file"
    assert "_bench_suite" not in (ROLE / "vars/main.yml").read_text()
    assert "_bench_suite" not in "".join(p.read_text() for p in (ROLE / "tasks").glob("*.yml"))


def test_every_scalar_number_or_switch_of_the_matrix_takes_its_extra_var_string() -> None:
    """`-e bench_repetitions=2` and `-e bench_pack=true` arrive as strings: every integer, number or boolean
    setting of the matrix takes the string as the value it spells, and leaves any other string for the validator."""
    for s in settings.MATRIX:
        kind = s.schema.get("type") if s.schema else None
        if kind in ("integer", "number", "boolean"):
            assert s.coerce == ("bool" if kind == "boolean" else "number"), s.key
            got = settings.suite_from(lambda name, k=s.key: {"bench_" + k: "1"}.get(name), "/")[s.key]
            assert got == (True if kind == "boolean" else 1), s.key
        else:
            assert s.coerce is None, s.key
    assert settings.as_number("ture") == "ture" and settings.as_bool("ture") == "ture"


def test_the_report_entry_point_allows_the_collectors_fail_on_values() -> None:
    assert settings.choices(settings.by_key("fail_on")) == list(FAIL_ON)


def test_argument_specs_declare_every_matrix_variable_with_its_schema_type() -> None:
    options: dict = {}
    for entry in yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text())["argument_specs"].values():
        options.update(entry.get("options") or {})
    for key, schema in matrix.SCHEMA["properties"].items():
        spec = options[f"bench_{key}"]
        kinds = schema.get("type", "string" if "enum" in schema else None)
        kinds = [kinds] if isinstance(kinds, str) else [k for k in kinds if k != "null"]
        allowed = {SPEC_TYPES[k] for k in kinds} | ({"raw"} if len(kinds) > 1 or "null" in str(schema) else set())
        assert spec["type"] in allowed | {"raw"}, (key, spec["type"], kinds)

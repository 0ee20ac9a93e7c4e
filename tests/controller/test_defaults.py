"""Each default of the matrix is defined once (the `default`s of controller/matrix.py SCHEMA); the role
documents the same values."""
from __future__ import annotations

from pathlib import Path

import yaml

from controller import matrix

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


def test_the_role_passes_exactly_the_matrix_keys() -> None:
    """vars/main.yml maps each bench_* variable of the matrix, and nothing else, into the suite."""
    suite = yaml.safe_load((ROLE / "vars/main.yml").read_text())["_bench_suite"]
    assert set(suite) == set(matrix.SCHEMA["properties"])
    for key, value in suite.items():
        assert f"bench_{key}" in value, (key, value)


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

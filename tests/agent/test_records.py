"""The results contract: record checks in words, request rows, cell keys, events, and the published schemas."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from agent.records import (
    CELL,
    CONFIG,
    IDENTITY,
    REQUEST,
    STATUS,
    Event,
    Outcome,
    cell_key,
    json_schema,
    problem,
    rate_ok,
    request_problem,
    request_row,
)

ROOT = Path(__file__).resolve().parents[2]
IDENT = {"host": "gpu-1", "config_id": "p1-eagle-tp1", "method": "eagle", "method_params": {"num_tokens": 4},
         "tp": 1, "engine": "vllm", "model": "m", "phase": "p1"}
CELL_ = {"workload": "chat", "max_tokens": 256, "context_tokens": 0, "concurrency": 2, "repetitions": 3}
MEASURED = {"slot": 1, "started_at": "2025-01-01T00:00:00.000+00:00", "prompt_tokens": 20, "completion_tokens": 256,
            "ttft_s": 0.05, "e2e_s": 2.0, "output_tok_s": 128.0, "decode_tok_s": 130.1, "itl_mean_s": 0.0077,
            "itl_p50_s": 0.0075, "chunks": 70, "finish_reason": "length", "accept_length": 2.4, "ok": True,
            "error": None}


def row(**change: Any) -> dict[str, Any]:
    return {**request_row(IDENT, CELL_, 0, MEASURED), **change}


STATUS_OK = {"config_id": "p1-eagle-tp1", "status": "ok", "reason": None, "detail": None, "config_digest": "ab12",
             "log_tail": "INFO ready\n", "started_at": "2025-01-01T00:00:00.000+00:00",
             "finished_at": "2025-01-01T00:05:00.000+00:00", "ready_s": 41.2, "requests": 6, "requests_ok": 6,
             "port": 8000, "timed_s": 12.5, "stop_s": 3.1, "wall_s": 60.0, "survivors": [], "unsupported_flags": []}
CONFIG_REC = {"config_id": "p1-eagle-tp1", "phase": "p1", "host": "gpu-1", "engine": "vllm", "engine_version": "0.9.1",
              "model": {"name": "m", "path": "/models/m", "revision": None, "max_model_len": 4096},
              "draft_model": None, "method": "eagle", "method_params": {"num_tokens": 4}, "tp": 1,
              "server_args": ["--seed", "1"], "sampling": {"temperature": 0.0, "ignore_eos": True},
              "warmup_max_tokens": 32, "cells": [CELL_], "requests": 6,
              "command": ["vllm", "serve", "--api-key", "<redacted>"], "environment": {"HF_TOKEN": "<redacted>"},
              "timeouts": {"health_s": 900, "request_s": 900, "stop_s": 60, "release_s": 120}, "estimate_s": 90.0}
SCHEMAS = ("requests.jsonl", "status.json", "config.json", "gpu.jsonl")


# -- problem, request_problem -------------------------------------------------------------------------


def test_realistic_records_keep_their_fields() -> None:
    assert request_problem(row(), "p1-eagle-tp1") is None
    assert problem(STATUS_OK, STATUS) is None
    assert problem(CONFIG_REC, CONFIG) is None


def test_optional_fields_may_be_absent_and_required_ones_may_not() -> None:
    minimal = {k: row()[k] for k in (f.name for f in REQUEST if f.required)}
    assert request_problem(minimal, "p1-eagle-tp1") == "ok request without output_tok_s"
    assert request_problem({**minimal, "ok": False}, "p1-eagle-tp1") is None
    assert problem({k: v for k, v in STATUS_OK.items() if k not in ("port", "timed_s", "survivors")}, STATUS) is None
    assert problem({k: v for k, v in row().items() if k != "rep"}, REQUEST) == "missing field 'rep'"
    assert problem({k: v for k, v in STATUS_OK.items() if k != "ready_s"}, STATUS) == "missing field 'ready_s'"


@pytest.mark.parametrize(("change", "words"), [
    ({"tp": "1"}, "field 'tp' should be an integer, got '1'"),
    ({"tp": 1.0}, "field 'tp' should be an integer, got 1.0"),
    ({"tp": True}, "field 'tp' should be an integer, got True"),
    ({"prompt_tokens": False}, "field 'prompt_tokens' should be an integer or null, got False"),
    ({"ttft_s": float("nan")}, "field 'ttft_s' should be a finite number or null, got nan"),
    ({"e2e_s": float("inf")}, "field 'e2e_s' should be a finite number or null, got inf"),
    ({"output_tok_s": True}, "field 'output_tok_s' should be a finite number or null, got True"),
    ({"method_params": []}, "field 'method_params' should be an object, got []"),
    ({"ok": 1}, "field 'ok' should be a boolean, got 1"),
    ({"error": 5}, "field 'error' should be a string or null, got 5"),
])
def test_wrong_types_are_named_in_words(change: dict[str, Any], words: str) -> None:
    assert problem(row(**change), REQUEST) == words
    assert request_problem(row(**change), "p1-eagle-tp1") == words


def test_integers_are_numbers_and_null_is_allowed_where_listed() -> None:
    assert problem(row(ttft_s=1, e2e_s=None, accept_length=None), REQUEST) is None


def test_not_an_object() -> None:
    assert problem(["a"], REQUEST) == "not a JSON object (got list)"
    assert request_problem(None, "x") == "not a JSON object (got NoneType)"


def test_long_values_are_cut_in_the_message() -> None:
    why = problem(row(tp="x" * 1000), REQUEST)
    assert why is not None and why.startswith("field 'tp' should be an integer, got 'xxx") and len(why) == 300


def test_an_ok_row_needs_a_finite_output_rate() -> None:
    assert request_problem(row(output_tok_s=None), "p1-eagle-tp1") == "ok request without output_tok_s"
    assert request_problem(row(ok=False, output_tok_s=None, error="timed out"), "p1-eagle-tp1") is None


def test_a_row_of_another_config_is_named() -> None:
    assert request_problem(row(), "p1-base-tp1") == "config_id 'p1-eagle-tp1' is not its folder's ('p1-base-tp1')"


# -- request_row, cell_key, enums ---------------------------------------------------------------------


def test_request_row_is_identity_cell_rep_and_measurement_only() -> None:
    identity = {**IDENT, "server_args": ["--api-key", "x"], "command": ["vllm"]}
    got = request_row(identity, CELL_, 2, {"ok": False, "error": "boom"})
    assert got == {**IDENT, "workload": "chat", "max_tokens": 256, "context_tokens": 0, "concurrency": 2, "rep": 2,
                   "ok": False, "error": "boom"}
    assert set(got) == set(IDENTITY) | set(CELL) - {"request_rate"} | {"rep", "ok", "error"}  # closed loop
    opened = {**CELL_, "concurrency": 0, "request_rate": "inf", "arrival": "poisson", "requests": 8, "seed": 0}
    got = request_row(identity, opened, 0, {"ok": True})
    assert set(got) == set(IDENTITY) | set(CELL) | {"rep", "ok"} and got["request_rate"] == "inf"


def test_cell_key_of_a_cell_and_of_its_rows_agree() -> None:
    assert cell_key(CELL_) == cell_key(row()) == ("chat", 256, 0, 2, None)
    assert cell_key(row(concurrency=4)) != cell_key(CELL_)
    assert cell_key({}) == (None, None, None, None, None)
    # a rate as the YAML gives it, as JSON writes it and as a reader of either takes it: one key
    assert cell_key({**CELL_, "request_rate": 2}) == cell_key({**CELL_, "request_rate": 2.0})[:4] + (2.0,)
    assert cell_key({**CELL_, "request_rate": "inf"})[-1] == math.inf
    assert [rate_ok(v) for v in (None, 0.5, 3, "inf", 0, -1, "fast", True)] == [True] * 4 + [False] * 4


def test_event_and_outcome_values() -> None:
    assert [e.value for e in Event] == ["suite_start", "leftover_unit_stopped", "config_kept", "machine_wait",
                                        "config_start",
                                        "config_ready", "config_progress", "config_end", "suite_end"]
    assert [o.value for o in Outcome] == ["ok", "failed", "skipped"]
    assert Event("config_end") is Event.CONFIG_END and Outcome.OK == "ok"
    assert json.dumps({"e": Event.SUITE_START}) == '{"e": "suite_start"}'


# -- published schemas --------------------------------------------------------------------------------


def test_published_schemas_are_what_the_agent_writes_now(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "agent", "schemas", "--out", str(tmp_path / "out")], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    published = sorted(p.name for p in (ROOT / "schemas").iterdir())
    assert written == published == sorted(f"{name}.schema.json" for name in SCHEMAS)
    for name in written:
        assert (ROOT / "schemas" / name).read_text() == (tmp_path / "out" / name).read_text(), \
            f"schemas/{name} is stale: run `python -m agent schemas --out schemas`"


@pytest.mark.parametrize(("name", "record", "wrong"), [
    ("requests.jsonl", row(), {"tp": "1"}),
    ("requests.jsonl", row(), {"ok": 1}),
    ("status.json", STATUS_OK, {"requests": True}),
    ("config.json", CONFIG_REC, {"cells": {}}),
])
def test_each_schema_is_valid_and_judges_records_like_the_checks(name: str, record: dict[str, Any],
                                                                 wrong: dict[str, Any]) -> None:
    schema = json.loads((ROOT / "schemas" / f"{name}.schema.json").read_text())
    assert schema == json_schema(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    assert list(validator.iter_errors(record)) == []
    assert list(validator.iter_errors({**record, "extra": "kept"})) == []
    errors = list(validator.iter_errors({**record, **wrong}))
    assert [e.path[0] for e in errors] == list(wrong)
    missing = {k: v for k, v in record.items() if k != "config_id"}
    assert [e.validator for e in validator.iter_errors(missing)] == ["required"]

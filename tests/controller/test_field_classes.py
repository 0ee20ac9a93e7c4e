"""The rules that guard a class of fields, walked over every field of the class as `controller.settings` declares
it: the fields are enumerated from the matrix's schema (`settings.fields`) and selected by the role they are
declared with, so a field declared with its role joins these tests without a line here.

- Every string field that reaches the engine's command line or environment is declared `settings.LAUNCH` (checked
  by following a marker into the rendered commands), and each of them refuses the `{port}` placeholder, naming
  the field.
- Every context limit a config's requests must fit is consulted: each declared on a model (`settings.CONTEXT`, on
  the target, the suite's drafter and a config's own drafter), the server's context flag in every argument list,
  and each model's own config.json on the host (the plan's host check).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from agent import probe
from agent.engines import ENGINES, PORT
from controller import hostcheck, matrix, settings
from controller.schema_errors import field_path

ENGINE_NAMES = sorted(ENGINES)
Parts = tuple[Any, ...]
LONGEST = 512 + 256  # the longest request of the base suite (its "grid" sweep, measured by every config)


def base(engine: str) -> dict[str, Any]:
    """A valid suite that sets every field of the matrix, on `engine`: a baseline, a config on the suite's drafter,
    one on its own drafter, one without a drafter; a closed-loop sweep every config measures and an open-loop one."""
    own = {"name": "own-drafter", "path": "/models/own-drafter", "revision": "r1", "max_model_len": 8192}
    return {
        "suite_name": "classes", "engine": engine, "backend": "process", "engine_python": "/opt/engine/bin/python",
        "engine_patches": [], "gpu_count": 4, "gpu_memory_mib": 0, "pack": False, "pack_check": False,
        "slots": [], "bind_host": "127.0.0.1", "port": 0, "api_key": "key-0123456789abcdef",
        "model": {"name": "target", "path": "/models/target", "revision": "r1", "max_model_len": 8192},
        "draft_model": {"name": "drafter", "path": "/models/drafter", "revision": "r1", "max_model_len": 8192},
        "server_args": ["--seed", "1"], "env": {"SUITE_VAR": "1"},
        "sampling": {"temperature": 0.0, "ignore_eos": False}, "repetitions": 2, "slo": {"ttft_ms": 1000},
        "max_tokens": [256], "warmup_max_tokens": 32, "workloads": {"poem": "Write a poem."}, "workloads_file": "",
        "timeouts": {"health_s": 600, "request_s": 600, "stop_s": 30, "release_s": 60}, "progress_s": 10,
        "max_plan_hours": 24, "server_log_max_mib": 64,
        "estimate": {"startup_s": 60, "tok_s": 25, "prefill_tok_s": 5000},
        "phases": [{
            "name": "tp1", "tp": 1, "server_args": ["--seed", "2"], "env": {"PHASE_VAR": "1"},
            "slots": [{"gpus": [0], "cpus": "0-1"}],
            "configs": [
                {"method": "autoregressive", "id": "base", "server_args": ["--seed", "3"], "env": {"CFG_VAR": "1"}},
                {"method": "dflash", "block_size": 16},
                {"method": "draft_model", "num_speculative_tokens": 3, "topk": 1, "num_draft_tokens": 4,
                 "draft_model": own},
                {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2, "prompt_lookup_max": 3}],
            "sweeps": [
                {"name": "grid", "workloads": ["fib", "poem"], "max_tokens": [256], "context_tokens": [0, 512],
                 "concurrency": [1, 2], "repetitions": 2, "slo": {"tpot_ms": 100}},
                {"name": "open", "workloads": ["fib"], "max_tokens": [64], "request_rates": [2, "inf"],
                 "arrival": "poisson", "requests": 4, "seed": 0, "methods": ["dflash-blk16"]}]}],
    }


# ---------------------------------------------------------------------------------------------------------------
# Fields: enumerated from the schema, placed in a suite
# ---------------------------------------------------------------------------------------------------------------

def types(schema: Any) -> set[str]:
    kind = schema.get("type", [])
    return {kind} if isinstance(kind, str) else set(kind)


def declared(role: str) -> list[Parts]:
    """The pattern paths of the fields declared with `role` (settings.LAUNCH, CONTEXT, INF)."""
    return [parts for parts, schema in settings.fields() if schema.get(role)]


def string_fields() -> list[Parts]:
    """Every field that may hold a string: typed so, or one of a list of names."""
    return [parts for parts, schema in settings.fields()
            if parts and ("string" in types(schema) or any(isinstance(v, str) for v in schema.get("enum", [])))]


def get(obj: Any, parts: Parts) -> Any:
    for p in parts:
        obj = obj[p]
    return obj


def instances(suite: Any, pattern: Parts) -> list[Parts]:
    """The concrete paths of a field's pattern present in `suite` (every item of a list, every key of a mapping)."""
    paths: list[Parts] = [()]
    for step in pattern:
        found: list[Parts] = []
        for parts in paths:
            obj = get(suite, parts)
            if step == settings.ANY_ITEM and isinstance(obj, list):
                found += [(*parts, i) for i in range(len(obj))]
            elif step == settings.ANY_KEY and isinstance(obj, dict):
                found += [(*parts, k) for k in obj]
            elif isinstance(obj, dict) and step in obj:
                found.append((*parts, step))
        paths = found
    return paths


def place(suite: dict[str, Any], pattern: Parts, value: Any) -> Parts:
    """Set the field of `pattern` to `value` at its first place in `suite`, or beside its nearest present part (the
    containers it needs made); the concrete path."""
    n = next(n for n in range(len(pattern), -1, -1) if instances(suite, pattern[:n]))
    parts = list(instances(suite, pattern[:n])[0])
    if n == len(pattern):
        get(suite, tuple(parts[:-1]))[parts[-1]] = value
        return tuple(parts)
    obj: Any = get(suite, tuple(parts))
    for i, step in enumerate(pattern[n:], n):
        if step == settings.ANY_ITEM:
            obj.append(None)
            step = len(obj) - 1
        elif step == settings.ANY_KEY:
            step = "CLASS_FIELD"
        parts.append(step)
        obj[step] = value if i == len(pattern) - 1 else [] if pattern[i + 1] == settings.ANY_ITEM else {}
        obj = obj[step]
    return tuple(parts)


def problems(suite: dict[str, Any]) -> list[str]:
    try:
        matrix.validate(suite)
    except matrix.MatrixError as exc:
        return str(exc).splitlines()
    return []


def rendered(suite: dict[str, Any]) -> Iterator[str]:
    """Every argument of every config's command and every value of its environment."""
    for cfg in matrix.expand(suite):
        yield from cfg["command"]
        yield from cfg["env"].values()


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_the_base_suite_is_valid_and_uses_every_model(engine: str) -> None:
    configs = matrix.expand(base(engine))
    drafters = {(c["draft_model"] or {}).get("path") for c in configs}
    assert {"/models/drafter", "/models/own-drafter"} <= drafters
    assert all(max(x["context_tokens"] + x["max_tokens"] for x in c["cells"]) == LONGEST for c in configs)


# ---------------------------------------------------------------------------------------------------------------
# Class: a value equal to (or holding) a command placeholder, where no placeholder is documented
# ---------------------------------------------------------------------------------------------------------------

MARK = "mark7q"


def reaches(pattern: Parts) -> bool | None:
    """Whether a marker in the field reaches a command or an environment on any engine; None when no engine
    takes the marker there (the field's own check refuses it: the field holds names or choices, not free text)."""
    taken = False
    for engine in ENGINE_NAMES:
        suite = base(engine)
        parts = place(suite, pattern, MARK)
        refused = problems(suite)
        if refused:
            where = field_path(parts)
            assert any(line.startswith((f"{where}: ", f"{where}[")) for line in refused), (
                f"{where}: the marker is refused for another field (extend base()):\n" + "\n".join(refused))
            continue
        taken = True
        if any(MARK in text for text in rendered(suite)):
            return True
    return False if taken else None


def test_every_field_that_reaches_the_command_or_environment_is_declared_so() -> None:
    """Each string field is followed into the rendered commands and environments of both engines: those it
    reaches are exactly the fields declared `settings.LAUNCH`, the ones the placeholder rule walks."""
    reached = {pattern for pattern in string_fields() if reaches(pattern)}
    assert reached == set(declared(settings.LAUNCH))
    assert {("engine_python",), ("model", "path"), ("model", "name"), ("api_key",), ("bind_host",),
            ("draft_model", "path"), ("server_args", "[]"), ("env", "*")} <= reached  # a floor, as a reader knows it


PLACED = [PORT, f"/x/{PORT}", f"a{PORT}b", f"--flag={PORT}", f"127.0.0.1:{PORT}"]


@pytest.mark.parametrize("engine", ENGINE_NAMES)
@pytest.mark.parametrize("pattern", declared(settings.LAUNCH), ids=lambda p: ".".join(map(str, p)))
def test_the_port_placeholder_is_refused_in_every_field_that_reaches_the_command(engine: str,
                                                                                   pattern: Parts) -> None:
    """`{port}` is filled with the server's port in specfleet's own --port only: in a path, a name, the key, the
    bind address, an argument or an environment value it would be passed on as written, or, a whole argument, be
    replaced by the port too. One line naming the field, whatever else the field's own checks say."""
    for value in PLACED:
        suite = base(engine)
        where = field_path(place(suite, pattern, value))
        lines = problems(suite)
        assert len(lines) == 1 and lines[0].startswith(f"{where}: "), (value, lines)
        assert f"holds {PORT}, the placeholder specfleet fills with the server's own port in its --port only" in \
            lines[0] and lines[0].endswith("allowed: a literal value"), lines[0]


def test_a_secret_field_holding_the_placeholder_is_named_without_its_value() -> None:
    suite = base("sglang")
    suite["api_key"] = f"sk-{PORT}-0123456789"
    suite["env"]["HF_TOKEN"] = f"hf_{PORT}_secret"
    lines = problems(suite)
    assert [line.split(": ")[0] for line in lines] == ["bench_api_key", "bench_env.HF_TOKEN"], lines
    assert not any("sk-" in line or "hf_" in line for line in lines), lines


# ---------------------------------------------------------------------------------------------------------------
# Class: a context limit that the length check must consult
# ---------------------------------------------------------------------------------------------------------------

def argument_lists() -> list[Parts]:
    """Every argument list of the launch command (server_args at every level): a list of `LAUNCH` strings."""
    return [p[:-1] for p in declared(settings.LAUNCH) if p[-1] == settings.ANY_ITEM]


def limit_cases() -> list[tuple[str, Parts, str]]:
    """(engine, the field's pattern, how the limit is written) for every declared context limit and every
    argument list that can set the server's context flag."""
    out = [(e, p, "declared") for e in ENGINE_NAMES for p in declared(settings.CONTEXT)]
    out += [(e, p, spelling) for e in ENGINE_NAMES for p in argument_lists()
            for spelling in ("flag value", "flag=value", *(["flag_as_vllm_reads_it"] if e == "vllm" else []))]
    return out


def set_limit(suite: dict[str, Any], pattern: Parts, how: str, tokens: int) -> str:
    """Declare a context limit of `tokens` at the field; the field the rejection must name."""
    if how == "declared":
        return field_path(place(suite, pattern, tokens))
    flag = ENGINES[suite["engine"]].context_flag
    args = {"flag value": [flag, str(tokens)], "flag=value": [f"{flag}={tokens}"],
            "flag_as_vllm_reads_it": [flag.replace("-", "_").replace("__", "--"), str(tokens)]}[how]
    parts = place(suite, (*pattern, settings.ANY_ITEM), "--seed")
    lst = get(suite, parts[:-1])
    lst[:] = ["--seed", "4", *args]
    return field_path((*parts[:-1], 2))


@pytest.mark.parametrize("engine, pattern, how", limit_cases(),
                         ids=lambda v: ".".join(map(str, v)) if isinstance(v, tuple) else str(v))
def test_every_declared_context_limit_is_consulted(engine: str, pattern: Parts, how: str) -> None:
    """A limit one token short of the longest request of the configs it binds is refused before anything starts,
    naming the sweep and the field that declares the limit; the limit at the longest request passes."""
    suite = base(engine)
    source = set_limit(suite, pattern, how, LONGEST - 1)
    lines = problems(suite)
    hits = [line for line in lines if f"({source})" in line]
    assert hits and all(line.startswith("bench_phases[0].sweeps[0].context_tokens: context + max_tokens = 768 "
                                        "exceeds ") for line in hits), lines
    assert lines == hits, lines  # one limit, one line: nothing else of the suite is touched
    suite = base(engine)
    set_limit(suite, pattern, how, LONGEST)
    assert problems(suite) == []


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_a_limit_binds_only_the_configs_that_use_it(engine: str) -> None:
    """The drafter's limit binds the configs on it, named; the baseline and the n-gram config send the same
    requests without it."""
    suite = base(engine)
    suite["draft_model"]["max_model_len"] = 700
    [line] = problems(suite)
    assert line == ("bench_phases[0].sweeps[0].context_tokens: context + max_tokens = 768 exceeds the drafter's "
                    "max_model_len 700 (context 512, max_tokens 256; of tp1-dflash-blk16); allowed: context_tokens + "
                    "max_tokens <= 700 (bench_draft_model.max_model_len)")


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_one_length_declared_twice_is_one_line_naming_both_fields(engine: str) -> None:
    """bench_model.max_model_len and the server's flag at the same length (as the embedded profile has them): one
    problem, one line, both fields named."""
    suite = base(engine)
    suite["model"]["max_model_len"] = 700
    suite["server_args"] = [ENGINES[engine].context_flag, "700"]
    [line] = problems(suite)
    assert line.startswith("bench_phases[0].sweeps[0].context_tokens: context + max_tokens = 768 exceeds the "
                           "model's max_model_len 700 (context 512, max_tokens 256); "), line
    assert line.endswith("allowed: context_tokens + max_tokens <= 700 (bench_model.max_model_len, "
                         "bench_server_args[0])"), line


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_the_warmup_is_held_to_every_limit_too(engine: str) -> None:
    suite = base(engine)
    suite["phases"][0]["configs"][2]["draft_model"]["max_model_len"] = 16
    suite["phases"][0]["sweeps"][0]["context_tokens"] = [0]
    suite["phases"][0]["sweeps"][0]["max_tokens"] = [8]
    suite["phases"][0]["sweeps"][1]["max_tokens"] = [8]
    [line] = problems(suite)
    assert line == ("bench_warmup_max_tokens: 32 tokens after the warmup prompt of bench_phases[0].configs[2] (0 "
                    "context tokens, bench_phases[0].sweeps[0]) exceed the drafter's max_model_len 16; allowed: at "
                    "most 16 (bench_phases[0].configs[2].draft_model.max_model_len)")


def model_folder(path: Path, positions: int) -> None:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"max_position_embeddings": positions}))
    (path / "model.safetensors").write_bytes(b"\0" * 8)


def answer(suite: dict[str, Any], configs: list[dict[str, Any]]) -> dict[str, Any]:
    """The host's answer as the probe gives it: the engine knows every flag; each folder the plan asks for read."""
    flags = sorted({a.split("=")[0] for c in configs for a in c["command"] if a.startswith("--")})
    models = {k: probe.model(path) for k, path in hostcheck.probe_models(suite).items()}
    return {"rc": 0, "stdout": json.dumps({"engine": {"version": "1", "flags": flags, "choices": {}},
                                           "models": models, "gpu_memory_mib": None})}


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_every_model_a_config_uses_is_read_on_the_host_and_its_context_consulted(engine: str,
                                                                                 tmp_path: Path) -> None:
    """Each model folder a config uses (the target, the suite's drafter, a config's own drafter: all that
    `hostcheck.probe_models` asks the probe for), its config.json one token short of the longest request: the
    plan names exactly the configs on that model. No length is set by hand, so the target's own context counts."""
    suite = base(engine)
    suite["model"].pop("max_model_len")
    paths = {"model": suite["model"], "draft_model": suite["draft_model"],
             "own": suite["phases"][0]["configs"][2]["draft_model"]}
    for key, model in paths.items():
        model["path"] = str(tmp_path / key)
    configs = matrix.expand(suite)
    assert sorted(hostcheck.probe_models(suite).values()) == sorted(m["path"] for m in paths.values())
    for short in paths:
        for key, model in paths.items():
            folder = Path(model["path"])
            if folder.exists():
                (folder / "config.json").unlink()
                (folder / "model.safetensors").unlink()
                folder.rmdir()
            model_folder(folder, LONGEST - 1 if key == short else LONGEST)
        checks = hostcheck.assess(copy.deepcopy(configs), answer(suite, configs), engine, 0)
        bound = {c["config_id"] for c in configs
                 if paths[short]["path"] in (c["model"]["path"], (c["draft_model"] or {}).get("path"))}
        assert {cid for cid, check in checks.items() if check.limits} == bound, short
        assert all("context (767 tokens, max_position_embeddings" in " ".join(checks[cid].limits) for cid in bound)

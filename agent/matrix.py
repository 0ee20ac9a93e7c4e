"""The benchmark matrix: validation (naming the offending field) and expansion into configs.

The controller validates the `specfleet_*` variables of each host with `validate()` before any
server starts, and `expand()` turns them into the ordered config list the agent runs. Schema
checks use jsonschema (controller only); cross-field checks are plain code.
"""
from __future__ import annotations

import ipaddress
import json
from typing import Any, Iterable

from . import workloads
from .engines import ENGINES
from .secrets import PLACEHOLDER
from .store import SECRET_KEY

METHODS = ("autoregressive", "ngram", "draft_model", "eagle", "eagle3", "mtp", "dflash", "ddtree")
NEEDS_DRAFT = ("draft_model", "eagle", "eagle3", "dflash", "ddtree")
NEEDS_K = ("ngram", "draft_model", "eagle", "eagle3", "mtp")
PREFIX = "bench_"

_pos_int = {"type": "integer", "minimum": 1}
_int_list = {"type": "array", "minItems": 1, "items": _pos_int, "uniqueItems": True}
_str_list = {"type": "array", "items": {"type": "string"}}
_env = {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}}
_model = {
    "type": "object", "required": ["name", "path"], "additionalProperties": False,
    "properties": {"name": {"type": "string", "minLength": 1}, "path": {"type": "string", "minLength": 1},
                   "revision": {"type": ["string", "null"]}, "max_model_len": _pos_int},
}
_config = {
    "type": "object", "required": ["method"], "additionalProperties": False,
    "properties": {
        "method": {"enum": list(METHODS)},
        "id": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]*$"},
        "num_speculative_tokens": {"type": "integer", "minimum": 1, "maximum": 64},
        "budget": {"type": "integer", "minimum": 1, "maximum": 1024},
        "block_size": {"type": "integer", "minimum": 2, "maximum": 64},
        "topk": _pos_int, "num_draft_tokens": _pos_int,
        "prompt_lookup_min": _pos_int, "prompt_lookup_max": _pos_int,
        "draft_model": _model, "server_args": _str_list, "env": _env,
    },
    "allOf": [
        {"if": {"properties": {"method": {"const": "ddtree"}}}, "then": {"required": ["budget"]}},
        {"if": {"properties": {"method": {"enum": list(NEEDS_K)}}},
         "then": {"required": ["num_speculative_tokens"]}},
        {"if": {"properties": {"method": {"not": {"const": "ddtree"}}}},
         "then": {"not": {"required": ["budget"]}}},
    ],
}
_sweep = {
    "type": "object", "required": ["workloads"], "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},
        "workloads": {"type": "array", "minItems": 1, "items": {"type": "string"}, "uniqueItems": True},
        "max_tokens": _int_list,
        "context_tokens": {"type": "array", "minItems": 1, "uniqueItems": True,
                           "items": {"type": "integer", "minimum": 0}},
        "concurrency": _int_list,
        "repetitions": _pos_int,
        "methods": {"type": "array", "items": {"type": "string"}},
    },
}
SCHEMA = {
    "type": "object",
    "required": ["engine", "engine_python", "model", "phases"],
    "properties": {
        "suite_name": {"type": "string"},
        "engine": {"enum": sorted(ENGINES)},
        "backend": {"enum": ["process", "systemd"]},
        "engine_python": {"type": "string", "minLength": 1},
        "model": _model,
        "draft_model": {"oneOf": [_model, {"type": "null"}]},
        "gpu_count": {"type": "integer", "minimum": 0},
        "bind_host": {"type": "string", "minLength": 1},
        "port": {"type": "integer", "minimum": 0, "maximum": 65535},
        "api_key": {"type": ["string", "null"]},
        "server_args": _str_list,
        "env": _env,
        "sampling": {"type": "object", "additionalProperties": False, "properties": {
            "temperature": {"type": "number", "minimum": 0}, "ignore_eos": {"type": "boolean"}}},
        "repetitions": _pos_int,
        "max_tokens": _int_list,
        "warmup_max_tokens": _pos_int,
        "workloads": {"type": "object", "additionalProperties": {"type": "string", "minLength": 1}},
        "timeouts": {"type": "object", "additionalProperties": False, "properties": {
            k: {"type": "number", "exclusiveMinimum": 0}
            for k in ("health_s", "request_s", "stop_s", "release_s")}},
        "estimate": {"type": "object", "additionalProperties": False, "properties": {
            k: {"type": "number", "exclusiveMinimum": 0} for k in ("startup_s", "tok_s", "prefill_tok_s")}},
        "phases": {
            "type": "array", "minItems": 1,
            "items": {
                "type": "object", "required": ["name", "configs", "sweeps"], "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]*$"},
                    "tp": _pos_int,
                    "server_args": _str_list,
                    "env": _env,
                    "configs": {"type": "array", "minItems": 1, "items": _config},
                    "sweeps": {"type": "array", "minItems": 1, "items": _sweep},
                },
            },
        },
    },
}


class MatrixError(ValueError):
    """A matrix problem; the message names the field and what is allowed."""


def _path(parts: Iterable[Any]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else f"{PREFIX}{p}")
    return out or "(top level)"


def _schema_errors(suite: dict[str, Any]) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft202012Validator(SCHEMA)
    msgs = []
    for err in sorted(validator.iter_errors(suite), key=lambda e: list(map(str, e.absolute_path))):
        where = _path(err.absolute_path)
        parts = list(err.absolute_path)
        if "api_key" in parts or any(a == "env" and isinstance(b, str) and SECRET_KEY.search(b)
                                     for a, b in zip(parts, parts[1:])):
            msgs.append(f"{where}: should be of type {err.schema.get('type', 'string')} (value not shown: secret)")
        elif err.validator == "enum":
            msgs.append(f"{where}: {err.instance!r} is not one of {', '.join(map(str, err.validator_value))}")
        elif err.validator == "additionalProperties":
            allowed = ", ".join(sorted(err.schema.get("properties", {})))
            msgs.append(f"{where}: {err.message}; allowed keys: {allowed}")
        elif err.validator == "not" and err.instance.get("budget") is not None:
            msgs.append(f"{where}.budget: only method ddtree takes a budget")
        elif err.validator == "required":
            msgs.append(f"{where}: {err.message}")
        else:
            msgs.append(f"{where}: {err.message}")
    return msgs


def label(cfg: dict[str, Any]) -> str:
    """The config's name within its phase, e.g. `ddtree-b16`, `ngram-k4`, `autoregressive`."""
    if cfg.get("id"):
        return cfg["id"]
    m = cfg["method"]
    if m == "ddtree":
        return f"ddtree-b{cfg['budget']}"
    if m in NEEDS_K:
        return f"{m}-k{cfg['num_speculative_tokens']}"
    if m == "dflash" and "block_size" in cfg:
        return f"dflash-blk{cfg['block_size']}"
    return m


def method_params(cfg: dict[str, Any]) -> dict[str, Any]:
    keys = ("num_speculative_tokens", "budget", "block_size", "topk", "num_draft_tokens",
            "prompt_lookup_min", "prompt_lookup_max")
    return {k: cfg[k] for k in keys if k in cfg}


def is_loopback(host: str) -> bool:
    """Whether an address (or `localhost`) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def validate(suite: dict[str, Any], phases: list[str] | None = None) -> None:
    """Raise MatrixError listing every problem, each naming its field."""
    errors = _schema_errors(suite)
    if errors:
        raise MatrixError("\n".join(errors))
    bind = suite.get("bind_host", "127.0.0.1")
    key = suite.get("api_key") or ""
    if not is_loopback(bind) and len(key) < 16 and not PLACEHOLDER.fullmatch(key):
        errors.append(f"{PREFIX}api_key: servers bound to {bind} are reachable from the network and need an API "
                      f"key of at least 16 characters (keep it in a vault); or set {PREFIX}bind_host: 127.0.0.1")
    engine = ENGINES[suite["engine"]]
    known = set(workloads.known()) | set(suite.get("workloads", {}))
    gpus = suite.get("gpu_count", 0)
    max_tp = gpus if gpus > 0 else 1
    max_len = suite["model"].get("max_model_len")
    seen_ids: dict[str, str] = {}
    names = [p["name"] for p in suite["phases"]]
    for i, phase in enumerate(suite["phases"]):
        where = f"{PREFIX}phases[{i}]"
        if names.count(phase["name"]) > 1:
            errors.append(f"{where}.name: duplicate phase name {phase['name']!r}")
        tp = phase.get("tp", 1)
        if tp > max_tp:
            errors.append(f"{where}.tp: {tp} is above the host's GPU count ({gpus}); allowed 1..{max_tp}")
        labels = []
        for j, cfg in enumerate(phase["configs"]):
            cw = f"{where}.configs[{j}]"
            if cfg["method"] not in engine.methods:
                errors.append(f"{cw}.method: {cfg['method']!r} is not supported by engine {engine.name}; "
                              f"allowed: {', '.join(engine.methods)}")
            if cfg["method"] in NEEDS_DRAFT and not (cfg.get("draft_model") or suite.get("draft_model")):
                errors.append(f"{cw}.draft_model: method {cfg['method']} needs a draft model "
                              f"(set {PREFIX}draft_model or the config's draft_model)")
            cid = f"{phase['name']}-{label(cfg)}"
            if cid in seen_ids:
                errors.append(f"{cw}: duplicate config id {cid!r} (also {seen_ids[cid]}); set a distinct `id`")
            seen_ids.setdefault(cid, cw)
            labels.append(label(cfg))
        if "autoregressive" not in [c["method"] for c in phase["configs"]]:
            errors.append(f"{where}.configs: every phase needs an autoregressive baseline config")
        for j, sweep in enumerate(phase["sweeps"]):
            sw = f"{where}.sweeps[{j}]"
            for k, w in enumerate(sweep["workloads"]):
                if w not in known:
                    errors.append(f"{sw}.workloads[{k}]: unknown workload {w!r}; allowed: {', '.join(sorted(known))}")
            for k, m in enumerate(sweep.get("methods", [])):
                if m not in labels:
                    errors.append(f"{sw}.methods[{k}]: {m!r} is not a config of phase {phase['name']}; "
                                  f"allowed: {', '.join(labels)}")
            if max_len:
                out_len = max(sweep.get("max_tokens", suite.get("max_tokens", [256])))
                longest = max(sweep.get("context_tokens", [0])) + out_len
                if longest > max_len:
                    errors.append(f"{sw}.context_tokens: context + max_tokens = {longest} exceeds the model's "
                                  f"max_model_len {max_len}")
    for p in phases or []:
        if p not in names:
            errors.append(f"phases: unknown phase {p!r}; allowed: {', '.join(names)}")
    if errors:
        raise MatrixError("\n".join(errors))


def _cells(suite: dict[str, Any], sweep: dict[str, Any]) -> list[dict[str, int | str]]:
    return [{"workload": w, "max_tokens": mt, "context_tokens": ctx, "concurrency": c}
            for w in sweep["workloads"]
            for mt in sweep.get("max_tokens", suite.get("max_tokens", [256]))
            for ctx in sweep.get("context_tokens", [0])
            for c in sweep.get("concurrency", [1])]


def expand(suite: dict[str, Any], phases: list[str] | None = None) -> list[dict[str, Any]]:
    """Resolved configs in run order: phase by phase, the baseline first in each."""
    validate(suite, phases)
    engine = ENGINES[suite["engine"]]
    est = {"startup_s": 60.0, "tok_s": 25.0, "prefill_tok_s": 5000.0, **suite.get("estimate", {})}
    reps_default = suite.get("repetitions", 3)
    prompts = {**workloads.PROMPTS, **suite.get("workloads", {})}
    out = []
    for phase in suite["phases"]:
        if phases and phase["name"] not in phases:
            continue
        ordered = sorted(phase["configs"], key=lambda c: c["method"] != "autoregressive")
        for cfg in ordered:
            lab = label(cfg)
            grid: dict[str, dict[str, Any]] = {}
            for sweep in phase["sweeps"]:
                if sweep.get("methods") and lab not in sweep["methods"] and cfg["method"] != "autoregressive":
                    continue
                reps = sweep.get("repetitions", reps_default)
                for cell in _cells(suite, sweep):
                    key = json.dumps(cell, sort_keys=True)
                    grid[key] = {**cell, "repetitions": max(reps, grid.get(key, {}).get("repetitions", 0))}
            cells = list(grid.values())
            draft = cfg.get("draft_model") or suite.get("draft_model") if cfg["method"] in NEEDS_DRAFT else None
            resolved: dict[str, Any] = {
                "config_id": f"{phase['name']}-{lab}",
                "phase": phase["name"],
                "engine": engine.name,
                "model": suite["model"],
                "draft_model": draft,
                "method": cfg["method"],
                "method_params": method_params(cfg),
                "tp": phase.get("tp", 1),
                "server_args": [*suite.get("server_args", []), *phase.get("server_args", []),
                                *cfg.get("server_args", [])],
                "env": {k: str(v) for k, v in {**suite.get("env", {}), **phase.get("env", {}),
                                               **cfg.get("env", {})}.items()},
                "sampling": {"temperature": 0.0, "ignore_eos": False, **suite.get("sampling", {})},
                "warmup_max_tokens": suite.get("warmup_max_tokens", 32),
                "timeouts": {"health_s": 600.0, "request_s": 600.0, "stop_s": 30.0, "release_s": 120.0,
                             **suite.get("timeouts", {})},
                "cells": cells,
                "prompts": {c["workload"]: prompts[c["workload"]] for c in cells},
            }
            resolved["command"] = engine.launch_command(suite["engine_python"], resolved,
                                                        suite.get("bind_host", "127.0.0.1"))
            if suite.get("api_key"):
                argv, env = engine.auth(suite["api_key"])
                resolved["command"] += argv
                resolved["env"].update(env)
            resolved["requests"] = sum(c["concurrency"] * c["repetitions"] for c in cells)
            resolved["estimate_s"] = round(est["startup_s"] + sum(
                c["repetitions"] * (c["max_tokens"] / est["tok_s"] * (1 + 0.25 * (c["concurrency"] - 1))
                                    + c["context_tokens"] * c["concurrency"] / est["prefill_tok_s"])
                for c in cells), 1)
            out.append(resolved)
    return out

"""The benchmark matrix: validation (naming the offending field) and expansion into configs.

The controller validates the `bench_*` variables of each host with `validate()` before any
server starts, and `expand()` turns them into the ordered config list the agent runs. Schema
checks use jsonschema (controller only); cross-field checks are plain code. The workloads of
`bench_workloads_file` are read here, on the controller, and travel to the host inside the configs.
"""
from __future__ import annotations

import ipaddress
import json
import math
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from agent import pack, records, workloads
from agent.engines import ENGINES, PORT, flag_value, ngram_lookup
from agent.logbound import DEFAULT_MAX_BYTES
from agent.secrets import PLACEHOLDER
from agent.store import SECRET_KEY

from . import estimate

METHODS = ("autoregressive", "ngram", "draft_model", "eagle", "eagle3", "mtp", "dflash", "ddtree")
NEEDS_DRAFT = ("draft_model", "eagle", "eagle3", "dflash", "ddtree")
NEEDS_K = ("ngram", "draft_model", "eagle", "eagle3", "mtp")
PREFIX = "bench_"

# `\Z`, not `$`: `$` also matches before a trailing newline
NAME_MAX = 64
_NAME = f"^[A-Za-z0-9][A-Za-z0-9_.-]{{0,{NAME_MAX - 1}}}\\Z"
NAME_TEXT = f"letters, digits, '.', '_' and '-', starting with a letter or digit, at most {NAME_MAX} characters"
_ENV_NAME = "^[A-Za-z_][A-Za-z0-9_]*\\Z"
_ENVNAME_TEXT = "letters, digits and '_', not starting with a digit"
_NO_NUL = "^[^\\x00]*\\Z"
_HOSTNAME = re.compile(r"^(?=.{1,253}\Z)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
                       r"[A-Za-z0-9])?)*\Z")
NAME_RE = re.compile(_NAME)
_pos_int = {"type": "integer", "minimum": 1}
_int_list = {"type": "array", "minItems": 1, "items": _pos_int, "uniqueItems": True}
# Bounds past any plausible use: a typo there would plan days of requests or ship megabytes to every host.
MAX_CONCURRENCY, MAX_REPETITIONS, MAX_OUTPUT, MAX_CONTEXT = 4096, 1000, 1 << 20, 10_000_000
MAX_PROMPT_CHARS = 1 << 20  # a workload's prompt; long contexts come from context_tokens, built on the host
_tokens_list = {**_int_list, "items": {**_pos_int, "maximum": MAX_OUTPUT}}
_concurrency_list = {**_int_list, "items": {**_pos_int, "maximum": MAX_CONCURRENCY}}
_repetitions = {**_pos_int, "maximum": MAX_REPETITIONS}
_str_list = {"type": "array", "items": {"type": "string", "pattern": _NO_NUL}}
_env = {"type": "object", "propertyNames": {"type": "string", "pattern": _ENV_NAME},
        "additionalProperties": {"type": ["string", "number", "boolean"], "pattern": _NO_NUL}}
_model = {
    "type": "object", "required": ["name", "path"], "additionalProperties": False,
    "properties": {"name": {"type": "string", "minLength": 1, "pattern": _NO_NUL},
                   "path": {"type": "string", "minLength": 1, "pattern": _NO_NUL},
                   "revision": {"type": ["string", "null"]}, "max_model_len": _pos_int},
}
# The conditions apply to mappings that name a method; anything else is reported by type/required.
_has_method = {"type": "object", "required": ["method"]}
_config = {
    "type": "object", "required": ["method"], "additionalProperties": False,
    "properties": {
        "method": {"enum": list(METHODS)},
        "id": {"type": "string", "pattern": _NAME},
        "num_speculative_tokens": {"type": "integer", "minimum": 1, "maximum": 64},
        "budget": {"type": "integer", "minimum": 1, "maximum": 1024},
        "block_size": {"type": "integer", "minimum": 2, "maximum": 64},
        "topk": _pos_int, "num_draft_tokens": _pos_int,
        "prompt_lookup_min": _pos_int, "prompt_lookup_max": _pos_int,
        "draft_model": _model, "server_args": _str_list, "env": _env,
    },
    "allOf": [
        {"if": {**_has_method, "properties": {"method": {"const": "ddtree"}}}, "then": {"required": ["budget"]}},
        {"if": {**_has_method, "properties": {"method": {"enum": list(NEEDS_K)}}},
         "then": {"required": ["num_speculative_tokens"]}},
        {"if": {**_has_method, "properties": {"method": {"enum": [m for m in METHODS if m != "ddtree"]}}},
         "then": {"not": {"required": ["budget"]}}},
    ],
}
_slots = {"type": "array", "items": {
    "type": "object", "additionalProperties": False, "minProperties": 1,
    "properties": {"gpus": {"type": "array", "minItems": 1, "uniqueItems": True,
                            "items": {"type": "integer", "minimum": 0}},
                   "cpus": {"type": ["string", "integer"], "minimum": 0, "pattern": pack.CPU_LIST.pattern}}}}
_sweep = {
    "type": "object", "required": ["workloads"], "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},
        "workloads": {"type": "array", "minItems": 1, "items": {"type": "string"}, "uniqueItems": True},
        "max_tokens": _tokens_list,
        "context_tokens": {"type": "array", "minItems": 1, "uniqueItems": True,
                           "items": {"type": "integer", "minimum": 0, "maximum": MAX_CONTEXT}},
        "concurrency": _concurrency_list,
        "repetitions": _repetitions,
        "methods": {"type": "array", "items": {"type": "string"}},
    },
}
SCHEMA = {
    "type": "object",
    "required": ["engine", "engine_python", "model", "phases"],
    "additionalProperties": False,
    "properties": {
        "suite_name": {"type": "string"},
        "engine": {"enum": sorted(ENGINES), "default": "vllm"},
        "backend": {"enum": ["process", "systemd"], "default": "process"},
        "engine_python": {"type": "string", "minLength": 1, "pattern": _NO_NUL,
                          "default": "/opt/specfleet/engine/bin/python"},
        "engine_patches": {"type": "array", "default": []},
        "model": _model,
        "draft_model": {**_model, "type": ["object", "null"], "default": None},
        "gpu_count": {"type": "integer", "minimum": 0, "default": 0},
        "gpu_memory_mib": {"type": "integer", "minimum": 0, "default": 0},
        "pack": {"type": "boolean", "default": False},
        "pack_check": {"type": "boolean", "default": False},
        "slots": {**_slots, "default": []},
        "bind_host": {"type": "string", "minLength": 1, "default": "127.0.0.1"},
        "port": {"type": "integer", "minimum": 0, "maximum": 65535, "default": 0},
        "api_key": {"type": ["string", "null"], "default": ""},
        "server_args": {**_str_list, "default": []},
        "env": {**_env, "default": {}},
        "sampling": {"type": "object", "additionalProperties": False, "properties": {
            "temperature": {"type": "number", "minimum": 0, "default": 0.0},
            "ignore_eos": {"type": "boolean", "default": False}}},
        "repetitions": {**_repetitions, "default": 3},
        "max_tokens": {**_tokens_list, "default": [256]},
        "warmup_max_tokens": {**_pos_int, "default": 32},
        "workloads": {"type": "object", "default": {},
                      "additionalProperties": {"type": "string", "minLength": 1, "maxLength": MAX_PROMPT_CHARS}},
        "workloads_file": {"type": ["string", "null"], "pattern": _NO_NUL, "default": ""},
        "timeouts": {"type": "object", "additionalProperties": False, "properties": {
            k: {"type": "number", "exclusiveMinimum": 0, "maximum": 604800, "default": v}   # at most a week
            for k, v in (("health_s", 900), ("request_s", 900), ("stop_s", 60), ("release_s", 120))}},
        "progress_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 604800, "default": 10},
        "max_plan_hours": {"type": "number", "exclusiveMinimum": 0, "default": 24},
        "server_log_max_mib": {"type": "integer", "minimum": 1, "maximum": 1024,  # half of it is held in memory
                               "default": DEFAULT_MAX_BYTES >> 20},
        "estimate": {"type": "object", "additionalProperties": False, "properties": {
            k: {"type": "number", "exclusiveMinimum": 0, "default": v}
            for k, v in (("startup_s", 120), ("tok_s", 25), ("prefill_tok_s", 5000))}},
        "phases": {
            "type": "array", "minItems": 1,
            "items": {
                "type": "object", "required": ["name", "configs", "sweeps"], "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "pattern": _NAME},
                    "tp": _pos_int,
                    "server_args": _str_list,
                    "env": _env,
                    "slots": _slots,
                    "configs": {"type": "array", "minItems": 1, "items": _config},
                    "sweeps": {"type": "array", "minItems": 1, "items": _sweep},
                },
            },
        },
    },
}


# The matrix's variables are the schema's properties, and their defaults are the schema's `default`s: for a
# mapping whose keys all have one (sampling, timeouts, estimate), the mapping of them, completed key by key
# when the variable sets only some keys (Ansible replaces a dict variable whole). The role's defaults/main.yml
# and meta/argument_specs.yml document the same values (a test compares them).
PARTIAL = tuple(k for k, v in SCHEMA["properties"].items()
                if v.get("properties") and all("default" in p for p in v["properties"].values()))
DEFAULTS: dict[str, Any] = {
    k: ({name: p["default"] for name, p in v["properties"].items()} if k in PARTIAL else v["default"])
    for k, v in SCHEMA["properties"].items() if k in PARTIAL or "default" in v}


def with_defaults(suite: dict[str, Any]) -> dict[str, Any]:
    """The suite with every default filled in: missing variables whole, partial mappings key by key.
    Values of the wrong type are left as they are, for `validate` to name."""
    if not isinstance(suite, dict):
        return suite
    out = {k: json.loads(json.dumps(v)) for k, v in DEFAULTS.items() if k not in suite}
    for k, v in suite.items():
        out[k] = {**DEFAULTS[k], **v} if k in PARTIAL and isinstance(v, dict) else v
    return out


class MatrixError(ValueError):
    """A matrix problem; the message names the field and what is allowed."""


def _path(parts: Iterable[Any]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else f"{PREFIX}{p}")
    return out or "(top level)"


_TYPE_WORDS = {"integer": "an integer", "number": "a number", "string": "a string", "boolean": "a boolean",
               "array": "a list", "object": "a mapping", "null": "null"}


def _type_of(value: Any) -> str:
    """The JSON type of a value, in words: `a string`, `a list`, `a mapping`, ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "a mapping" if isinstance(value, dict) else type(value).__name__


def _or(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def _range(schema: dict[str, Any]) -> str:
    lo, hi = schema.get("minimum"), schema.get("maximum")
    if "exclusiveMinimum" in schema:
        return f" > {schema['exclusiveMinimum']}" + (f" and <= {hi}" if hi is not None else "")
    if lo is not None and hi is not None:
        return f" from {lo} to {hi}"
    if lo is not None:
        return f" >= {lo}"
    return f" <= {hi}" if hi is not None else ""


def allowed(schema: dict[str, Any]) -> str:
    """What a schema accepts, in words: `an integer from 1 to 1024`, `one of vllm, sglang`, ..."""
    if "enum" in schema:
        return "one of " + ", ".join(map(str, schema["enum"]))
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else list(types)
    words = []
    for t in types:
        if t in ("integer", "number"):
            words.append(_TYPE_WORDS[t] + _range(schema))
        elif t == "string" and schema.get("pattern") == _NAME:
            words.append(f"a name of {NAME_TEXT}")
        elif t == "string" and schema.get("minLength"):
            words.append("a non-empty string")
        elif t == "array":
            n = schema.get("minItems", 0)
            what = "a list" + (f" of at least {n} item{'s' if n > 1 else ''}" if n else "")
            if schema.get("uniqueItems"):
                what += ", no repeats"
            if isinstance(schema.get("items"), dict) and "type" in schema["items"]:
                what += f", each {allowed(schema['items'])}"
            words.append(what)
        elif t == "object" and "properties" in schema and schema.get("additionalProperties") is False:
            req = schema.get("required", [])
            words.append("a mapping with keys " + ", ".join(sorted(schema["properties"]))
                         + (f" ({', '.join(req)} required)" if req else ""))
        elif t == "object" and isinstance(schema.get("additionalProperties"), dict):
            words.append(f"a mapping of names to {allowed(schema['additionalProperties'])}")
        else:
            words.append(_TYPE_WORDS.get(t, t))
    return _or(words) if words else "see the role's argument specs"


def _is_secret(parts: list[Any]) -> bool:
    """Whether the value at this path may hold a secret (API key, env of servers, launch arguments)."""
    if "api_key" in parts or "server_args" in parts:
        return True
    for i, p in enumerate(parts):
        if p == "env":
            key = parts[i + 1] if i + 1 < len(parts) else None
            return key is None or not isinstance(key, str) or bool(SECRET_KEY.search(key))
    return False


def shown(value: Any, secret: bool) -> str:
    """A value as a message may show it: scalars by repr (shortened), lists and mappings by type."""
    if secret:
        return f"{_type_of(value)} (value not shown: may be a secret)"
    if isinstance(value, (list, dict)):
        return _type_of(value) if value else repr(value)
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _quoted_number(value: Any, types: list[str]) -> bool:
    if not isinstance(value, str) or not {"integer", "number", "boolean"} & set(types):
        return False
    if value.strip().lower() in ("true", "false", "yes", "no"):
        return "boolean" in types
    try:
        float(value)
    except ValueError:
        return False
    return True


def _format(err: Any) -> list[str]:
    """One or more messages for a jsonschema error, each naming its field and what is allowed."""
    parts = list(err.absolute_path)
    where = _path(parts)
    secret = _is_secret(parts)
    inst, schema, kind = err.instance, err.schema, err.validator
    if kind == "type":
        types = [err.validator_value] if isinstance(err.validator_value, str) else list(err.validator_value)
        msg = (f"{where}: {shown(inst, secret)} is not of type {_or([repr(t) for t in types])}; "
               f"allowed: {allowed(schema)}")
        if isinstance(inst, float) and not math.isfinite(inst):
            msg += " (a finite number)"
        elif isinstance(inst, float) and inst.is_integer() and "integer" in types and not secret:
            msg += f" (a whole number written as {inst!r}: write {int(inst)})"
        if _quoted_number(inst, types) and not secret:
            msg += " (a quoted string: write it unquoted in YAML"
            if len(parts) == 1:  # `-e bench_x=2` gives the string '2'
                msg += f"; on the command line pass JSON: -e '{{\"{PREFIX}{parts[0]}\": {inst}}}'"
            msg += ")"
        return [msg]
    if kind == "enum":
        return [f"{where}: {shown(inst, secret)} is not one of {', '.join(map(str, err.validator_value))}"]
    if kind == "required":
        missing = [k for k in err.validator_value if isinstance(inst, dict) and k not in inst]
        cond = ""
        if "then" in list(err.schema_path) and isinstance(inst, dict):
            cond = f" for method {inst.get('method')}"
        props = schema.get("properties") or {}
        if not props and "then" in list(err.schema_path):
            props = _config["properties"]
        return [f"{_path([*parts, k])}: is required{cond}; allowed: {allowed(props.get(k, {}))}" for k in missing]
    if kind == "additionalProperties":
        names = sorted(schema.get("properties", {}))
        extra = [k for k in inst if k not in names] if isinstance(inst, dict) else []
        if not parts:
            return [f"{PREFIX}{k}: not a variable of the matrix; allowed: "
                    + ", ".join(PREFIX + n for n in names) for k in extra]
        return [f"{_path([*parts, k])}: unknown key; allowed keys: {', '.join(names)}" for k in extra]
    if kind == "not" and isinstance(inst, dict) and inst.get("budget") is not None:
        return [f"{where}.budget: only method ddtree takes a budget (this config's method is "
                f"{inst.get('method')!r}); remove it or use method ddtree"]
    if kind in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        text = err.message if len(err.message) <= 100 else f"{shown(inst, secret)} is out of range"
        return [f"{where}: {text}; allowed: {allowed(schema)}"]
    if kind == "minItems":
        n = err.validator_value
        return [f"{where}: {shown(inst, secret)} should be non-empty (at least {n} item{'s' if n > 1 else ''})"]
    if kind == "minLength":
        return [f"{where}: {shown(inst, secret)} should be non-empty (at least {err.validator_value} character)"]
    if kind == "maxLength":
        return [f"{where}: is {len(inst)} characters long; allowed: at most {err.validator_value} (a long context "
                f"comes from context_tokens, built on the host)"]
    if kind == "pattern" and err.validator_value == _ENV_NAME:
        return [f"{where}: {shown(inst, False)} is not a valid environment variable name; allowed: {_ENVNAME_TEXT}"]
    if kind == "pattern" and err.validator_value == _NO_NUL:
        return [f"{where}: contains a NUL byte, which no argument or environment value can hold; allowed: text "
                f"without NUL bytes"]
    if kind == "pattern" and err.validator_value == pack.CPU_LIST.pattern:
        return [f"{where}: {shown(inst, False)} is not a CPU list; allowed: CPU numbers and ranges separated by "
                f"commas, as taskset takes them (e.g. 0-3,8)"]
    if kind == "pattern":
        text = NAME_TEXT if err.validator_value == _NAME else f"a string matching {err.validator_value}"
        return [f"{where}: {shown(inst, secret)} is not a valid name; allowed: {text}"]
    if kind == "uniqueItems" and isinstance(inst, list):
        dup = next((v for i, v in enumerate(inst) if v in inst[:i]), None)
        return [f"{where}: {shown(dup, secret)} appears more than once; allowed: {allowed(schema)}"]
    text = err.message if len(err.message) <= 200 and not secret else f"invalid ({kind})"
    return [f"{where}: {text}; allowed: {allowed(schema)}"]


def _is_integer(_checker: Any, value: Any) -> bool:
    """Integers only: not booleans, and not floats that happen to be whole (`1.0` would reach commands as 1.0)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(_checker: Any, value: Any) -> bool:
    """Finite numbers only: `.nan` and `.inf` are no timeout, temperature or rate."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and (isinstance(value, int)
                                                                                or math.isfinite(value))


def _schema_errors(suite: Any) -> list[str]:
    import jsonschema

    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine_many({"integer": _is_integer, "number": _is_number})
    validator = jsonschema.validators.extend(base, type_checker=checker)(SCHEMA)
    msgs: list[str] = []
    for err in sorted(validator.iter_errors(suite), key=lambda e: list(map(str, e.absolute_path))):
        for msg in _format(err):
            if msg not in msgs:
                msgs.append(msg)
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


def _strings(obj: Any, parts: tuple[Any, ...] = ()) -> Iterable[tuple[tuple[Any, ...], str]]:
    if isinstance(obj, str):
        yield parts, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _strings(v, (*parts, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _strings(v, (*parts, i))


def _secret_errors(suite: dict[str, Any], secrets_hidden: bool) -> list[str]:
    """The API key and the bind address; placeholder-shaped text, which would be resolved to a secret on the host."""
    errors = []
    if not secrets_hidden:
        for parts, value in _strings(suite):
            if PLACEHOLDER.search(value):
                errors.append(f"{_path(parts)}: holds text of the form <secret:N>, which marks hidden secrets on "
                              f"the way to the host; allowed: any other text")
    bind = suite["bind_host"]
    try:
        ipaddress.ip_address(bind)
    except ValueError:
        if not _HOSTNAME.match(bind):
            errors.append(f"{PREFIX}bind_host: {shown(bind, False)} is not an address; allowed: an IPv4 or IPv6 "
                          f"address or a host name (127.0.0.1 keeps the servers on this host)")
            return errors
    key = suite["api_key"] or ""
    if secrets_hidden and PLACEHOLDER.fullmatch(key):
        return errors
    if key and not key.isprintable() or any(c.isspace() for c in key):
        errors.append(f"{PREFIX}api_key: holds spaces or control characters (value not shown); allowed: "
                      f"printable characters without spaces")
    elif not is_loopback(bind) and len(key) < 16:
        errors.append(f"{PREFIX}api_key: servers bound to {bind} are reachable from the network and need an API "
                      f"key of at least 16 characters (keep it in a vault); or set {PREFIX}bind_host: 127.0.0.1")
    return errors


FILE_LINE = ('one JSON object per line, {"name": ..., "prompt": "..."} or {"name": ..., "messages": [{"role": ..., '
             '"content": ...}, ...]}')
_MESSAGE = {"role": "a non-empty string", "content": "a string"}
_MESSAGES = "a list of at least 1 mapping with keys role (a non-empty string) and content (a string)"


def _text_problem(value: Any, non_empty: bool) -> str | None:
    """What keeps `value` from being a prompt's text, and what is allowed; None when it is one."""
    kind = "a non-empty string" if non_empty else "a string"
    if not isinstance(value, str) or non_empty and not value:
        return f"{shown(value, False)} is not {kind}; allowed: {kind}"
    if "\x00" in value:
        return "holds a NUL byte; allowed: text without NUL bytes"
    if len(value) > MAX_PROMPT_CHARS:
        return (f"is {len(value)} characters long; allowed: at most {MAX_PROMPT_CHARS} (a long context comes from "
                f"context_tokens, built on the host)")
    if PLACEHOLDER.search(value):
        return ("holds text of the form <secret:N>, which marks hidden secrets on the way to the host; allowed: any "
                "other text")
    return None


def _workload_problems(obj: Any) -> list[tuple[str, str]]:
    """(field, what is wrong; allowed: what) for the prompt of one line of a workloads file (not its name)."""
    if not isinstance(obj, dict):
        return [("", f"{_type_of(obj)}, not a mapping; allowed: {FILE_LINE}")]
    out = [(str(k), "unknown field; allowed: name, prompt, messages") for k in obj
           if k not in ("name", "prompt", "messages")]
    given = [k for k in ("prompt", "messages") if k in obj]
    if len(given) != 1:
        what = "both given" if given else "neither given"
        return out + [("prompt, messages", f"{what}; allowed: exactly one of prompt (text) or messages ({_MESSAGES})")]
    if "prompt" in obj:
        why = _text_problem(obj["prompt"], non_empty=True)
        return out + ([("prompt", why)] if why else [])
    messages = obj["messages"]
    if not isinstance(messages, list) or not messages:
        return out + [("messages", f"{shown(messages, False)} is not a non-empty list; allowed: {_MESSAGES}")]
    for i, m in enumerate(messages):
        at = f"messages[{i}]"
        if not isinstance(m, dict):
            out.append((at, f"{_type_of(m)}, not a mapping; allowed: a mapping with keys role and content"))
            continue
        out += [(f"{at}.{k}", "unknown field; allowed: role, content") for k in m if k not in ("role", "content")]
        for key, non_empty in (("role", True), ("content", False)):
            why = f"missing; allowed: {_MESSAGE[key]}" if key not in m else _text_problem(m[key], non_empty)
            if why:
                out.append((f"{at}.{key}", why))
    total = sum(len(m["content"]) for m in messages if isinstance(m, dict) and isinstance(m.get("content"), str))
    if total > MAX_PROMPT_CHARS:
        out.append(("messages", f"hold {total} characters of content; allowed: at most {MAX_PROMPT_CHARS} in all"))
    return out


def _name_problem(obj: dict[str, Any], taken: Mapping[str, str], first: Mapping[str, int]) -> str | None:
    """What is wrong with the name of a workloads file's line (`first`: the line of each name so far), or None."""
    name = obj.get("name")
    if "name" not in obj:
        return f"missing; allowed: a name of {NAME_TEXT}"
    if not isinstance(name, str) or not NAME_RE.match(name):
        return f"{shown(name, False)} is not a valid name; allowed: a name of {NAME_TEXT}"
    if name in taken:
        return f"{name!r} is already {taken[name]}; allowed: another name"
    if name in first:
        return f"{name!r} is already the name of line {first[name]}; allowed: a name no other line has"
    return None


def read_workloads_file(path: str | None, taken: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """The workloads of `bench_workloads_file` by name (a prompt's text, or its chat messages), and every problem
    of the file, each naming the file, its line and field. `taken`: names already in use, and by what."""
    if not path:
        return {}, []
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        shown = path if path.isprintable() else repr(path)  # the message stays one line
        return {}, [f"{PREFIX}workloads_file: cannot read {shown}: {exc.strerror or exc}; allowed: a file on the "
                    f"controller with {FILE_LINE}"]
    found: dict[str, Any] = {}
    first: dict[str, int] = {}
    errors: list[str] = []
    for n, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        at = f"{PREFIX}workloads_file {path} line {n}"
        try:
            obj = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            errors.append(f"{at}: not UTF-8 text; allowed: {FILE_LINE}")
            continue
        except json.JSONDecodeError as exc:
            errors.append(f"{at}: not valid JSON ({exc.msg} at column {exc.colno}); allowed: {FILE_LINE}")
            continue
        named = _name_problem(obj, taken, first) if isinstance(obj, dict) else None
        problems = ([("name", named)] if named else []) + _workload_problems(obj)
        if isinstance(obj, dict) and not named:
            first[obj["name"]] = n
        errors += [f"{at}, field {fld}: {why}" if fld else f"{at}: {why}" for fld, why in problems]
        if not problems:
            found[obj["name"]] = obj.get("prompt", obj.get("messages"))
    return found, errors


@dataclass(frozen=True)
class Matrix:
    """A suite that passed `validate`, with every default filled in, the phases selected (None: all) and the
    workloads read from its `workloads_file`."""

    suite: dict[str, Any]
    phases: tuple[str, ...] | None = None
    file_workloads: dict[str, Any] = field(default_factory=dict)

    def hide(self, suite: dict[str, Any]) -> Matrix:
        """The same matrix with its secrets replaced by placeholders (`secrets.split` of `self.suite`)."""
        return Matrix(with_defaults(suite), self.phases, self.file_workloads)


# What specfleet sets on every server itself: an override in server_args or env would make the config's label
# (tp, bind address, GPU slot, method) say one thing and the server do another, or expose it without its key.
OWNED_FLAGS = {
    "--host": f"the bind address follows {PREFIX}bind_host",
    "--port": "the port is chosen per server",
    "--uds": f"the server listens on {PREFIX}bind_host and its port (a socket would leave both unused)",
    "--served-model-name": f"the served name is {PREFIX}model.name",
    "--api-key": f"the key is {PREFIX}api_key (kept out of logs and records)",
}
OWNED_ENV = {
    "CUDA_VISIBLE_DEVICES": "the GPUs follow the config's slot",
    "NVIDIA_VISIBLE_DEVICES": "the GPUs follow the config's slot",
    "CUDA_DEVICE_ORDER": "GPU indices are nvidia-smi's (PCI bus order), as the slots are",
    "VLLM_API_KEY": f"the key is {PREFIX}api_key (kept out of logs and records)",
}


def owned_flags(engine: Any) -> dict[str, str]:
    """The launch flags specfleet sets for `engine`, each with where its value comes from."""
    spec = {"vllm": ("--speculative-config",),
            "sglang": ("--speculative-algorithm", "--speculative-draft-model-path", "--speculative-draft-model",
                       "--speculative-num-draft-tokens", "--speculative-num-steps", "--speculative-eagle-topk",
                       "--speculative-ddtree-budget")}.get(engine.name, ())
    return {**OWNED_FLAGS,
            **{f: f"the model path is {PREFIX}model.path" for f in (engine.model_flag, "--model", "--model-path")},
            **{f: "the tensor-parallel size is the phase's tp"
               for f in (engine.tp_flag, "--tensor-parallel-size", "--tp-size", "--tp", "-tp")},
            # vLLM's and SGLang's spellings of the other ways to spread a server over more GPUs, or onto others
            **{f: "a config's GPUs are its phase's tp on this host (its slot), which these would change"
               for f in ("--pipeline-parallel-size", "--pp-size", "-pp", "--data-parallel-size",
                         "--data-parallel-size-local", "--dp-size", "--dp", "-dp", "-dpl", "--base-gpu-id",
                         "--gpu-id-step", "--nnodes")},
            **{f: "speculation follows the config's method and its parameters" for f in spec}}


LABEL_MAX = 120
LABEL_TEXT = (f"printable text of at most {LABEL_MAX} characters, without control, format (zero-width, bidirectional) "
              "or line-separator characters, without letters in look-alike forms or of look-alike scripts mixed, and "
              "without leading or trailing spaces")
# Scripts whose letters pass for one another (Latin a, Cyrillic а, Greek α): one name may use one of them only.
# Latin beside Han, kana or Hangul is common in names and stays allowed (as in UTS #39's restriction levels).
LOOKALIKE_SCRIPTS = ("LATIN", "CYRILLIC", "GREEK", "ARMENIAN", "CHEROKEE", "COPTIC")


def _lookalikes(value: str) -> list[str]:
    """Letters and digits in a compatibility form of another (fullwidth, mathematical, circled, superscript: NFKC
    changes them), and, where a name mixes look-alike scripts, the letters outside its main one; each as U+XXXX
    NAME."""
    def named(c: str) -> str:
        return f"U+{ord(c):04X} {unicodedata.name(c, '?')}"
    out = [c for c in value if c.isalnum() and unicodedata.normalize("NFKC", c) != c]
    by_script: dict[str, list[str]] = {}
    for c in value:
        if c.isalpha() and c not in out:
            script = unicodedata.name(c, "").split(" ", 1)[0]
            if script in LOOKALIKE_SCRIPTS:
                by_script.setdefault(script, []).append(c)
    if len(by_script) > 1:
        main = max(by_script, key=lambda k: len(by_script[k]))
        out += [c for script, chars in by_script.items() if script != main for c in chars]
    return [named(c) for c in dict.fromkeys(out)]


def label_problem(value: str) -> str | None:
    """Why a name shown in plans, reports and plots is not what it looks like (None when it is fine): Unicode
    control (Cc), format (Cf: zero-width, bidirectional), surrogate, private-use and unassigned characters and
    line or paragraph separators; letters in look-alike forms or from look-alike scripts mixed (`_lookalikes`);
    spaces around it; an unreadable length."""
    bad = [c for c in value if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")]
    if bad:
        return f"holds {', '.join(sorted({f'U+{ord(c):04X}' for c in bad}))}"
    alike = _lookalikes(value)
    if alike:
        return f"holds look-alike letters: {', '.join(alike[:4])}" + (f" and {len(alike) - 4} more" if len(alike) > 4
                                                                         else "")
    if value != value.strip():
        return "has leading or trailing spaces"
    if len(value) > LABEL_MAX:
        return f"is {len(value)} characters long"
    return None


def _name_errors(suite: dict[str, Any]) -> list[str]:
    """Names a reader sees: the suite's, the models', the sweeps' (labels: any readable text); the workloads of
    bench_workloads (names: as a config id, and not a built-in workload's)."""
    errors = []
    labels = [(f"{PREFIX}suite_name", suite.get("suite_name")),
              *((f"{PREFIX}{k}.name", (suite.get(k) or {}).get("name")) for k in ("model", "draft_model")),
              *((f"{PREFIX}phases[{i}].sweeps[{j}].name", sw.get("name")) for i, ph in enumerate(suite["phases"])
                for j, sw in enumerate(ph["sweeps"])),
              *((f"{PREFIX}phases[{i}].configs[{j}].draft_model.name", (c.get("draft_model") or {}).get("name"))
                for i, ph in enumerate(suite["phases"]) for j, c in enumerate(ph["configs"]))]
    for where, value in labels:
        why = label_problem(value) if isinstance(value, str) else None
        if why:
            errors.append(f"{where}: {shown(value, False)} {why}; allowed: {LABEL_TEXT}")
    builtin = set(workloads.known())
    for name in suite["workloads"]:
        if not NAME_RE.match(name):
            errors.append(f"{PREFIX}workloads.{shown(name, False)}: not a valid workload name; allowed: {NAME_TEXT}")
        elif name in builtin:
            errors.append(f"{PREFIX}workloads.{name}: the name of a built-in workload; allowed: another name "
                          f"(built-in: {', '.join(sorted(builtin))})")
    return errors


def _override_errors(suite: dict[str, Any], engine: Any) -> list[str]:
    """server_args and env, at every level, that would override what specfleet sets (a flag's `=value` form
    and an abbreviation argparse would take for it included)."""
    owned = owned_flags(engine)
    places: list[tuple[str, dict[str, Any]]] = [(PREFIX.rstrip("_"), suite)]
    for i, phase in enumerate(suite["phases"]):
        places.append((f"{PREFIX}phases[{i}]", phase))
        places += [(f"{PREFIX}phases[{i}].configs[{j}]", cfg) for j, cfg in enumerate(phase["configs"])]
    errors = []
    for where, obj in places:
        field = f"{where}.server_args" if where != PREFIX.rstrip("_") else f"{PREFIX}server_args"
        for k, arg in enumerate(obj.get("server_args") or []):
            written = str(arg).split("=", 1)[0]
            name = engine.flag_name(str(arg))  # as the engine's parser reads it: --tp_size, --speculative-config.x
            hit = owned.get(name) or next((why for flag, why in owned.items() if len(name) > 3
                                          and flag.startswith("--") and flag.startswith(name)), None)
            if name.startswith("-") and hit:
                spelled = written if written == name else f"{written} (read as {name})"
                errors.append(f"{field}[{k}]: {spelled} is set by specfleet ({hit}); allowed: any other flag")
            elif PORT in str(arg):
                errors.append(f"{field}[{k}]: {str(arg)[:80]!r} holds {PORT}, the placeholder specfleet fills with "
                              f"the server's own port in its --port only; allowed: a literal value")
        env_field = f"{where}.env" if where != PREFIX.rstrip("_") else f"{PREFIX}env"
        for key, value in (obj.get("env") or {}).items():
            if key in OWNED_ENV:
                errors.append(f"{env_field}.{key}: set by specfleet ({OWNED_ENV[key]}); allowed: any other variable")
            elif PORT in str(value):
                errors.append(f"{env_field}.{key}: holds {PORT}, the placeholder specfleet fills with the server's "
                              f"own port in its --port only; allowed: a literal value")
    return errors


def validate(suite: dict[str, Any], phases: list[str] | None = None, *, secrets_hidden: bool = False) -> Matrix:
    """The checked matrix; MatrixError listing every problem, each naming its field. `secrets_hidden`: the
    suite's secrets are already placeholders (secrets.split)."""
    suite = with_defaults(suite)
    errors = _schema_errors(suite)
    if errors:
        raise MatrixError("\n".join(errors))
    errors += _secret_errors(suite, secrets_hidden)
    engine = ENGINES[suite["engine"]]
    errors += _override_errors(suite, engine)
    errors += _name_errors(suite)
    taken = {**{w: "a built-in workload" for w in workloads.known()},
             **{w: f"a workload of {PREFIX}workloads" for w in suite["workloads"]}}
    from_file, problems = read_workloads_file(suite["workloads_file"], taken)
    errors += problems
    known = set(taken) | set(from_file)
    gpus = suite["gpu_count"]
    max_tp = gpus if gpus > 0 else 1
    max_len = suite["model"].get("max_model_len")
    seen_ids: dict[str, str] = {}
    names = [p["name"] for p in suite["phases"]]
    for i, phase in enumerate(suite["phases"]):
        where = f"{PREFIX}phases[{i}]"
        first = names.index(phase["name"])
        if first < i:
            errors.append(f"{where}.name: duplicate phase name {phase['name']!r} (also {PREFIX}phases[{first}]); "
                          f"allowed: a name no other phase has (phase names are config id prefixes)")
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
            lo, hi = cfg.get("prompt_lookup_min"), cfg.get("prompt_lookup_max")
            if lo is not None and hi is not None and lo > hi and not (cfg["method"] == "ngram"
                                                                        and engine.name == "vllm"):
                errors.append(f"{cw}.prompt_lookup_min: {lo} is above prompt_lookup_max {hi}; allowed: "
                              f"prompt_lookup_min <= prompt_lookup_max")
            if cfg["method"] == "ngram" and engine.name == "vllm" and isinstance(
                    cfg.get("num_speculative_tokens", 1), int):
                lo, hi = ngram_lookup(cfg)  # a bound left out is the adapter's default, which the server gets
                if lo > hi:
                    given = [f"prompt_lookup_{b}" for b in ("min", "max") if f"prompt_lookup_{b}" in cfg]
                    field = "prompt_lookup_min" if "prompt_lookup_min" in cfg else "prompt_lookup_max"
                    implied = "" if len(given) == 2 else (
                        f" (prompt_lookup_{'max' if field == 'prompt_lookup_min' else 'min'} is not given: "
                        f"{hi if field == 'prompt_lookup_min' else lo}, the default)")
                    errors.append(f"{cw}.{field}: prompt_lookup_min {lo} is above prompt_lookup_max {hi}{implied}; "
                                  f"allowed: prompt_lookup_min <= prompt_lookup_max")
            cid = f"{phase['name']}-{label(cfg)}"
            if not NAME_RE.match(cid):
                errors.append(f"{cw}: config id {cid[:80]!r} is too long for a folder name; allowed: at most "
                              f"{NAME_MAX} characters (shorten the phase name or set a shorter `id`)")
            if cid in seen_ids and first == i:  # a duplicate phase name is reported once, above
                errors.append(f"{cw}: duplicate config id {cid!r} (also {seen_ids[cid]}); set a distinct `id`")
            seen_ids.setdefault(cid, cw)
            labels.append(label(cfg))
        if "autoregressive" not in [c["method"] for c in phase["configs"]]:
            errors.append(f"{where}.configs: every phase needs an autoregressive baseline config; add "
                          f"{{method: autoregressive}} (methods now: "
                          f"{', '.join(sorted({c['method'] for c in phase['configs']}))})")
        warmup = suite["warmup_max_tokens"]
        for j, cfg in enumerate(phase["configs"]):
            # the warmup request uses the config's first cell: the first sweep that includes it
            k, sweep = next(((k, s) for k, s in enumerate(phase["sweeps"]) if measures(s, cfg)), (0, {}))
            context = (sweep.get("context_tokens") or [0])[0]
            if max_len and context + warmup > max_len:
                errors.append(f"{PREFIX}warmup_max_tokens: {warmup} tokens after the warmup prompt of "
                              f"{where}.configs[{j}] ({context} context tokens, {where}.sweeps[{k}]) exceed the "
                              f"model's max_model_len {max_len}; allowed: at most {max(max_len - context, 0)}")
                break
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
                out_len = max(sweep.get("max_tokens", suite["max_tokens"]))
                context = max(sweep.get("context_tokens", [0]))
                if context + out_len > max_len:
                    field = (f"{sw}.context_tokens" if context else f"{sw}.max_tokens" if "max_tokens" in sweep
                             else f"{PREFIX}max_tokens")
                    errors.append(f"{field}: context + max_tokens = {context + out_len} exceeds the model's "
                                  f"max_model_len {max_len} (context {context}, max_tokens {out_len}); "
                                  f"allowed: context_tokens + max_tokens <= {max_len} ({PREFIX}model.max_model_len)")
        errors += batch_problems(suite, phase, where, engine)
    errors += pack.problems(suite, gpus, PREFIX)
    for p in phases or []:
        if p not in names:
            errors.append(f"phases: unknown phase {p!r}; allowed: {', '.join(names)}")
    if errors:
        raise MatrixError("\n".join(errors))
    return Matrix(suite, tuple(phases) if phases else None, from_file)


def measures(sweep: Mapping[str, Any], cfg: Mapping[str, Any]) -> bool:
    """Whether a sweep's cells are measured by a config: every config's without `methods`, else the configs it
    names and the baseline (which measures every cell its phase's configs measure)."""
    return not sweep.get("methods") or label(cfg) in sweep["methods"] or cfg["method"] == "autoregressive"


def batch_problems(suite: dict[str, Any], phase: dict[str, Any], where: str, engine: Any) -> list[str]:
    """A sweep's concurrency above what a config's server runs at once (`--max-num-seqs` / `--max-running-requests`
    in its server args, else the engine's own default where the host tells it): the requests past it would wait
    in the engine's queue, and the cell would not measure the concurrency it names."""
    out: list[str] = []
    if not engine.batch_flag:
        return out
    tp, gpus, mib = phase.get("tp", 1), suite["gpu_count"], suite["gpu_memory_mib"]
    for cfg in phase["configs"]:
        args = [*suite["server_args"], *phase.get("server_args", []), *cfg.get("server_args", [])]
        given = flag_value(args, engine.batch_flag, engine.flexible_names)
        if given is not None:
            if not given.isdigit():
                continue  # the engine's own argparse says what is wrong with it
            limit, source, switch = int(given), f"{engine.batch_flag} {given} in its server_args", "raise it"
        else:
            limit = engine.default_batch(tp, gpus, mib, args)
            if limit is None:
                continue
            source = f"{engine.name}'s default here: {engine.batch_flag} is not given"
            switch = f"set {engine.batch_flag} in server_args"
        for j, sweep in enumerate(phase["sweeps"]):
            if not measures(sweep, cfg):
                continue
            most = max(sweep.get("concurrency", [1]))
            if most > limit:
                out.append(f"{where}.sweeps[{j}].concurrency: {most} is above the {limit} requests that "
                           f"{phase['name']}-{label(cfg)} runs at once ({source}): the rest would wait in its queue "
                           f"and the cell would not measure concurrency {most}; allowed: at most {limit}, or "
                           f"{switch}")
    return out


def _cells(suite: dict[str, Any], sweep: dict[str, Any]) -> list[dict[str, int | str]]:
    """A sweep's grid, one cell (records.CELL: workload, max_tokens, context_tokens, concurrency) per point."""
    return [dict(zip(records.CELL, (w, mt, ctx, c)))
            for w in sweep["workloads"]
            for mt in sweep.get("max_tokens", suite["max_tokens"])
            for ctx in sweep.get("context_tokens", [0])
            for c in sweep.get("concurrency", [1])]


def expand(checked: Matrix | dict[str, Any], phases: list[str] | None = None, *, secrets_hidden: bool = False
           ) -> list[dict[str, Any]]:
    """Resolved configs in run order: phase by phase, the baseline first in each. Takes a checked `Matrix`
    (a plain suite is validated first)."""
    if not isinstance(checked, Matrix):
        checked = validate(checked, phases, secrets_hidden=secrets_hidden)
    suite, phases = checked.suite, list(checked.phases or ())
    engine = ENGINES[suite["engine"]]
    est = suite["estimate"]
    reps_default = suite["repetitions"]
    prompts = {**workloads.PROMPTS, **suite["workloads"], **checked.file_workloads}
    out = []
    for phase in suite["phases"]:
        if phases and phase["name"] not in phases:
            continue
        ordered = sorted(phase["configs"], key=lambda c: c["method"] != "autoregressive")
        for cfg in ordered:
            lab = label(cfg)
            grid: dict[str, dict[str, Any]] = {}
            for sweep in phase["sweeps"]:
                if not measures(sweep, cfg):
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
                "server_args": [*suite["server_args"], *phase.get("server_args", []),
                                *cfg.get("server_args", [])],
                "env": {k: str(v) for k, v in {**suite["env"], **phase.get("env", {}),
                                               **cfg.get("env", {})}.items()},
                "sampling": dict(suite["sampling"]),
                "warmup_max_tokens": suite["warmup_max_tokens"],
                "timeouts": dict(suite["timeouts"]),
                "cells": cells,
                "prompts": {c["workload"]: prompts[c["workload"]] for c in cells},
            }
            resolved["command"] = engine.launch_command(suite["engine_python"], resolved,
                                                        suite["bind_host"])
            if suite["api_key"]:
                argv, env = engine.auth(suite["api_key"])
                resolved["command"] += argv
                resolved["env"].update(env)
            resolved["requests"] = sum(c["concurrency"] * c["repetitions"] for c in cells)
            resolved["estimate_s"] = round(estimate.seconds(cells, est["startup_s"], est["tok_s"],
                                                            est["prefill_tok_s"]), 1)
            out.append(resolved)
            if (cfg["method"] == "autoregressive" and suite["pack_check"]
                    and len(pack.slots(suite, phase["name"], resolved["tp"], suite["gpu_count"])) > 1):
                out.append(pack.check_copy(resolved))  # the same baseline again, packed among the others
    return out

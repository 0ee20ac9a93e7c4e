"""The schema check of a suite (`controller.settings.SCHEMA`, by jsonschema): each error one line naming the
`bench_*` path, what it holds (a secret never shown) and what is allowed there."""
from __future__ import annotations

import functools
import math
from typing import Any, Iterable

from agent import pack
from agent.store import SECRET_KEY

from .settings import CONFIG_SCHEMA as _config
from .settings import ENV_NAME_PATTERN as _ENV_NAME
from .settings import ENV_NAME_TEXT as _ENVNAME_TEXT
from .settings import INF, NAME_TEXT, PREFIX, RATE_INF_PATTERN, RATE_TEXT, SCHEMA
from .settings import NAME_PATTERN as _NAME
from .settings import NO_NUL as _NO_NUL


def field_path(parts: Iterable[Any]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else f"{PREFIX}{p}")
    return out or "(top level)"


_TYPE_WORDS = {"integer": "an integer", "number": "a number", "string": "a string", "boolean": "a boolean",
               "array": "a list", "object": "a mapping", "null": "null"}


def type_of(value: Any) -> str:
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
    if schema.get(INF):
        return f"a number{_range(schema)}, or inf"
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


def is_secret(parts: list[Any]) -> bool:
    """Whether the value at this path may hold a secret (API key, env of servers, launch arguments)."""
    if "api_key" in parts or "server_args" in parts:
        return True
    for i, p in enumerate(parts):
        if p == "env":
            key = parts[i + 1] if i + 1 < len(parts) else None
            return key is None or not isinstance(key, str) or bool(SECRET_KEY.search(key))
    return False


def special(value: Any) -> str | None:
    """A number that is not finite as YAML spells it, with what it is (`.nan (not a number)`); None for any other
    value."""
    if not isinstance(value, float) or math.isfinite(value):
        return None
    return ".nan (not a number)" if math.isnan(value) else ".inf (infinity)" if value > 0 else "-.inf (minus infinity)"


def shown(value: Any, secret: bool) -> str:
    """A value as a message may show it: scalars by repr (shortened; a number that is not finite as YAML spells
    it), lists and mappings by type."""
    if secret:
        return f"{type_of(value)} (value not shown: may be a secret)"
    if special(value):
        return str(special(value))
    if isinstance(value, (list, dict)):
        return type_of(value) if value else repr(value)
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _quoted_number(value: Any, types: list[str]) -> bool:
    """Whether a string spells a value the field takes unquoted: a finite number, or a boolean (a quoted `nan` or
    `inf` is no number the field would take)."""
    if not isinstance(value, str) or not {"integer", "number", "boolean"} & set(types):
        return False
    if value.strip().lower() in ("true", "false", "yes", "no"):
        return "boolean" in types
    try:
        return math.isfinite(float(value))
    except ValueError:
        return False


def _not_finite(where: str, value: float, schema: dict[str, Any], secret: bool) -> str:
    """A NaN or infinity where a number is declared: a field that takes inf (`settings.INF`) has had every spelling
    of infinity written as inf already (`matrix.with_inf_written`), so what is left is no value it takes."""
    what = f"{type_of(value)} (value not shown: may be a secret)" if secret else special(value)
    if schema.get(INF):
        return f"{where}: {what} is not a request rate; allowed: {RATE_TEXT}"
    return f"{where}: {what} is not a finite number; allowed: {allowed(schema)} (a finite number)"


def _format(err: Any) -> list[str]:
    """One or more messages for a jsonschema error, each naming its field and what is allowed."""
    parts = list(err.absolute_path)
    where = field_path(parts)
    secret = is_secret(parts)
    inst, schema, kind = err.instance, err.schema, err.validator
    if kind == "type":
        types = [err.validator_value] if isinstance(err.validator_value, str) else list(err.validator_value)
        if special(inst) and {"integer", "number"} & set(types):
            return [_not_finite(where, inst, schema, secret)]
        msg = (f"{where}: {shown(inst, secret)} is not of type {_or([repr(t) for t in types])}; "
               f"allowed: {allowed(schema)}")
        if isinstance(inst, float) and inst.is_integer() and "integer" in types and not secret:
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
        return [f"{field_path([*parts, k])}: is required{cond}; allowed: {allowed(props.get(k, {}))}" for k in missing]
    if kind == "additionalProperties":
        names = sorted(schema.get("properties", {}))
        extra = [k for k in inst if k not in names] if isinstance(inst, dict) else []
        if not parts:
            return [f"{PREFIX}{k}: not a variable of the matrix; allowed: "
                    + ", ".join(PREFIX + n for n in names) for k in extra]
        return [f"{field_path([*parts, k])}: unknown key; allowed keys: {', '.join(names)}" for k in extra]
    if kind == "dependentRequired" and isinstance(inst, dict):
        return [f"{field_path([*parts, k])}: applies to open-loop cells only, and this sweep has no "
                f"{', '.join(needs)}; allowed: give request_rates too, or remove {k}"
                for k, needs in err.validator_value.items() if k in inst and any(n not in inst for n in needs)]
    if kind == "not" and isinstance(inst, dict) and inst.get("budget") is not None:
        return [f"{where}.budget: only method ddtree takes a budget (this config's method is "
                f"{inst.get('method')!r}); remove it or use method ddtree"]
    if kind in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") and schema.get(INF):
        return [f"{where}: {shown(inst, False)} is not a request rate; allowed: {RATE_TEXT}"]
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
    if kind == "pattern" and err.validator_value == RATE_INF_PATTERN:
        return [f"{where}: {shown(inst, False)} is not a request rate; allowed: {RATE_TEXT}"]
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


@functools.lru_cache(maxsize=1)
def _validator() -> Any:
    """The matrix's validator (made once: jsonschema imported only where a matrix is checked)."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine_many({"integer": _is_integer, "number": _is_number})
    return jsonschema.validators.extend(base, type_checker=checker)(SCHEMA)


def _leaves(value: Any, parts: tuple[Any, ...] = ()) -> Iterable[tuple[tuple[Any, ...], Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*parts, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, (*parts, i))
    else:
        yield parts, value


def _special_errors(suite: Any, msgs: list[str]) -> list[str]:
    """NaN or infinity where the schema declares no number to judge it by (in a list of raw values such as
    bench_engine_patches), and not inside a field `msgs` names already: no record could hold it."""
    named = [m.split(": ", 1)[0] for m in msgs]
    out = []
    for parts, value in _leaves(suite):
        where = field_path(parts)
        if special(value) and not any(where == n or where.startswith((f"{n}.", f"{n}[")) for n in named):
            out.append(f"{where}: {shown(value, is_secret(list(parts)))} is not a finite number; allowed: a value "
                       f"without NaN or infinity (the records are JSON)")
    return out


def schema_errors(suite: Any) -> list[str]:
    msgs: list[str] = []
    for err in sorted(_validator().iter_errors(suite), key=lambda e: list(map(str, e.absolute_path))):
        for msg in _format(err):
            if msg not in msgs:
                msgs.append(msg)
    msgs += _special_errors(suite, msgs)
    return msgs

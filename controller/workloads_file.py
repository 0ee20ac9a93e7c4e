"""`bench_workloads_file`: a JSONL file on the controller, one workload a line, read and checked here; each problem
names the file, line and field. The workloads travel to the host inside the configs."""
from __future__ import annotations

import json
from typing import Any, Mapping

from agent import bounded
from agent.secrets import PLACEHOLDER

from .schema_errors import shown, type_of
from .settings import MAX_PROMPT_CHARS, NAME_RE, NAME_TEXT, PREFIX

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
        return [("", f"{type_of(obj)}, not a mapping; allowed: {FILE_LINE}")]
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
            out.append((at, f"{type_of(m)}, not a mapping; allowed: a mapping with keys role and content"))
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
        data = bounded.read_bytes(path, bounded.WORKLOADS_FILE)  # a device, FIFO or folder fails before a read
    except OSError as exc:
        shown = path if path.isprintable() else repr(path)  # the message stays one line
        allowed = "" if isinstance(exc, bounded.BoundError) else f"; allowed: a file on the controller with {FILE_LINE}"
        return {}, [f"{PREFIX}workloads_file: cannot read {shown}: {exc.strerror or exc}{allowed}"]
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

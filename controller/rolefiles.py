"""The bench role's `defaults/main.yml` and `meta/argument_specs.yml`, and `docs/settings.md` (every setting in one
table), generated from `controller.settings`.

    python -m controller.rolefiles --write     write both files
    python -m controller.rolefiles --check     exit 1, naming the file, when a committed one differs
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

from .settings import (
    ENTRY_POINTS,
    NO_DEFAULT,
    SETTINGS,
    Setting,
    choices,
    described,
    role_default,
    spec_default,
    spec_type,
)

ROOT = Path(__file__).resolve().parents[1]
ROLE = ROOT / "roles/bench"
DEFAULTS_FILE, SPECS_FILE = ROLE / "defaults/main.yml", ROLE / "meta/argument_specs.yml"
DOC_FILE = ROOT / "docs/settings.md"
WIDTH = 120
GENERATED = "# Generated from controller/settings.py by `python -m controller.rolefiles --write`: edit it there."
GROUPS = {
    "matrix": ["What to benchmark: the matrix, validated before any server starts. A mapping set in part",
               "(`bench_timeouts: {health_s: 300}`) keeps the defaults below for the keys it leaves out."],
    "places": ["Where things live"],
    "invocation": ["How this invocation runs (mapped from short extra vars: -e plan=true phases=tp1 run_id=... "
                   "force=true)"],
    "service": ["How servers run: `process` (a child process group of the agent) or `systemd` (an instance of",
                "specfleet-<engine>@.service as an unprivileged user)"],
}
TITLES = {"matrix": "What to benchmark: the matrix", "places": "Where things live",
          "invocation": "How one invocation runs", "service": "How servers run (the systemd backend)"}
_PLAIN = re.compile(r"^[A-Za-z0-9/_.][A-Za-z0-9/_.\-]*$")


def scalar(value: Any) -> str:
    """A value as YAML on one line: flow style for lists and mappings, double quotes where a string needs them."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        plain = _PLAIN.match(value) and value.lower() not in ("true", "false", "yes", "no", "null", "on", "off")
        return value if plain and not re.fullmatch(r"[\d.]+", value) else json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(scalar(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {scalar(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no YAML for {value!r}")


def _with_doc(line: str, doc: str) -> str:
    """`line`, then its comment from the 41st column (two spaces after a longer line)."""
    return (f"{line:<38}  # {doc}" if len(line) < 40 else f"{line}  # {doc}") if doc else line


def _comment(lines: list[str]) -> list[str]:
    return [f"# {line}" for line in lines]


def defaults_yaml() -> str:
    """defaults/main.yml: every variable with its default, grouped, each with its one-line comment."""
    out = ["---", GENERATED]
    for group, heading in GROUPS.items():
        out += ["", *_comment(heading)]
        for s in (s for s in SETTINGS if s.group == group):
            value = role_default(s)
            block = isinstance(value, dict) and value and s.key != "model"     # a mapping of defaults, key by key
            line = f"{s.name}:" if block else f"{s.name}: {scalar(value)}".rstrip()
            out.append(_with_doc(line, s.doc))
            if block:
                out += [f"  {k}: {scalar(v)}" for k, v in value.items()]
    return "\n".join(out) + "\n"


def _option(s: Setting, entry: str) -> list[str]:
    lines = [f"      {s.name}:", f"        type: {spec_type(s)}"]
    if s.elements:
        lines.append(f"        elements: {s.elements}")
    if choices(s):
        lines.append(f"        choices: {scalar(choices(s))}")
    default = spec_default(s)
    if default is not NO_DEFAULT:
        lines.append(f"        default: {scalar(default)}".rstrip())
    if s.required:
        lines.append("        required: true")
    if s.no_log:
        lines.append("        no_log: true")
    text = described(s, entry)
    if len(f"        description: {text}") <= WIDTH and ": " not in text and not text.startswith(("C(", "O(")):
        lines.append(f"        description: {text}")
    else:
        lines.append("        description: >-")
        lines += textwrap.wrap(text, WIDTH, initial_indent=" " * 10, subsequent_indent=" " * 10,
                               break_long_words=False, break_on_hyphens=False)
    return lines


def specs_yaml() -> str:
    """meta/argument_specs.yml: each entry point with the variables it takes."""
    out = ["---", GENERATED,
           "# Types are checked here before the role runs; the matrix's structure (methods, workloads, budgets, tp",
           "# against GPU count, duplicate ids) is checked by the bench_plan action, which names the offending field.",
           "argument_specs:"]
    held: dict[str, set[str]] = {}     # entry -> the names its options hold
    reuse: dict[str, tuple[str, str]] = {}  # entry -> ("same" or "base", the earlier entry it takes them from)
    for entry in ENTRY_POINTS:
        names = held[entry] = {s.name for s in SETTINGS if entry in s.entries}
        earlier = [e for e in held if e != entry and _same_text(e, entry)]
        same = [e for e in earlier if held[e] == names]
        base = [e for e in earlier if held[e] < names]
        if same or base:
            reuse[entry] = ("same", same[0]) if same else ("base", base[0])
    anchored = {earlier for _, earlier in reuse.values()}
    for entry, short in ENTRY_POINTS.items():
        kind, earlier = reuse.get(entry, ("", ""))
        out += [f"  {entry}:", f"    short_description: {short}"]
        if kind == "same":   # the same options: the alias alone
            out.append(f"    options: *{earlier}_options")
            continue
        out.append("    options:" + (f" &{entry}_options" if entry in anchored else ""))
        if kind == "base":   # a smaller entry's options merged in, then the rest
            out.append(f"      <<: *{earlier}_options")
        for s in (s for s in SETTINGS if entry in s.entries and not (kind and s.name in held[earlier])):
            out += _option(s, entry)
    return "\n".join(out) + "\n"


def _same_text(a: str, b: str) -> bool:
    """Whether entries `a` and `b` describe every setting they share alike (an anchor repeats a's text in b)."""
    return all(described(s, a) == described(s, b) for s in SETTINGS if a in s.entries and b in s.entries)


def _doc_text(text: str) -> str:
    """An argument spec's description as markdown: C(x) and O(x) as code, pipes escaped for the table."""
    return re.sub(r"[CO]\(([^()]*(?:\([^()]*\)[^()]*)*)\)", r"`\1`", text).replace("|", "\\|")


def settings_md() -> str:
    """docs/settings.md: every variable, its default and what it does, in the groups of defaults/main.yml."""
    out = ["# Every setting", "", "<!-- Generated from controller/settings.py by `python -m controller.rolefiles "
           "--write`: edit it there. -->", "",
           "The bench role's variables, each defined once in `controller/settings.py`, with its default (as in "
           "`roles/bench/defaults/main.yml`) and what it does (as in `roles/bench/meta/argument_specs.yml`, where "
           "each entry point's are checked before the role runs). Set them per host in `host_vars/<host>.yml`, per "
           "group in `group_vars/`, or for one run with `-e`."]
    for group in GROUPS:
        out += ["", f"## {TITLES[group]}", "", "| variable | type | default | what it does |", "|---|---|---|---|"]
        for s in (s for s in SETTINGS if s.group == group):
            default = role_default(s)
            shown = "(required)" if s.required else f"`{scalar(default)}`" if default is not None else ""
            kind = spec_type(s) + (f" of {s.elements}" if s.elements else "")
            allowed = f" One of: {', '.join(f'`{c}`' for c in choices(s) or [])}." if choices(s) else ""
            out.append(f"| `{s.name}` | {kind} | {shown.replace('|', chr(92) + '|')} | "
                       f"{_doc_text(s.description)}{allowed} |")
    return "\n".join(out) + "\n"


FILES = {DEFAULTS_FILE: defaults_yaml, SPECS_FILE: specs_yaml, DOC_FILE: settings_md}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m controller.rolefiles", description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="write the generated files")
    mode.add_argument("--check", action="store_true", help="exit 1 when a committed file differs from its generation")
    args = p.parse_args(argv)
    stale = []
    for path, make in FILES.items():
        text = make()
        if args.write:
            path.write_text(text)
        elif path.read_text() != text:
            stale.append(path)
    for path in stale:
        print(f"{path.relative_to(ROOT)} differs from controller/settings.py: run "
              "`python -m controller.rolefiles --write`", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())

"""Secrets of a suite (API key, secret-looking env values, values of secret flags) kept out of every record.

The controller replaces each secret with a placeholder before it renders the plan, so task results,
plan output and the rendered configs never hold one; the values travel to the host only inside the
plan file (mode 0600, written with no_log), and the agent resolves them in memory and removes them
from that file before anything runs.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

from .store import SECRET_FLAGS, SECRET_KEY

PLACEHOLDER = re.compile(r"<secret:\d+>")


def is_placeholder(value: Any) -> bool:
    return isinstance(value, str) and PLACEHOLDER.fullmatch(value) is not None


def plain(obj: Any) -> Any:
    """A copy of `obj` made of plain dicts, lists and scalars.

    Ansible 2.19 hands filters lazy template containers; `copy.deepcopy` of one copies its templar and
    breaks every filter resolved inside the copy, so secrets are split on plain data only.
    """
    if isinstance(obj, Mapping):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(x) for x in obj]
    for kind in (str, bool, int, float):
        if isinstance(obj, kind):
            return kind(obj)
    return obj


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool) and str(value) != ""


def split(suite: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(the suite with placeholders, {placeholder: value}); deterministic for a given suite."""
    hidden = plain(suite)
    found: dict[str, str] = {}

    def hide(value: str) -> str:
        for ph, v in found.items():
            if v == value:
                return ph
        ph = f"<secret:{len(found)}>"
        found[ph] = value
        return ph

    if isinstance(hidden.get("api_key"), str) and hidden["api_key"]:
        hidden["api_key"] = hide(hidden["api_key"])
    phases = [p for p in hidden.get("phases") or [] if isinstance(p, dict)]
    configs = [c for p in phases for c in p.get("configs") or [] if isinstance(c, dict)]
    for owner in [hidden, *phases, *configs]:
        env = owner.get("env")
        if isinstance(env, dict):
            for k, v in env.items():
                if SECRET_KEY.search(str(k)) and _scalar(v):  # a number is a secret too (`HF_TOKEN: 1234...`)
                    env[k] = hide(str(v))
        args = owner.get("server_args")
        if isinstance(args, list):
            for i, a in enumerate(args):
                if not isinstance(a, str):
                    continue
                if i and args[i - 1] in SECRET_FLAGS and not is_placeholder(a):
                    args[i] = hide(a)
                for flag in SECRET_FLAGS:
                    if a.startswith(flag + "="):
                        args[i] = f"{flag}={hide(a.split('=', 1)[1])}"
    return hidden, found


def resolve(obj: Any, secrets: dict[str, str]) -> Any:
    """`obj` with every placeholder replaced by its value."""
    if isinstance(obj, str):
        return PLACEHOLDER.sub(lambda m: secrets.get(m.group(0), m.group(0)), obj) if "<secret:" in obj else obj
    if isinstance(obj, list):
        return [resolve(x, secrets) for x in obj]
    if isinstance(obj, dict):
        return {k: resolve(v, secrets) for k, v in obj.items()}
    return obj

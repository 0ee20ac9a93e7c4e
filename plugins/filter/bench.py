"""Filters of the bench role.

`bench_secrets`: the {placeholder: value} map of a suite's secrets, for the no_log task that writes
the plan on the host. The `bench_plan` action replaces the same values with the same placeholders
(agent.secrets.split), so no other task result ever holds a secret.
`bench_defaults`: a mapping variable (`bench_timeouts`, ...) completed with the matrix's defaults for the
keys it does not set, e.g. `(bench_timeouts | bench_defaults('timeouts')).stop_s`.
`bench_number`: a whole number given as a string (`-e bench_repetitions=2`) as that number; any
other value unchanged, for the validator to judge.
`bench_bool`: true/false/yes/no/1/0 given as a string (`-e bench_pack=true`) as that boolean; any other value
unchanged, for the validator to judge (a typo fails instead of meaning false).
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

from ansible.errors import AnsibleError


def _project() -> tuple[ModuleType, ModuleType]:
    """agent.secrets and controller.matrix, imported when a filter is first used: Ansible loads every filter plugin
    in every task's worker process, and most tasks never call these (the matrix is a large module)."""
    try:
        from agent import secrets
        from controller import matrix
    except ImportError as exc:  # ansible-playbook from another Python than the project's
        raise AnsibleError(f"specfleet's controller package is not importable ({exc}): run `make venv` and "
                           f"`. .venv/bin/activate` in the project") from exc
    return secrets, matrix


def bench_secrets(suite: dict[str, Any]) -> dict[str, str]:
    return _project()[0].split(suite)[1]


def bench_defaults(value: Any, key: str) -> dict[str, Any]:
    secrets, matrix = _project()
    return {**matrix.DEFAULTS[key], **secrets.plain(value or {})}


def bench_number(value: Any) -> Any:
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return value


def bench_bool(value: Any) -> Any:
    if isinstance(value, str) and value.strip().lower() in ("true", "yes", "1", "false", "no", "0"):
        return value.strip().lower() in ("true", "yes", "1")
    return value


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"bench_secrets": bench_secrets, "bench_number": bench_number,
                "bench_defaults": bench_defaults, "bench_bool": bench_bool}

"""Filters of the bench role.

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


def _project() -> tuple[ModuleType, ModuleType, ModuleType]:
    """agent.secrets, controller.matrix and controller.settings, imported when a filter is first used: Ansible loads
    every filter plugin in every task's worker process, and most tasks never call these (the matrix is a large
    module)."""
    try:
        from agent import secrets
        from controller import matrix, settings
    except ImportError as exc:  # ansible-playbook from another Python than the project's
        raise AnsibleError(f"specfleet's controller package is not importable ({exc}): run `make venv` and "
                           f"`. .venv/bin/activate` in the project") from exc
    return secrets, matrix, settings


def bench_defaults(value: Any, key: str) -> dict[str, Any]:
    secrets, matrix, _ = _project()
    return {**matrix.DEFAULTS[key], **secrets.plain(value or {})}


def bench_number(value: Any) -> Any:
    return _project()[2].as_number(value)


def bench_bool(value: Any) -> Any:
    return _project()[2].as_bool(value)


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"bench_number": bench_number,
                "bench_defaults": bench_defaults, "bench_bool": bench_bool}

"""Lookup `bench_secrets`: the {placeholder: value} map of the host's secrets, read from the matrix's variables as
the `bench_plan` action reads them (controller.settings.suite_from), for the no_log task that writes the plan on
the host. The action replaces the same values with the same placeholders (agent.secrets.split), so no other task
result ever holds a secret."""
from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase

try:
    from agent import secrets
    from controller import settings
except ImportError as exc:  # ansible-playbook from another Python than the project's
    raise AnsibleError(f"specfleet's controller package is not importable ({exc}): run `make venv` and "
                       f"`. .venv/bin/activate` in the project") from exc

DOCUMENTATION = """
name: bench_secrets
short_description: the secrets of the host's benchmark matrix, by placeholder
description: The values the bench_plan action replaces with placeholders, keyed by those placeholders.
"""


class LookupModule(LookupBase):
    def run(self, terms: list[Any], variables: Any = None, **kwargs: Any) -> list[dict[str, str]]:
        variables = variables or {}
        suite = settings.suite_from(lambda name: self._templar.template(variables.get(name)),
                                    str(variables.get("playbook_dir", ".")))
        return [secrets.split(suite)[1]]

"""Lookup `bench_agent`: the path, on the controller, of the agent as one runnable archive
(controller.agent_archive), built from the project folder given as the term."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase

try:
    from controller.agent_archive import build, cache_dir
    from controller.stopped import archive_failure
except ImportError as exc:  # ansible-playbook from another Python than the project's
    raise AnsibleError(f"specfleet's controller package is not importable ({exc}): run `make venv` and "
                       f"`. .venv/bin/activate` in the project") from exc

DOCUMENTATION = """
name: bench_agent
short_description: the specfleet agent as one runnable archive
description: Builds (or finds in the user's cache) a deterministic zip of the project's agent package.
options:
  _terms:
    description: the project folder holding agent/
    required: true
"""


class LookupModule(LookupBase):
    def run(self, terms: list[Any], variables: Any = None, **kwargs: Any) -> list[str]:
        try:
            return [str(build(Path(str(t)))) for t in terms]
        except OSError as exc:  # said as specfleet's steps say it: the path, the reason, what to do
            raise AnsibleError(archive_failure(exc, str(cache_dir()))) from None

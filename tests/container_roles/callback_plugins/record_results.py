"""Test-only aggregate callback: writes every task result of a run to the JSON file named by the
RECORD_RESULTS environment variable, so tests can inspect what each task did (status, role, msg, facts) while
stdout keeps the default human output. Enabled by tests/roles/test_container_roles_render.py and
tests/playbooks/test_provision_hosts.py through ANSIBLE_CALLBACK_PLUGINS and ANSIBLE_CALLBACKS_ENABLED.
"""
from __future__ import annotations

import json
import os

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "record_results"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self.records: list[dict] = []

    def _record(self, result, status: str) -> None:
        data = json.loads(self._dump_results(result._result, indent=None))
        if status == "ok" and data.get("changed"):
            status = "changed"
        role = result._task._role
        self.records.append({"task": result._task.name, "host": result._host.get_name(),
                             "role": role.get_name() if role is not None else None,
                             "status": status, "result": data})

    def v2_runner_on_ok(self, result) -> None:
        self._record(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors: bool = False) -> None:
        self._record(result, "failed")

    def v2_runner_on_skipped(self, result) -> None:
        self._record(result, "skipped")

    def v2_runner_on_unreachable(self, result) -> None:
        self._record(result, "unreachable")

    def v2_playbook_on_stats(self, stats) -> None:
        path = os.environ.get("RECORD_RESULTS")
        if not path:
            return
        summary = {host: stats.summarize(host) for host in sorted(stats.processed)}
        with open(path, "w") as f:
            json.dump({"tasks": self.records, "stats": summary}, f, indent=1)

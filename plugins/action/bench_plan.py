"""Action `bench_plan`: validate a host's benchmark matrix and render its configs, on the controller
(`controller.plan`); prints the plan in plan mode and check mode."""
from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

try:
    from controller import plan
except ImportError as exc:  # ansible-playbook from another Python than the project's
    raise AnsibleError(f"specfleet's controller package is not importable ({exc}): run `make venv` and "
                       f"`. .venv/bin/activate` in the project") from exc

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        result.update(plan.build(dict(self._task.args), task_vars))
        if not result.get("failed") and (result["plan_only"] or task_vars.get("ansible_check_mode")):
            display.display("\n".join(result["plan_lines"]))
        return result

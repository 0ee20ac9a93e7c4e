"""Action `bench_plan`: validate a host's benchmark matrix and render its configs, on the controller
(`controller.plan`); prints the plan in plan mode and check mode. What stops it other than a problem of the matrix
or the host (a full disk, a fault in specfleet) is said as itself, never as a matrix problem."""
from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleConnectionFailure, AnsibleError
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

try:
    from agent import probe
    from controller import plan, settings, stopped
except ImportError as exc:  # ansible-playbook from another Python than the project's
    raise AnsibleError(f"specfleet's controller package is not importable ({exc}): run `make venv` and "
                       f"`. .venv/bin/activate` in the project") from exc

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False

    @stopped.guard("the plan for {host}", "nothing was started", (AnsibleError,))
    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = dict(self._task.args)
        if "suite" not in args:  # the role's way: every bench_* variable controller.settings lists, as rendered
            args["suite"] = settings.suite_from(lambda name: self._templar.template(task_vars.get(name)),
                                                str(task_vars.get("playbook_dir", ".")))
        result.update(plan.build(args, task_vars, self._ask))
        if not result.get("failed") and (result["plan_only"] or task_vars.get("ansible_check_mode")):
            display.display("\n".join(result["plan_lines"]))
        return result

    def _ask(self, python: str, request: dict[str, Any]) -> dict[str, Any]:
        """`agent.probe` on the host through this task's connection, as `python -c <its source> <request>`:
        nothing is written there, and it also runs in check mode."""
        argv = [python, "-c", Path(probe.__file__).read_text(), json.dumps(request)]
        try:
            res = self._low_level_execute_command(" ".join(shlex.quote(a) for a in argv))
        except AnsibleConnectionFailure as exc:
            return {"unreachable": True, "msg": str(exc)}
        return {"rc": res.get("rc"), "stdout": res.get("stdout", ""), "stderr": res.get("stderr", "")}


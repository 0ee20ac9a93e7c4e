"""Action `bench_follow`: follow the agent's progress events on the host until its suite ends.

Each poll runs `python <agent> progress` on the host (the archive the role installed, or `-m agent` in
`agent_dir`): until the agent has started, after 0.25 s, then twice as long each time up to `interval` seconds;
then one poll at a time that waits on the host for the next event (`wait` seconds at most). `controller.follow`
turns the answers into progress lines as they happen and the task's result. Fails with the agent's own log when it
dies early, and says any other stop (an answer that is not the agent's, a fault in specfleet) as itself: the suite
goes on on the host either way, and the same command attaches to it again.
"""
from __future__ import annotations

import time
from typing import Any

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

try:
    from controller import stopped
    from controller.follow import Follow
except ImportError as exc:  # ansible-playbook from another Python than the project's
    raise AnsibleError(f"specfleet's controller package is not importable ({exc}): run `make venv` and "
                       f"`. .venv/bin/activate` in the project") from exc

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = False

    @stopped.guard("following the suite on {host}", "the suite goes on on the host; with the same run_id the "
                   "command attaches to it", (AnsibleError,))
    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        """Poll until the suite ends; the task's result."""
        result = super().run(tmp, task_vars)
        host = (task_vars or {}).get("inventory_hostname", "?")
        a = self._task.args
        follow = Follow(host, a["invocation"], a.get("log", "its log"))
        timeout = float(a.get("timeout", 172800))
        start_timeout = float(a.get("start_timeout", 60))
        interval = float(a.get("interval", 2))
        wait = float(a.get("wait", 15))
        t0, pause = time.monotonic(), 0.25
        while True:
            left = max(timeout - (time.monotonic() - t0), 0.0)
            probe = follow.answer(self._low_level_execute_command(follow.command(a, min(wait, left))))
            if isinstance(probe, str):
                result.update(failed=True, msg=probe)
                return result
            elapsed = time.monotonic() - t0
            if follow.followed is None:
                try:
                    note = follow.attach(probe)
                except LookupError:
                    if elapsed > start_timeout:
                        result.update(failed=True, msg=f"the agent did not start on {host} within "
                                                       f"{start_timeout:.0f} s; see {follow.log}")
                        return result
                    time.sleep(min(pause, interval))
                    pause *= 2
                    continue
                if note:
                    display.display(f"{host}: {note}")
            lines, done = follow.step(probe)
            for line in lines:
                display.display(f"{host}: {line}")
            if done is not None:
                result.update(done)
                return result
            if probe["alive"]:
                if elapsed > timeout:
                    result.update(failed=True, msg=f"still running on {host} after {timeout:.0f} s; re-run with "
                                                   f"the same run_id to attach")
                    return result


"""Action `bench_follow`: follow the agent's progress events on the host until its suite ends.

Each poll runs one small Python snippet on the host that returns the new complete event lines
and whether the agent process is still alive; progress is printed as it happens
(`[k/N] <config_id>  elapsed  ETA`). Fails with the agent's own log when it dies early.
"""
from __future__ import annotations

import json
import shlex
import time
from typing import Any

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()
DISK_FULL_BYTES = 1 << 20  # below this, an agent that died is reported as out of disk

PROBE = r"""
import json, os, sys
events, offset, state_path, invocation = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
data = b""
try:
    with open(events, "rb") as f:
        f.seek(offset)
        data = f.read()
except FileNotFoundError:
    pass
data = data[: data.rfind(b"\n") + 1]
try:
    state = json.load(open(state_path))
except (OSError, ValueError):
    state = {}
alive = False
if state.get("pid"):
    try:
        os.kill(int(state["pid"]), 0)
        alive = True
    except ProcessLookupError:
        alive = False
    except PermissionError:
        alive = True
try:
    st = os.statvfs(os.path.dirname(events))
    free = st.f_bavail * st.f_frsize
except OSError:
    free = None
print(json.dumps({"lines": data.decode(errors="replace"), "offset": offset + len(data),
                  "state": state, "alive": alive, "free_bytes": free}))
"""


def _hms(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def render(ev: dict[str, Any]) -> str | None:
    kind = ev.get("event")
    if kind == "suite_start":
        return f"suite {ev.get('run_id')}: {ev.get('n')} configs, estimated {_hms(ev.get('estimate_s'))}"
    if kind == "config_start":
        return (f"[{ev['k']}/{ev['n']}] {ev['config_id']}  elapsed {_hms(ev.get('elapsed_s'))}  "
                f"ETA {_hms(ev.get('eta_s'))}")
    if kind == "config_kept":
        return f"[{ev['k']}/{ev['n']}] {ev['config_id']}  already ok in this run, kept"
    if kind == "config_end":
        head = ev["status"] if ev["status"] == "ok" else f"{ev['status']}: {ev.get('reason')}"
        ready = f"ready {ev['ready_s']:.1f} s, " if ev.get("ready_s") is not None else ""
        return (f"      {head} in {ev.get('duration_s', 0):.1f} s ({ready}"
                f"{ev.get('requests_ok') or 0}/{ev.get('requests') or 0} requests ok)")
    if kind == "suite_end":
        return f"suite finished in {_hms(ev.get('elapsed_s'))}"
    return None


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        a = self._task.args
        host = (task_vars or {}).get("inventory_hostname", "?")
        python, events, state_path = a["python"], a["events"], a["state"]
        invocation = a["invocation"]
        timeout = float(a.get("timeout", 172800))
        start_timeout = float(a.get("start_timeout", 60))
        interval = float(a.get("interval", 2))
        offset, followed, summary, final_pass = 0, None, [], False
        t0 = time.monotonic()
        while True:
            cmd = " ".join(shlex.quote(x) for x in (python, "-c", PROBE, events, str(offset), state_path, invocation))
            res = self._low_level_execute_command(cmd)
            if res.get("rc") != 0:
                result.update(failed=True, msg=f"cannot read progress on {host}: {res.get('stderr', '')[-500:]}")
                return result
            probe = json.loads(res["stdout"].strip().splitlines()[-1])
            state = probe["state"]
            elapsed = time.monotonic() - t0
            if followed is None:
                if state.get("invocation") == invocation or (state.get("state") == "running" and probe["alive"]):
                    followed = state.get("invocation")
                    if followed != invocation:
                        display.display(f"{host}: attaching to the run already in progress (pid {state.get('pid')})")
                elif elapsed > start_timeout:
                    result.update(failed=True, msg=f"the agent did not start on {host} within "
                                                   f"{start_timeout:.0f} s; see {a.get('log', 'its log')}")
                    return result
                else:
                    time.sleep(interval)
                    continue
            offset = probe["offset"]
            for line in probe["lines"].splitlines():
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if ev.get("invocation") != followed:
                    continue
                text = render(ev)
                if text:
                    display.display(f"{host}: {text}")
                if ev.get("event") == "config_end":
                    summary.append({k: ev.get(k) for k in ("config_id", "status", "reason", "duration_s")})
                if ev.get("event") == "suite_end":
                    result.update(changed=True, configs=summary, elapsed_s=ev.get("elapsed_s"))
                    return result
            if not probe["alive"]:
                if final_pass:  # one more read after the exit caught any last events
                    how = "died" if state.get("state") == "running" else f"ended ({state.get('state')})"
                    free = probe.get("free_bytes")
                    disk = (f" (the results filesystem on {host} is full: {free} bytes free)"
                            if free is not None and free < DISK_FULL_BYTES else "")
                    result.update(failed=True, msg=f"the agent on {host} {how} without finishing the suite: "
                                                   f"{state.get('error') or 'no error recorded'}{disk}; see "
                                                   f"{a.get('log', 'its log')}; re-run with the same run_id "
                                                   f"to resume")
                    return result
                final_pass = True
                continue
            if elapsed > timeout:
                result.update(failed=True, msg=f"still running on {host} after {timeout:.0f} s; re-run with the "
                                               f"same run_id to attach")
                return result
            time.sleep(interval)

"""Following a suite from the controller: each poll's answer (`python -m agent progress` on the host) turned
into progress lines (`[k/N] <config_id>  elapsed  ETA`; within a config, its requests done, tok/s and ETA) and,
at the end, the action's result — the configs' outcomes, or why the agent stopped early. Pure: the `bench_follow`
action does the polling."""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from agent.records import Event

DISK_FULL_BYTES = 1 << 20  # below this, an agent that died is reported as out of disk


def hms(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def render(ev: dict[str, Any]) -> str | None:
    """One event as a progress line; None for events not shown."""
    kind = ev.get("event")
    if kind == Event.SUITE_START:
        return f"suite {ev.get('run_id')}: {ev.get('n')} configs, estimated {hms(ev.get('estimate_s'))}"
    slot = f"slot {ev['slot']}" if ev.get("slot") is not None else ""  # packed: configs end out of order
    if kind == Event.CONFIG_START:
        return (f"[{ev['k']}/{ev['n']}] {ev['config_id']}  {slot + '  ' if slot else ''}elapsed "
                f"{hms(ev.get('elapsed_s'))}  ETA {hms(ev.get('eta_s'))}")
    if kind == Event.MACHINE_WAIT:
        return f"      {ev['config_id']}: waiting for the machine, held by {ev.get('holder')}"
    if kind == Event.CONFIG_PROGRESS:
        return (f"      {ev['config_id']}: {ev['done']}/{ev['total']} requests, {ev['tok_s']:.1f} tok/s over the last "
                f"{ev['window_s']:.0f} s, config ETA {hms(ev.get('eta_s'))}")
    if kind == Event.CONFIG_KEPT:
        return f"[{ev['k']}/{ev['n']}] {ev['config_id']}  already ok in this run, kept"
    if kind == Event.CONFIG_END:
        head = ev["status"] if ev["status"] == "ok" else f"{ev['status']}: {ev.get('reason')}"
        ready = f"ready {ev['ready_s']:.1f} s, " if ev.get("ready_s") is not None else ""
        who = f"{ev['config_id']} ({slot}): " if slot else ""
        return (f"      {who}{head} in {ev.get('duration_s', 0):.1f} s ({ready}"
                f"{ev.get('requests_ok') or 0}/{ev.get('requests') or 0} requests ok)")
    if kind == Event.SUITE_END:
        return f"suite finished in {hms(ev.get('elapsed_s'))}"
    return None


AGAIN = "the suite goes on on the host: run the same command again with the same run_id to attach"


@dataclass
class Follow:
    """The state of following one start of the agent (`invocation`) on `host`."""

    host: str
    invocation: str
    log: str = "its log"
    offset: int = 0
    followed: str | None = None
    summary: list[dict[str, Any]] = field(default_factory=list)
    final_pass: bool = False

    def command(self, a: dict[str, Any], wait: float) -> str:
        """The poll to run on the host: `python <agent> progress` from the task's arguments `a`."""
        entry = [a["agent"]] if a.get("agent") else ["-m", "agent"]  # the archive, or the package in agent_dir
        return (f"cd {shlex.quote(a['agent_dir'])} && "
                + " ".join(shlex.quote(x) for x in (a["python"], *entry, "progress", "--events", a["events"],
                                                    "--offset", str(self.offset), "--state", a["state"],
                                                    "--wait", str(wait if self.followed else 0))))

    def answer(self, res: dict[str, Any]) -> dict[str, Any] | str:
        """A poll's answer (the last line of its output, JSON), or the one line that says why it cannot be read."""
        if res.get("rc") != 0:
            return f"cannot read progress on {self.host}: {res.get('stderr', '')[-500:]}"
        try:
            probe = json.loads(res["stdout"].strip().splitlines()[-1])
        except (ValueError, IndexError):
            probe = None
        if not isinstance(probe, dict):
            return f"cannot read progress on {self.host}: the agent answered {res.get('stdout', '')[-300:]!r}; {AGAIN}"
        return probe

    def attach(self, probe: dict[str, Any]) -> str | None:
        """Whether the agent is found (this start, or a run already in progress): a line to show when
        attaching to another start; raises LookupError while it is not there yet."""
        state = probe["state"]
        held_by = (probe.get("attached") or {}).get(self.invocation)  # this start was refused: the run was held
        if held_by:
            self.followed = held_by
        elif state.get("invocation") == self.invocation or (state.get("state") == "running" and probe["alive"]):
            self.followed = state.get("invocation")
        else:
            raise LookupError("not started")
        if self.followed != self.invocation:
            return f"attaching to the run already in progress (pid {state.get('pid')})"
        return None

    def step(self, probe: dict[str, Any]) -> tuple[list[str], dict[str, Any] | None]:
        """(lines to show, the final result or None to poll again) after one poll of an attached agent."""
        self.offset = probe["offset"]
        lines = [f"warning: {p}" for p in probe.get("problems") or []]  # the agent's files it could not read
        for line in probe["lines"].splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if not isinstance(ev, dict) or ev.get("invocation") != self.followed:
                continue
            text = render(ev)
            if text:
                lines.append(text)
            if ev.get("event") == Event.CONFIG_END:
                self.summary.append({k: ev.get(k) for k in ("config_id", "status", "reason", "duration_s")})
            if ev.get("event") == Event.SUITE_END:
                return lines, {"changed": True, "configs": self.summary, "elapsed_s": ev.get("elapsed_s")}
        if not probe["alive"]:
            if self.final_pass:  # one more read after the exit caught any last events
                return lines, {"failed": True, "msg": self.died(probe)}
            self.final_pass = True
        return lines, None

    def died(self, probe: dict[str, Any]) -> str:
        state = probe["state"]
        if state.get("state") == "refused":  # another run's suite holds the host
            return f"the agent on {self.host} did not start: {state.get('error') or 'refused'}"
        how = "died" if state.get("state") == "running" else f"ended ({state.get('state')})"
        free = probe.get("free_bytes")
        disk = (f" (the results filesystem on {self.host} is full: {free} bytes free)"
                if free is not None and free < DISK_FULL_BYTES else "")
        return (f"the agent on {self.host} {how} without finishing the suite: "
                f"{state.get('error') or 'no error recorded'}{disk}; see {self.log}; re-run with the same run_id "
                f"to resume")

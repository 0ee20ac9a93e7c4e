"""The systemd backend: each config is an instance of the engine's template unit.

`specfleet-<engine>@<instance>.service` runs the server as the unprivileged service user with
`Restart=no` (a crash is recorded, not hidden). The config's command and environment go into
one EnvironmentFile per instance; `server.log` is the journal of exactly this invocation.
"""
from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from .classify import Reason
from .leftovers import MARK, kill_leftovers
from .logbound import DEFAULT_MAX_BYTES, BoundedLog
from .pack import Slot
from .server import POLL_S, Server, StartupFailed, wait_until
from .store import write_atomic

UNIT_DIR_ENV = Path("/etc/specfleet/units")
DROPIN_DIR = Path("/run/systemd/system")  # runtime drop-ins: gone at reboot, like the slot they describe
DROPIN_NAME = "50-specfleet-slot.conf"
_NVIDIA_GPU = re.compile(r"^/dev/nvidia(\d+)\s")


def _systemctl(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=120, check=check)


def instance_name(text: str) -> str:
    """A unit instance name from a config id (letters, digits, '.', '_', '-')."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)


def env_file_text(argv: list[str], env: dict[str, str]) -> str:
    """The EnvironmentFile of one config: its command and environment as base64 JSON in
    SPECFLEET_LAUNCH, which the unit's launcher decodes and execs. No quoting rules of systemd
    apply, so any argument or value (quotes, spaces, `$`) arrives unchanged."""
    blob = base64.b64encode(json.dumps({"argv": argv, "env": env}).encode()).decode()
    return f"SPECFLEET_LAUNCH={blob}\n"


def device_allow(show_text: str) -> list[str]:
    """The DeviceAllow= entries of `systemctl show -p DeviceAllow` (one `DeviceAllow=PATH ACCESS` line each;
    a bare `DeviceAllow=` when there are none)."""
    out = []
    for line in show_text.splitlines():
        key, _, value = line.partition("=")
        if key == "DeviceAllow" and value.strip():
            out.append(value.strip())
    return out


def slot_dropin(slot: Slot, allowed: list[str]) -> str:
    """The runtime drop-in that confines one instance to its slot: its CPUs (affinity at exec and the cgroup's
    cpuset), and of the GPU nodes in the template's device allow list only the slot's own (the shared control
    nodes nvidiactl, nvidia-uvm, nvidia-caps stay)."""
    lines = ["# written by the specfleet agent for one packed config; removed when it stops", "[Service]"]
    if slot.cpus:
        lines += [f"CPUAffinity={slot.cpus.replace(',', ' ')}", f"AllowedCPUs={slot.cpus}"]
    if slot.gpus:
        keep = [e for e in allowed if (m := _NVIDIA_GPU.match(e + " ")) is None or int(m[1]) in slot.gpus]
        lines += ["DeviceAllow=", *(f"DeviceAllow={e}" for e in keep)]
    return "\n".join(lines) + "\n"


def decode_env_file(text: str) -> dict[str, Any]:
    """The command and environment held by an env file (for tests and debugging)."""
    blob = text.strip().split("=", 1)[1]
    return json.loads(base64.b64decode(blob))


class SystemdServer(Server):
    """One config as `specfleet-<engine>@<instance>.service`."""

    def __init__(self, engine: str, instance: str, argv: list[str], env: dict[str, str], log_path: Path,
                 port: int, host: str = "127.0.0.1", env_dir: Path = UNIT_DIR_ENV,
                 headers: dict[str, str] | None = None, log_max_bytes: int = DEFAULT_MAX_BYTES,
                 stop_deadline_s: float = 60.0, slot: Slot | None = None, dropin_dir: Path = DROPIN_DIR) -> None:
        self.unit = f"specfleet-{engine}@{instance_name(instance)}.service"
        self.slot = slot if slot is not None and not slot.whole_host else None
        self.dropin = dropin_dir / f"{self.unit}.d" / DROPIN_NAME
        self.env_path = env_dir / f"{instance_name(instance)}.env"
        self.argv, self.env, self.log_path, self.port, self.host = argv, env, log_path, port, host
        self.headers = headers or {}
        self.invocation: str | None = None
        self.pid: int | None = None
        self.log_max_bytes = log_max_bytes
        self.stop_deadline_s = stop_deadline_s
        self.survivors: list[dict[str, object]] = []

    def _show(self) -> dict[str, str]:
        res = _systemctl("show", self.unit, "-p", "ActiveState,SubState,MainPID,ExecMainStatus,Result,InvocationID")
        return dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)

    def start(self) -> None:
        self.check_port_free()
        state = self._show()
        if state.get("ActiveState") in ("active", "activating", "deactivating"):
            raise StartupFailed(Reason.UNIT_BUSY, f"{self.unit} is already {state['ActiveState']}")
        self.env_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.env_path, env_file_text(self.argv, self.env).encode())
        os.chmod(self.env_path, 0o640)
        self._confine()
        _systemctl("reset-failed", self.unit)
        res = _systemctl("start", "--no-block", self.unit)
        if res.returncode != 0:
            raise StartupFailed(Reason.CRASHED, f"systemctl start {self.unit}: {res.stderr.strip()}")
        # the invocation id names this start's journal entries
        if not wait_until(lambda: bool(self._show().get("InvocationID")), 10):
            raise StartupFailed(Reason.CRASHED, f"{self.unit} got no invocation id")
        state = self._show()
        self.invocation = state["InvocationID"]
        self.pid = int(state.get("MainPID") or 0) or None

    def _confine(self) -> None:
        """The slot's drop-in in place (none left from an earlier start of this instance), systemd told."""
        if self.dropin.exists():  # the allow list is read without it
            self.dropin.unlink()
            self._reload()
        if self.slot is None:
            return
        allowed = device_allow(_systemctl("show", self.unit, "-p", "DeviceAllow").stdout)
        self.dropin.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.dropin, slot_dropin(self.slot, allowed).encode())
        os.chmod(self.dropin, 0o644)
        self._reload()

    @staticmethod
    def _reload() -> None:
        res = _systemctl("daemon-reload")
        if res.returncode != 0:
            raise StartupFailed(Reason.CRASHED, f"systemctl daemon-reload: {res.stderr.strip()}")

    def alive(self) -> bool:
        return self._show().get("ActiveState") in ("active", "activating", "reloading")

    def owns(self, pid: int) -> bool:
        return self.unit in _cgroup(pid)

    def startup_failure(self) -> str | None:
        state = self._show()
        if state.get("ActiveState") in ("active", "activating", "reloading"):
            self.pid = int(state.get("MainPID") or 0) or self.pid
            return None
        return (f"{self.unit} is {state.get('ActiveState')} ({state.get('Result')}, exit status "
                f"{state.get('ExecMainStatus')}) during startup")

    def log_text(self) -> str:
        """The end of the invocation's journal (what the classifier reads)."""
        return self.journal(lines=500)

    def exit_detail(self) -> str:
        st = self._show()
        return f"{self.unit} is {st.get('ActiveState')} ({st.get('Result')}, exit status {st.get('ExecMainStatus')})"

    def _journal_argv(self, lines: int | None = None) -> list[str]:
        return ["journalctl", "--no-pager", "-o", "short-iso", *(["-n", str(lines)] if lines else []),
                f"_SYSTEMD_INVOCATION_ID={self.invocation}", "+", f"INVOCATION_ID={self.invocation}"]

    def journal(self, lines: int | None = None) -> str:
        if not self.invocation:
            return ""
        return subprocess.run(self._journal_argv(lines), capture_output=True, text=True, timeout=120).stdout

    def save_journal(self) -> None:
        """The invocation's journal into server.log, streamed through the same bound as the process backend
        (the journal itself keeps everything), written beside and renamed into place."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.log_path.name}.", suffix=".tmp", dir=self.log_path.parent)
        os.close(fd)
        log = BoundedLog(Path(tmp), self.log_max_bytes)
        try:
            if self.invocation:
                proc = subprocess.Popen(self._journal_argv(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
                assert proc.stdout is not None
                log.pump(proc.stdout)
                try:
                    proc.wait(timeout=600)
                except subprocess.TimeoutExpired as exc:
                    proc.kill()
                    raise RuntimeError(f"journalctl did not finish the journal of {self.unit} within 600 s") from exc
            log.close(wait_s=600)
            os.replace(tmp, self.log_path)
        finally:
            log.close(wait_s=0)
            if os.path.exists(tmp):
                os.unlink(tmp)

    def stop(self, deadline_s: float) -> None:
        """systemctl stop (SIGTERM to the unit's cgroup); once the main process has exited, what is left of the
        cgroup gets 1 s and then SIGKILL, as the process backend treats its group (systemd itself would give it
        TimeoutStopSec again); SIGKILL also when the main process outlives the deadline. Then verify the unit is
        inactive, the port free; save the invocation's journal; remove the env file."""
        try:
            _systemctl("stop", "--no-block", self.unit)
            if not self._stopped(deadline_s + 30):
                _systemctl("kill", "--signal=SIGKILL", self.unit)
                if not wait_until(lambda: self._show().get("ActiveState") in ("inactive", "failed"), 30):
                    raise RuntimeError(f"{self.unit} did not stop")
            self.wait_port_released()
        finally:
            if self.env.get(MARK):  # KillMode=control-group ends the unit's cgroup; anything else marked goes too
                self.survivors = kill_leftovers(self.env[MARK])
            self.save_journal()
            try:
                self.env_path.unlink()
            except FileNotFoundError:
                pass
            if self.slot is not None and self.dropin.exists():  # the next config of this name may run unpacked
                self.dropin.unlink()
                _systemctl("daemon-reload")
            _systemctl("reset-failed", self.unit)

    def _stopped(self, deadline_s: float, grace_s: float = 1.0) -> bool:
        """Whether the unit went inactive within `deadline_s` and within `grace_s` of its main process's exit."""
        end, main_gone = time.monotonic() + deadline_s, None
        while True:
            state, now = self._show(), time.monotonic()
            if state.get("ActiveState") in ("inactive", "failed"):
                return True
            if state.get("MainPID", "0") in ("0", ""):  # the main process exited: the rest of the cgroup lingers
                main_gone = main_gone or now
            if now >= end or (main_gone is not None and now - main_gone >= grace_s):
                return False
            time.sleep(POLL_S)


def _cgroup(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return ""


def leftover_units(engine: str) -> list[str]:
    """Instances of the engine's template that are still loaded (e.g. after an agent was killed)."""
    res = _systemctl("list-units", "--all", "--plain", "--no-legend", f"specfleet-{engine}@*.service")
    return [line.split()[0] for line in res.stdout.splitlines() if line.strip()]


def stop_leftover_units(engine: str) -> list[str]:
    """Stop and reset every loaded instance of the engine's template; the units it stopped."""
    units = leftover_units(engine)
    for unit in units:
        subprocess.run(["systemctl", "stop", unit], capture_output=True, timeout=600)
        subprocess.run(["systemctl", "reset-failed", unit], capture_output=True, timeout=60)
    return units


